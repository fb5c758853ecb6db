"""Event-file ingest: this reader against rustboard, EventAccumulator and tbparse.

The files (200,000 steps x 10 scalar tags by default, the loss NaN at 75% of the steps):

  * ``synthetic``: ``bench/eventgen.py``'s ``write_run``, the benchmark's historical file (it
    is SummaryWriter's layout: the same bytes as ``scalars`` with the default sizes, said so)
  * ``scalars``, ``histograms``, ``tensorboardx``, ``tensor_scalars``: the layouts of the real
    writers (``bench/realwriters.py``: torch's SummaryWriter, with ``add_histogram`` every 200
    steps, tensorboardX, ``new_style`` tensor scalars). A real writer needs minutes for
    200,000 steps, so each is first run on ``--check-steps`` steps and eventgen's generator
    must give its records byte for byte; the full-size file is then eventgen's (``--real``
    writes it with the real writer instead, cached in the temporary directory).

On each file, alternately, best of ``--repeat``:

  * this reader, ``read_event_file`` with every CRC verified, in a child process pinned to one
    core; its peak RSS growth (``VmHWM`` after reading less before) is given as a share of the
    file's size
  * the limit: reading the file and one google_crc32c over it, on one core
  * rustboard (``bench/rustboard.py``), TensorBoard's Rust data server with ``--checksum``,
    timed from its start until ``ListScalars`` shows every tag at its last step, then
    ``ReadScalars`` apart; its peak RSS is the whole server's

and both must have read the same number of points and non-finite values. Then, on smaller
files (``--ref-steps``, as they read at about 1 MB/s), EventAccumulator (every size guidance 0)
and tbparse against this reader for a long DataFrame ("frame") and the first non-finite step
("first"); ``--jobs 2`` against ``--jobs 1`` on a run of four files; and hostile files: a
1 GiB zero tail and a record whose length field claims 2**60 bytes. The last table says, per
file, whether the goal holds: at least 2x rustboard's ingest and peak RSS below 0.5x the file.

    python bench/ingest.py                       # everything, full size (about 10 minutes)
    python bench/ingest.py --steps 20000         # quicker
    python bench/ingest.py --only histograms     # one part (repeatable): a file, refs, jobs,
                                                 # hostile
    python bench/ingest.py --skip-refs           # no EventAccumulator / tbparse

Another version of the reader is measured by putting its tree first on PYTHONPATH (for a
commit: ``git archive COMMIT analyzer | tar -x -C DIR``, then ``PYTHONPATH=DIR python
bench/ingest.py``); the header names the analyzer measured, and every child reads with it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eventgen
import realwriters
import rustboard

import analyzer

FILE_KINDS = ("synthetic", *realwriters.KINDS)
PARTS = (*FILE_KINDS, "refs", "jobs", "hostile")
EVENTS = "events.out.tfevents.1700000000.host.1.0"


def load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
        return f"{one:.2f} {five:.2f} {fifteen:.2f}"
    except OSError:
        return "?"


def source() -> str:
    """Which analyzer is measured: its folder, and the commit and changed files of its tree."""
    folder = os.path.dirname(os.path.abspath(analyzer.__file__))
    try:
        head = subprocess.run(["git", "-C", folder, "log", "-1", "--format=%h"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", folder, "status", "--porcelain", "--", "ingest"],
                               capture_output=True, text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return folder
    changed = [line[3:] for line in dirty if line.strip()]
    return (f"{folder} at {head or 'no commit'}"
            + (f", uncommitted: {' '.join(changed)}" if changed else ""))


def one_core() -> set[int]:
    return {min(os.sched_getaffinity(0))}


# ---------------------------------------------------------------- files

@dataclass
class BenchFile:
    kind: str
    path: str  # the event file, alone in its folder (the run rustboard sees)
    size: int
    tags: list[str]
    last_step: int
    made: str  # how it was written

    def digest(self) -> str:
        h = hashlib.sha256()
        with open(self.path, "rb") as fh:
            while chunk := fh.read(32 << 20):
                h.update(chunk)
        return h.hexdigest()


def make_file(kind: str, root: str, steps: int, tags: int, check_steps: int,
              real: bool) -> BenchFile:
    folder = os.path.join(root, kind)
    os.makedirs(folder)
    t0 = time.perf_counter()
    if kind == "synthetic":
        path = os.path.join(folder, EVENTS)
        size = eventgen.write_run(path, steps=steps, tags=tags, nan_step=int(steps * 0.75))
        names = realwriters.Spec(steps=steps, tags=tags).tag_names()
        return BenchFile(kind, path, size, names, steps - 1,
                         f"eventgen.write_run in {time.perf_counter() - t0:.1f} s")
    spec = realwriters.Spec(kind=kind, steps=steps, tags=tags)
    if real:
        cached = os.path.isdir(os.path.join(realwriters.cache_root(), spec.key()))
        source = realwriters.ensure(spec)
        path = os.path.join(folder, os.path.basename(source))
        shutil.copyfile(source, path)
        made = (f"the real writer's file, {'from its cache' if cached else 'written now'} and "
                f"copied in {time.perf_counter() - t0:.1f} s")
    else:
        check = realwriters.Spec(kind=kind, steps=check_steps, tags=tags,
                                 hist_every=min(spec.hist_every, max(1, check_steps // 10)))
        with tempfile.TemporaryDirectory(prefix="forensics-check-") as tmp:
            theirs = realwriters.ensure(check, root=tmp)
            mine = os.path.join(tmp, "mine")
            eventgen.write_spec(mine, check)
            with open(theirs, "rb") as a, open(mine, "rb") as b:
                differs = realwriters.same_bytes(a.read(), b.read())
        if differs:
            raise SystemExit(f"{kind}: eventgen's records are not the real writer's "
                             f"({differs}); rerun with --real")
        t1 = time.perf_counter()
        path = os.path.join(folder, EVENTS)
        eventgen.write_spec(path, spec)
        made = (f"eventgen.write_spec in {time.perf_counter() - t1:.1f} s, its records equal to "
                f"the real writer's on {check_steps} steps (checked in {t1 - t0:.1f} s)")
    return BenchFile(kind, path, os.path.getsize(path), spec.tag_names(), steps - 1, made)


# ---------------------------------------------------------------- this reader, in a child

_CHILD = """
import json, math, resource, sys, time
from analyzer.ingest.tb import read_event_file

def hwm():  # VmHWM is this process's own; ru_maxrss may carry the parent's over a fork
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmHWM:")) * 1024

before = hwm()
cpu0 = time.process_time()
t0 = time.perf_counter()
result = read_event_file(sys.argv[1], verify=sys.argv[2] == "1")
seconds = time.perf_counter() - t0
cpu = time.process_time() - cpu0
peak = hwm()
points = sum(len(s.values) for s in result.series)
nonfinite = sum(int((~__import__("numpy").isfinite(s.values)).sum()) for s in result.series)
print(json.dumps({"seconds": seconds, "cpu": cpu, "before": before, "peak": peak,
                  "module": read_event_file.__module__ and sys.modules["analyzer"].__file__,
                  "records": result.records, "points": points, "nonfinite": nonfinite,
                  "issues": [i.kind for i in result.issues]}))
"""


_LIMIT = """
import sys, time
import google_crc32c
t0 = time.perf_counter()
with open(sys.argv[1], "rb", buffering=0) as fh:
    crc = 0
    while chunk := fh.read(32 << 20):
        crc = google_crc32c.extend(crc, chunk)
print(time.perf_counter() - t0)
"""


def limit(path: str, timeout: float = 600.0) -> float:
    """Seconds to read the file by 32 MiB and run google_crc32c over it once, on one core:
    what no reader checking every byte's CRC goes below here."""
    return float(child(_LIMIT, path, timeout=timeout).split()[-1])


def child(code: str, *args: str, timeout: float = 600.0, pin: bool = True) -> str:
    """The stdout of ``python -c code args`` (on one core with ``pin``); its stderr on failure."""
    cpus = one_core()
    # run from bench/, so that the analyzer found is the one this process imported (from the
    # installed package or PYTHONPATH), not a folder that happens to be the working directory
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=os.path.dirname(os.path.abspath(__file__)),
                          preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if pin else None)
    if done.returncode:
        raise RuntimeError(f"a benchmark child failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return done.stdout


def ours(path: str, verify: bool = True, timeout: float = 600.0) -> dict[str, object]:
    stdout = child(_CHILD, path, "1" if verify else "0", timeout=timeout)
    out: dict[str, object] = json.loads(stdout.strip().splitlines()[-1])
    if out["module"] != analyzer.__file__:
        raise RuntimeError(f"the child read with {out['module']}, not {analyzer.__file__}")
    return out


# ---------------------------------------------------------------- ours against rustboard

@dataclass
class Versus:
    file: BenchFile
    ours_s: float
    ours_cpu: float
    ours_growth: int
    ours_peak: int
    rb_ingest: float | None
    rb_read: float | None
    rb_rss: int | None
    rb_cpu: float | None
    agree: str
    limit_s: float


def versus(bf: BenchFile, repeat: int, rb_ok: bool) -> Versus:
    mine: list[dict[str, object]] = []
    theirs: list[rustboard.Result] = []
    limits: list[float] = []
    expected = dict.fromkeys(bf.tags, bf.last_step)
    for _ in range(repeat):
        limits.append(limit(bf.path))
        mine.append(ours(bf.path))
        if rb_ok:
            theirs.append(rustboard.measure(os.path.dirname(bf.path), expected))
    best = min(mine, key=lambda r: float(r["seconds"]))  # type: ignore[arg-type]
    growth = max(int(r["peak"]) - int(r["before"]) for r in mine)  # type: ignore[call-overload]
    peak = max(int(r["peak"]) for r in mine)  # type: ignore[call-overload]
    agree = "-"
    if theirs:
        rb_points = sum(theirs[0].points.values())
        agree = ("same points" if (rb_points, theirs[0].nonfinite) == (best["points"],
                                                                       best["nonfinite"])
                 else f"DIFFER: ours {best['points']} points, {best['nonfinite']} non-finite; "
                      f"rustboard {rb_points}, {theirs[0].nonfinite}")
    if best["issues"]:
        agree += f"; our issues: {','.join(best['issues'])}"  # type: ignore[arg-type]
    return Versus(
        bf, float(best["seconds"]), float(best["cpu"]), growth, peak,  # type: ignore[arg-type]
        min(r.ingest_s for r in theirs) if theirs else None,
        min(r.read_s for r in theirs) if theirs else None,
        max(r.peak_rss for r in theirs) if theirs else None,
        min(r.cpu_s for r in theirs) if theirs else None, agree, min(limits))


def print_versus(v: Versus) -> None:
    mb = v.file.size / 1e6
    print(f"\n{v.file.kind}: {mb:.1f} MB ({v.file.made})")
    print(f"  this reader, CRCs verified, one core: {v.ours_s:6.2f} s ({v.ours_cpu:.2f} s CPU) "
          f"{mb / v.ours_s:7.1f} MB/s  peak RSS +{v.ours_growth / 2**20:.0f} MiB "
          f"({v.ours_growth / v.file.size:.2f}x the file; process {v.ours_peak / 2**20:.0f} MiB)")
    print(f"  limit, read + google_crc32c, one core: {v.limit_s:6.2f} s            "
          f"{mb / v.limit_s:7.1f} MB/s  (this reader takes {v.ours_s / v.limit_s:.1f}x)")
    if v.rb_ingest is not None:
        assert v.rb_read is not None and v.rb_rss is not None and v.rb_cpu is not None
        print(f"  rustboard --checksum:                 {v.rb_ingest:6.2f} s ingest "
              f"({v.rb_cpu:.2f} s CPU) {mb / v.rb_ingest:7.1f} MB/s + {v.rb_read:.2f} s "
              f"ReadScalars  peak RSS {v.rb_rss / 2**20:.0f} MiB "
              f"({v.rb_rss / v.file.size:.2f}x)")
        print(f"  ours / rustboard: {v.rb_ingest / v.ours_s:.2f}x its ingest, "
              f"{(v.rb_ingest + v.rb_read) / v.ours_s:.2f}x ingest + ReadScalars; {v.agree}")
    else:
        print(f"  rustboard not run; {v.agree}")


def print_summary(rows: list[Versus]) -> None:
    """The goal per file, as a markdown table: the verdict is on wall time, as rustboard's
    clients wait for it; CPU seconds are beside it (rustboard's over all its threads)."""
    print("\nDone when: this reader >= 2x rustboard's ingest, peak RSS < 0.5x the file "
          f"(load {load()})\n")
    print("| file | MB | limit s | ours s (CPU) | rustboard s (CPU) | ratio wall (CPU) "
          "| ours RSS growth / file | rustboard RSS / file | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v in rows:
        share = v.ours_growth / v.file.size
        fails, rb, ratio, rb_rss = [], "-", "-", "-"
        if v.rb_ingest is None or v.rb_cpu is None or v.rb_rss is None:
            fails.append("no rustboard")
        else:
            rb = f"{v.rb_ingest:.2f} ({v.rb_cpu:.2f})"
            cpu = f"{v.rb_cpu / v.ours_cpu:.2f}x" if v.ours_cpu > 0 else "-"
            ratio = f"{v.rb_ingest / v.ours_s:.2f}x ({cpu})"
            rb_rss = f"{v.rb_rss / v.file.size:.2f}"
            if v.rb_ingest / v.ours_s < 2:
                fails.append("speed")
        if share >= 0.5:
            fails.append("memory")
        verdict = "PASS" if not fails else "FAIL (" + ", ".join(fails) + ")"
        print(f"| {v.file.kind} | {v.file.size / 1e6:.1f} | {v.limit_s:.2f} "
              f"| {v.ours_s:.2f} ({v.ours_cpu:.2f}) | {rb} | {ratio} | {share:.2f} | {rb_rss} "
              f"| {verdict} |")


# ---------------------------------------------------------------- EventAccumulator, tbparse

def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def ours_frame(run: str, verify: bool) -> object:
    return analyzer.scalars(run, verify=verify)


def ours_first(run: str, verify: bool) -> int | None:
    result = analyzer.analyze(run, verify=verify, replay=False, rules=False).results[0]
    return result.incident.step if result.incident else None


def accumulator_frame(run: str) -> object:
    import pandas as pd
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(run, size_guidance={k: 0 for k in ea.DEFAULT_SIZE_GUIDANCE})
    acc.Reload()
    parts = []
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        parts.append(pd.DataFrame({"tag": tag, "step": [e.step for e in events],
                                   "value": [e.value for e in events],
                                   "wall_time": [e.wall_time for e in events]}))
    return pd.concat(parts, ignore_index=True)


def first_from_frame(frame: object) -> int | None:
    import pandas as pd

    assert isinstance(frame, pd.DataFrame)
    bad = frame[~np.isfinite(frame["value"].to_numpy(dtype=float))]
    return int(bad["step"].min()) if len(bad) else None


def tbparse_frame(run: str) -> object:
    from tbparse import SummaryReader

    return SummaryReader(run, pivot=False).scalars


def bench_refs(bf: BenchFile, repeat: int) -> None:
    # imported before the clocks start: imports are not what is timed
    import pandas  # noqa: F401
    import tbparse  # noqa: F401
    from tensorboard.backend.event_processing import event_accumulator  # noqa: F401

    import analyzer.frames  # noqa: F401

    run, mb = os.path.dirname(bf.path), bf.size / 1e6
    rows: list[tuple[str, str, float]] = []
    for verify in (True, False):
        name = "forensics" + ("" if verify else " --no-verify")
        t, _ = timed(lambda v=verify: ours_frame(run, v), repeat)  # type: ignore[misc]
        rows.append((name, "frame", t))
        t, step = timed(lambda v=verify: ours_first(run, v), repeat)  # type: ignore[misc]
        rows.append((name, "first", t))
        print(f"  {name:<24} first non-finite step {step}", flush=True)
    for name, fn in (("EventAccumulator", accumulator_frame), ("tbparse", tbparse_frame)):
        t0 = time.perf_counter()
        frame = fn(run)
        t_frame = time.perf_counter() - t0
        step = first_from_frame(frame)
        t_first = time.perf_counter() - t0
        rows += [(name, "frame", t_frame), (name, "first", t_first)]
        print(f"  {name:<24} first non-finite step {step}", flush=True)
    print(f"\n{bf.kind} (references): {mb:.1f} MB, load {load()}")
    print(f"  {'reader':<24} {'task':<6} {'seconds':>8} {'MB/s':>8}   ratios")
    refs = {(n, task): t for n, task, t in rows if not n.startswith("forensics")}
    for name, task, t in rows:
        ratio = ""
        if name.startswith("forensics"):
            ratio = "  ".join(f"{t_ref / t:5.1f}x vs {ref}" for (ref, rtask), t_ref in refs.items()
                              if rtask == task)
        print(f"  {name:<24} {task:<6} {t:8.2f} {mb / t:8.1f}   {ratio}")


# ---------------------------------------------------------------- --jobs

_JOBS_CHILD = """
import sys, time
import analyzer
t0 = time.perf_counter()
runs = analyzer.read(sys.argv[1], jobs=int(sys.argv[2]))
print(time.perf_counter() - t0, sum(len(s.values) for r in runs for s in r.series))
"""


def bench_jobs(root: str, steps: int, tags: int, repeat: int) -> None:
    run = os.path.join(root, "parallel")
    os.makedirs(run)
    total, parts = 0, 4
    for k in range(parts):
        total += eventgen.write_run(
            os.path.join(run, f"events.out.tfevents.{1700000000 + k}.host.1.0"),
            steps=steps // parts, tags=tags, first_step=k * (steps // parts), seed=k)
    best: dict[int, float] = {}
    points: dict[int, int] = {}
    for _ in range(repeat):
        for jobs in (1, 2):
            seconds, n = child(_JOBS_CHILD, run, str(jobs), pin=False).split()[-2:]
            best[jobs] = min(best.get(jobs, float("inf")), float(seconds))
            points[jobs] = int(n)
    print(f"\nseveral files: {parts} files, {total / 1e6:.1f} MB in all, analyzer.read in a "
          f"child process, best of {repeat} alternating, load {load()}")
    for jobs in (1, 2):
        print(f"  jobs={jobs}: {best[jobs]:6.2f} s  {total / 1e6 / best[jobs]:7.1f} MB/s  "
              f"speed-up {best[1] / best[jobs]:4.2f}x  ({points[jobs]} points)")


# ---------------------------------------------------------------- hostile files

def bench_hostile(root: str, tags: int, repeat: int) -> None:
    """A small file followed by a sparse 1 GiB zero tail (it costs no disk), and one whose
    last record's length field, with a valid CRC, claims 2**60 bytes.

    The first read of a sparse file's hole makes the kernel fill the page cache with zero
    pages (seconds of system time on a busy machine): it is shown apart, and the figure is
    the best of ``repeat`` reads after it, as for the other files, with the limit beside it."""
    folder = os.path.join(root, "hostile")
    os.makedirs(folder)
    tail = os.path.join(folder, "events.out.tfevents.1700000009.host.tail")
    written = eventgen.write_run(tail, steps=1000, tags=tags)
    os.truncate(tail, written + (1 << 30))
    huge = os.path.join(folder, "events.out.tfevents.1700000010.host.huge")
    written = eventgen.write_run(huge, steps=1000, tags=tags)
    header = struct.pack("<Q", 1 << 60)
    with open(huge, "ab") as fh:
        fh.write(header + eventgen._masked(header) + b"\x5a" * 4096)
    print(f"\nhostile files (this reader in a child, one core, CRCs verified, best of {repeat} "
          f"after a first read, load {load()})")
    for label, path in (("1 GiB zero tail", tail), ("length 2**60", huge)):
        size = os.path.getsize(path)
        first = ours(path)
        runs = [ours(path) for _ in range(repeat)]
        best = min(runs, key=lambda r: float(r["seconds"]))  # type: ignore[arg-type]
        grown = max(int(r["peak"]) - int(r["before"]) for r in [first, *runs])  # type: ignore[call-overload]
        print(f"  {label:<16} {size / 1e6:8.1f} MB  {float(best['seconds']):6.2f} s "  # type: ignore[arg-type]
              f"({float(best['cpu']):.2f} s CPU; first read {float(first['seconds']):.2f} s, "  # type: ignore[arg-type]
              f"{float(first['cpu']):.2f} s CPU; limit {limit(path):.2f} s)  "  # type: ignore[arg-type]
              f"peak RSS +{grown / 2**20:.0f} MiB ({grown / size:.3f}x the file)  "
              f"{best['records']} records, issues: {','.join(best['issues']) or '-'}")  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="best of N, alternating")
    parser.add_argument("--ref-steps", type=int, default=20_000,
                        help="steps of the files EventAccumulator and tbparse read")
    parser.add_argument("--check-steps", type=int, default=2_000,
                        help="steps on which eventgen is checked against each real writer")
    parser.add_argument("--real", action="store_true",
                        help="full-size files from the real writers (minutes each, cached)")
    parser.add_argument("--skip-refs", action="store_true")
    parser.add_argument("--no-rustboard", action="store_true")
    parser.add_argument("--only", action="append", choices=PARTS, metavar="PART",
                        help=f"run only these parts: {', '.join(PARTS)}")
    args = parser.parse_args()
    parts = set(args.only or PARTS)
    if args.skip_refs:
        parts.discard("refs")
    rb_ok = not args.no_rustboard
    if rb_ok:
        try:
            rustboard.binary()
        except rustboard.Unavailable as exc:
            print(f"rustboard skipped: {exc}")
            rb_ok = False
    print(f"python bench/ingest.py {' '.join(sys.argv[1:])}".rstrip()
          + f"\nload average {load()}, {os.cpu_count()} CPUs; this reader runs on CPU "
            f"{min(one_core())}, rustboard on any\nthe reader: {source()}")
    tmp = tempfile.mkdtemp(prefix="forensics-bench-")
    try:
        rows = []
        digests: dict[str, str] = {}
        for kind in FILE_KINDS:
            if kind in parts:
                bf = make_file(kind, tmp, args.steps, args.tags, args.check_steps, args.real)
                digest = bf.digest()
                same = [k for k, d in digests.items() if d == digest]
                digests[kind] = digest
                if same:  # eventgen's own file is SummaryWriter's layout: say so, not hide it
                    bf.made += f"; the same bytes as the {same[0]} file"
                rows.append(versus(bf, args.repeat, rb_ok))
                print_versus(rows[-1])
                os.unlink(bf.path)  # the disk holds one large file at a time
        if "refs" in parts:
            refs = os.path.join(tmp, "refs")
            os.makedirs(refs)
            for kind in ("synthetic", "histograms"):
                bench_refs(make_file(kind, refs, args.ref_steps, args.tags, args.check_steps,
                                     False), args.repeat)
        if "jobs" in parts:
            bench_jobs(tmp, args.steps, args.tags, args.repeat)
        if "hostile" in parts:
            bench_hostile(tmp, args.tags, args.repeat)
        if rows:
            print_summary(rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
