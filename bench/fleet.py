"""Fleets: runs per second and peak memory of ``forensics analyze`` over many runs.

Makes fleets of generated runs (:mod:`fleetgen`: real tiny trainings, copied under new
names with their own ``hparams.yaml``) in a temporary folder, then times the command line
on each, every configuration in a child process of its own:

* ``reference``: ``forensics analyze`` as it was before fleets were streamed (commit
  ``REFERENCE``, exported with ``git archive`` into the temporary folder and run from there
  with the same interpreter), in the same run on the same fleet;
* ``-j 1``, ``-j 2``: this tree's local process pool (``--code COMMIT``: that commit's,
  exported the same way);
* ``--scheduler local:2``: a Dask ``LocalCluster`` of two workers the command starts;
* ``no --json``: the reference and ``-j 1`` again with the text report only, since
  writing the JSON report of every run at once is a cost of its own (the check is then the
  counts in the text report's last line);
* with ``--baseline COMMIT``: ``-j 1`` and ``-j 2`` of that commit's package too, exported
  the same way and measured in the same rounds (before and after a change);
* with ``--s3-sizes``: the same fleet uploaded to moto's S3 server on loopback (started in
  a process of its own, ``tests/s3server.py``) and analysed as ``s3://fleet/fleet-N``.

Each line gives the wall time, runs per second and its speed as a ratio to the reference's
on the same fleet (a ``no --json`` line: to the reference's without it; an S3 line: to the
same configuration on the local copy); ``peak RSS`` is the largest
resident set of any one process of the command (``ru_maxrss`` from ``os.wait4``, which
takes the maximum over the command and the workers it reaped); ``peak PSS`` the largest sum
over the command's process tree, sampled ten times a second from
``/proc/PID/smaps_rollup`` (proportional, so pages shared by forked workers count once);
``CPU`` the user and system time of the command and every process it waited for (its
workers); ``analysing process`` the peak resident set of the command's own process alone,
its workers not counted (its ``ru_maxrss``, written at exit): what holds the results, whose
growth from the smallest fleet to the largest, per run, is printed last, with a table of
``-j 2`` against ``-j 1`` at each size. Where the kernel groups processes by session for
CPU shares (``/proc/sys/kernel/sched_autogroup_enabled``), a command's workers share its
session's share: on cores busy with other sessions ``-j 2`` cannot get more CPU than ``-j 1``
and the CPU column, not the wall time, shows what the pool costs.
This process imports nothing large, so that its own size does not pass into its children's
``ru_maxrss``. Every report is checked against the reference's, run by run (status, first
step and tag, finding codes), and the fleet (files and, for S3, objects) against what it was
before: nothing may be written into it.

With ``--rounds N`` every configuration is measured N times, in turn, and the fastest
round is kept (with the largest peaks of any round).

Usage: ``python bench/fleet.py [--sizes 250,1000] [--s3-sizes 100] [--rounds 1] [--seed 0]
[--configs "-j 1;-j 2"] [--baseline COMMIT] [--code COMMIT]`` (a few minutes); the full
figures in docs/performance.md are ``--sizes 100,500,1000,2000 --s3-sizes 1000``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = "9033aee"  # the last commit before issue #18's fleets
PYTHON = sys.executable


@dataclass(frozen=True)
class Config:
    name: str
    flags: tuple[str, ...]
    reference: bool = False
    json: bool = True  # False: the text report only, whose counts are checked
    baseline: bool = False  # the --baseline commit's package


CONFIGS = (
    Config("reference -j 1", ("-j", "1"), reference=True),
    Config("-j 1", ("-j", "1")),
    Config("-j 2", ("-j", "2")),
    Config("--scheduler local:2", ("--scheduler", "local:2")),
    Config("reference -j 1, no --json", ("-j", "1"), reference=True, json=False),
    Config("-j 1, no --json", ("-j", "1"), json=False),
)
S3_CONFIGS = ("-j 1", "-j 2")
BASELINE_CONFIGS = (Config("baseline -j 1", ("-j", "1"), baseline=True),
                    Config("baseline -j 2", ("-j", "2"), baseline=True))


@dataclass(frozen=True)
class Measure:
    config: str
    where: str
    runs: int
    seconds: float
    exit_code: int
    max_rss_mib: float
    peak_pss_mib: float
    parent_mib: float
    cpu_s: float
    load: float
    report: str
    summary: str


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree(pid: int) -> list[int]:
    # /proc/PID/task/*/children names each process's children (Linux 3.5+).
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo.extend(int(c) for c in handle.read().split())
            except OSError:
                pass
    return out


_PARENT_PEAK = """
import atexit, resource, runpy, sys
# The analysing process's own peak (its workers, forked or spawned, exit without atexit).
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(
    str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)))
sys.argv[0] = "forensics"
runpy.run_module("analyzer.cli", run_name="__main__")
"""
"""``python -m analyzer.cli`` that writes its own ``ru_maxrss`` (KiB) into a file at exit."""


def run_cli(config: Config, target: str, runs: int, where: str, code_root: str, work: str,
            env: dict[str, str]) -> Measure:
    """One ``forensics analyze`` of ``target`` in a child process, timed and measured."""
    slug = f"{where}-{runs}-{config.name}".replace(" ", "_").replace(":", "").replace("-", "")
    report = os.path.join(work, f"report-{slug}.json") if config.json else ""
    stdout = os.path.join(work, f"stdout-{slug}.txt")
    parent_file = os.path.join(work, f"parent-{slug}.txt")
    cmd = [PYTHON, "-c", _PARENT_PEAK, parent_file, "analyze", target, "-q",
           *(("--json", report) if report else ()), *config.flags]
    child_env = {**os.environ, **env, "PYTHONPATH": code_root}
    load = os.getloadavg()[0]
    peak = 0
    with open(stdout, "wb") as out:
        start = time.perf_counter()
        # cwd is the work folder: `python -m` puts the working directory first on sys.path
        proc = subprocess.Popen(cmd, cwd=work, env=child_env, stdout=out,
                                stderr=subprocess.STDOUT)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, sum(_pss_kib(p) for p in _tree(proc.pid)))
            time.sleep(0.1)
        seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    with open(parent_file) as handle:
        parent = int(handle.read())
    with open(stdout, errors="replace") as handle:
        lines = [line.rstrip() for line in handle if line.strip()]
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{config.name} on {target} exited {proc.returncode}:\n"
                         + "\n".join(lines[-20:]))
    return Measure(config.name, where, runs, seconds, proc.returncode,
                   usage.ru_maxrss / 1024, peak / 1024, parent / 1024,
                   usage.ru_utime + usage.ru_stime, load, report,
                   lines[-1] if lines else "")


def _outcomes(report: str) -> dict[str, tuple[object, ...]]:
    with open(report) as handle:
        runs = json.load(handle)["runs"]
    out: dict[str, tuple[object, ...]] = {}
    for run in runs:
        incident = run.get("incident") or {}
        out[run["name"]] = (run.get("status"), incident.get("step"), incident.get("tag"),
                            tuple(f["code"] for f in run.get("findings") or ()))
    return out


def _snapshot(folder: str) -> dict[str, tuple[int, int]]:
    out = {}
    for top, _, names in os.walk(folder):
        for name in names:
            stat = os.stat(os.path.join(top, name))
            out[os.path.join(top, name)] = (stat.st_size, stat.st_mtime_ns)
    return out


def export(commit: str, folder: str) -> str:
    """A commit's package, exported (not checked out) into ``folder``."""
    os.makedirs(folder)
    archive = subprocess.run(["git", "-C", ROOT, "archive", commit, "analyzer"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    found = subprocess.run([PYTHON, "-c", "import analyzer; print(analyzer.__file__)"],
                           cwd=folder, env={**os.environ, "PYTHONPATH": folder}, check=True,
                           capture_output=True, text=True).stdout.strip()
    if not found.startswith(folder):  # an installed copy would shadow the export
        raise SystemExit(f"the exported package is not the one imported: {found}")
    return folder


def make_fleet(work: str, runs: int, seed: int) -> str:
    out = os.path.join(work, f"fleet-{runs}")
    subprocess.run([PYTHON, os.path.join(ROOT, "bench", "fleetgen.py"), out, "--runs",
                    str(runs), "--seed", str(seed), "--trainings",
                    os.path.join(work, "trainings")], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": ROOT})
    return out


_SERVER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.s3server import ENV, S3Server
server = S3Server().start()
server.create_bucket("fleet")
for folder in sys.argv[2:]:
    server.upload(folder, "s3://fleet/" + folder.rstrip("/").rsplit("/", 1)[-1])
objects = sorted(server.snapshot("fleet").items())
print(json.dumps({"env": {**ENV, "AWS_ENDPOINT_URL": server.endpoint}, "objects": objects}),
      flush=True)
sys.stdin.read()  # serve until the benchmark closes our stdin
print(json.dumps(sorted(server.snapshot("fleet").items())), flush=True)
server.stop()
"""


@contextmanager
def s3_server(folders: Sequence[str]) -> Iterator[tuple[dict[str, str], list[bool]]]:
    """moto's S3 server in a process of its own, holding ``folders`` in bucket ``fleet``:
    the environment that points s3fs at it, and (after the block) whether every object's
    key, size and ETag are what they were before."""
    proc = subprocess.Popen([PYTHON, "-c", _SERVER, ROOT, *folders], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.stdin is not None and proc.stdout is not None
    same: list[bool] = []
    try:
        started = json.loads(proc.stdout.readline())
        yield started["env"], same
    finally:
        proc.stdin.close()
        after = proc.stdout.readline()
        proc.wait(timeout=60)
    same.append(bool(after) and json.loads(after) == started["objects"])


def _plan(sizes: Sequence[int], s3_sizes: Sequence[int], configs: Sequence[Config] = CONFIGS,
          ) -> list[tuple[str, int, Config]]:
    """(where, runs, configuration) in the order one round measures them."""
    plan = []
    for n in sorted(set(sizes) | set(s3_sizes)):
        plan += [("local", n, c) for c in configs
                 if n in sizes or (c.reference and c.json) or c.name in S3_CONFIGS]
        if n in s3_sizes:
            plan += [("s3", n, c) for c in CONFIGS if c.name in S3_CONFIGS]
    return plan


def _best(rounds: Sequence[Measure]) -> Measure:
    """The fastest round's figures, with the largest peaks any round reached."""
    fastest = min(rounds, key=lambda m: m.seconds)  # its CPU time too
    return replace(fastest, max_rss_mib=max(m.max_rss_mib for m in rounds),
                   peak_pss_mib=max(m.peak_pss_mib for m in rounds),
                   parent_mib=max(m.parent_mib for m in rounds))


def bench(sizes: Sequence[int], s3_sizes: Sequence[int], seed: int, rounds: int,
          code: str | None, keep: bool, configs: Sequence[Config] = CONFIGS,
          baseline: str | None = None) -> None:
    work = tempfile.mkdtemp(prefix="fleet-bench-")
    measured: dict[tuple[str, int, str], list[Measure]] = {}
    problems: list[str] = []
    try:
        reference = export(REFERENCE, os.path.join(work, "reference"))
        new = ROOT if code is None else export(code, os.path.join(work, "new"))
        old = export(baseline, os.path.join(work, "baseline")) if baseline else new
        if baseline:
            configs = [*configs, *BASELINE_CONFIGS]
        fleets = {n: make_fleet(work, n, seed) for n in sorted(set(sizes) | set(s3_sizes))}
        snapshots = {n: _snapshot(f) for n, f in fleets.items()}
        with ExitStack() as stack:
            env: dict[str, str] = {}
            unchanged: list[bool] = []
            if s3_sizes:
                env, unchanged = stack.enter_context(s3_server([fleets[n] for n in s3_sizes]))
            for k in range(rounds):
                print(f"round {k + 1} of {rounds}", flush=True)
                for where, n, config in _plan(sizes, s3_sizes, configs):
                    target = fleets[n] if where == "local" else f"s3://fleet/fleet-{n}"
                    root = reference if config.reference else old if config.baseline else new
                    m = run_cli(config, target, n, where, root, work,
                                env if where == "s3" else {})
                    measured.setdefault((where, n, config.name), []).append(m)
                    print(_line(m, [ms[-1] for ms in measured.values()]), flush=True)
        if s3_sizes and not all(unchanged):
            problems.append("the bucket changed while it was analysed")
        for n, fleet in fleets.items():
            if _snapshot(fleet) != snapshots[n]:
                problems.append(f"fleet-{n} changed while it was analysed")
        measures = [_best(ms) for ms in measured.values()]
        problems += _check(measures)
    finally:
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(_table(measures))
    print()
    print(_jobs_table(measures))
    print(f"\n{os.cpu_count()} cores; best of {rounds} round(s) (peaks: the largest of them); "
          "load average (1 min) when the best one started")
    if problems:
        raise SystemExit("\n".join(problems))
    print("every report agrees with the reference's (-j 1's without it), run by run; nothing "
          "was written into the fleets or the bucket")


def _check(measures: Sequence[Measure]) -> list[str]:
    problems = []
    # The reference's reports, or -j 1's where the reference was not measured.
    base = [m for m in measures if m.config.startswith("reference")] or \
        [m for m in measures if m.config.startswith("-j 1")]
    refs = {m.runs: _outcomes(m.report) for m in base if m.report}
    counts = {m.runs: re.findall(r"\d+", m.summary) for m in base}
    for m in measures:
        what = f"{m.config} ({m.where}, {m.runs})"
        if not m.report:  # the text report: its last line's counts
            if re.findall(r"\d+", m.summary) != counts.get(m.runs):
                problems.append(f"{what}: {m.summary!r} where the reference says "
                                f"{counts.get(m.runs)}")
            continue
        got = _outcomes(m.report)
        if len(got) != m.runs:
            problems.append(f"{what}: {len(got)} runs in the report")
        want = refs.get(m.runs)
        if want is not None and got != want:
            differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            problems.append(f"{what}: {len(differ)} runs differ from the reference, e.g. "
                            f"{differ[0]}: {got.get(differ[0])} against {want.get(differ[0])}")
    return problems


def _base(m: Measure, measures: Sequence[Measure]) -> Measure | None:
    for other in measures:
        if other.runs != m.runs or other is m:
            continue
        if m.where == "s3" and other.where == "local" and other.config == m.config:
            return other
        if m.where == "local" and other.config.startswith("reference") and \
                bool(other.report) == bool(m.report):
            return other
    return None


def _line(m: Measure, measures: Sequence[Measure]) -> str:
    base = _base(m, measures)
    ratio = f"{base.seconds / m.seconds:.2f}x" if base is not None else \
        "1.00x" if m.config.startswith("reference") else "-"
    return (f"| {m.where} | {m.config} | {m.runs:,} | {m.seconds:.1f} s | "
            f"{m.runs / m.seconds:.1f} | {ratio} | {m.cpu_s:.1f} s | {m.max_rss_mib:,.0f} MiB | "
            f"{m.peak_pss_mib:,.0f} MiB | {m.parent_mib:,.0f} MiB | {m.load:.1f} |")


def _table(measures: Sequence[Measure]) -> str:
    head = ("| fleet | configuration | runs | time | runs/s | ratio | CPU | peak RSS (largest "
            "process) | peak PSS (all processes) | peak RSS (analysing process) | load |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")
    return "\n".join([head, *(_line(m, measures) for m in measures)])


def _jobs_table(measures: Sequence[Measure]) -> str:
    """-j 2 against -j 1 (with --json, local) at each size: wall times, their ratio, and
    the peak RSS of the analysing process alone, with what it grew by per run."""
    rows = ["| code | runs | -j 1 | -j 2 | -j 1 time / -j 2 time | CPU, -j 1 / -j 2 | "
            "analysing process's peak RSS, -j 1 / -j 2 | load |",
            "|---|---|---|---|---|---|---|---|"]
    growth = []
    for prefix in ("", "baseline "):
        got = {(m.runs, m.config): m for m in measures if m.where == "local" and m.report}
        sizes = sorted(n for n, c in got if c == f"{prefix}-j 1" and (n, f"{prefix}-j 2") in got)
        for n in sizes:
            one, two = got[(n, f"{prefix}-j 1")], got[(n, f"{prefix}-j 2")]
            rows.append(f"| {prefix.strip() or 'this'} | {n:,} | {one.seconds:.1f} s | "
                        f"{two.seconds:.1f} s | {one.seconds / two.seconds:.2f}x | "
                        f"{one.cpu_s:.1f} / {two.cpu_s:.1f} s | "
                        f"{one.parent_mib:,.0f} / {two.parent_mib:,.0f} MiB | "
                        f"{one.load:.1f} / {two.load:.1f} |")
        if len(sizes) > 1:
            lo, hi = sizes[0], sizes[-1]
            for jobs in ("1", "2"):
                a, b = got[(lo, f"{prefix}-j {jobs}")], got[(hi, f"{prefix}-j {jobs}")]
                growth.append(f"{prefix or 'this: '}-j {jobs}: the analysing process grew by "
                              f"{(b.parent_mib - a.parent_mib) * 1024 / (hi - lo):.1f} KiB a "
                              f"run from {lo:,} to {hi:,} runs")
    return "\n".join([*rows, "", *growth])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="250,1000",
                        help="fleet sizes analysed locally by every configuration")
    parser.add_argument("--s3-sizes", default="100",
                        help="fleet sizes also analysed over loopback S3 ('' for none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every configuration this many times, in turn, and keep "
                             "the fastest")
    parser.add_argument("--code", metavar="COMMIT",
                        help="measure this commit's package (exported like the reference's) "
                             "instead of the working tree's")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--configs", default=";".join(c.name for c in CONFIGS),
                        help="the local configurations to measure, by name, separated by ';' "
                             "(names hold commas; default: all)")
    parser.add_argument("--baseline", metavar="COMMIT",
                        help="also measure -j 1 and -j 2 of this commit's package, in the same "
                             "rounds (before and after a change)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    s3_sizes = [int(s) for s in args.s3_sizes.split(",") if s]
    names = [c.strip() for c in args.configs.split(";") if c.strip()]
    unknown = set(names) - {c.name for c in CONFIGS}
    if unknown:
        parser.error(f"unknown configurations: {', '.join(sorted(unknown))}")
    bench(sizes, s3_sizes, args.seed, args.rounds, args.code, args.keep,
          [c for c in CONFIGS if c.name in names], args.baseline)


if __name__ == "__main__":
    main()
