"""Event-file ingest: this reader against TensorBoard's EventAccumulator and tbparse.

Generates a 200,000-step x 10-tag scalar file (about 120 MB) and a variant with histograms,
then times, on the same files in the same process:

  * "frame": all scalars into one long pandas DataFrame (run, tag, step, value, ...)
  * "first": the first non-finite step of the run

for this reader with CRCs verified and with verification off, EventAccumulator (every size
guidance 0, i.e. keep everything) and tbparse. Ratios are what count: the machine is shared.
Last, the peak memory of reading the scalar file, and a file with a 1 GiB zero tail.

    python bench/ingest.py                 # full size, both references
    python bench/ingest.py --steps 20000   # quicker
    python bench/ingest.py --skip-refs     # this reader only
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eventgen

import analyzer


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


def bench_file(label: str, run: str, size: int, repeat: int, skip_refs: bool) -> None:
    mb = size / 1e6
    rows: list[tuple[str, str, float]] = []
    for verify in (True, False):
        name = "forensics" + ("" if verify else " --no-verify")
        t, _ = timed(lambda v=verify: ours_frame(run, v), repeat)  # type: ignore[misc]
        rows.append((name, "frame", t))
        t, step = timed(lambda v=verify: ours_first(run, v), repeat)  # type: ignore[misc]
        rows.append((name, "first", t))
        print(f"  {name:<24} first non-finite step {step}", flush=True)
    if not skip_refs:
        for name, fn in (("EventAccumulator", accumulator_frame), ("tbparse", tbparse_frame)):
            t0 = time.perf_counter()
            frame = fn(run)
            t_frame = time.perf_counter() - t0
            step = first_from_frame(frame)
            t_first = time.perf_counter() - t0
            rows.append((name, "frame", t_frame))
            rows.append((name, "first", t_first))
            print(f"  {name:<24} first non-finite step {step}", flush=True)
    print(f"\n{label}: {mb:.1f} MB")
    print(f"  {'reader':<24} {'task':<6} {'seconds':>8} {'MB/s':>8}   ratios")
    refs = {(n, task): t for n, task, t in rows if not n.startswith("forensics")}
    for name, task, t in rows:
        ratio = ""
        if name.startswith("forensics") and refs:
            ratio = "  ".join(f"{t_ref / t:5.1f}x vs {ref}" for (ref, rtask), t_ref in refs.items()
                              if rtask == task)
        print(f"  {name:<24} {task:<6} {t:8.2f} {mb / t:8.1f}   {ratio}")


def bench_parallel(tmp: str, steps: int, repeat: int) -> None:
    run = os.path.join(tmp, "parallel")
    os.makedirs(run)
    total = 0
    parts = 4
    for k in range(parts):
        total += eventgen.write_run(
            os.path.join(run, f"events.out.tfevents.{1700000000 + k}.host.1.0"),
            steps=steps // parts, tags=10, first_step=k * (steps // parts), seed=k)
    print(f"\nseveral files: {parts} files, {total / 1e6:.1f} MB in all")
    base = None
    for jobs in (1, 2):
        t, _ = timed(lambda j=jobs: analyzer.analyze(run, jobs=j), repeat)  # type: ignore[misc]
        base = base or t
        print(f"  jobs={jobs}: {t:6.2f} s  {total / 1e6 / t:7.1f} MB/s  speed-up {base / t:4.2f}x")


_CHILD = """
import resource, sys, time
from analyzer.ingest.tb import read_event_file

def peak():  # VmHWM is this process's own; ru_maxrss may carry the parent's over a fork
    try:
        with open("/proc/self/status") as fh:
            return next(int(l.split()[1]) for l in fh if l.startswith("VmHWM:")) * 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

before = peak()
t0 = time.perf_counter()
result = read_event_file(sys.argv[1])
seconds = time.perf_counter() - t0
print(seconds, peak() - before, result.records, ",".join(i.kind for i in result.issues) or "-")
"""


def bench_memory(tmp: str, large: str) -> None:
    """Peak RSS growth of reading one file, in a child process: the large scalar file, and a
    small file followed by a sparse 1 GiB zero tail (it costs no disk)."""
    tail = os.path.join(tmp, "events.out.tfevents.1700000009.host.tail")
    written = eventgen.write_run(tail, steps=1000, tags=10)
    os.truncate(tail, written + (1 << 30))
    print("\nmemory (peak RSS growth while reading, in a child process)")
    for label, path in (("scalars", large), ("1 GiB zero tail", tail)):
        size = os.path.getsize(path)
        done = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True,
                              text=True, check=True)
        seconds, grown, records, kinds = done.stdout.split()
        print(f"  {label:<16} {size / 1e6:8.1f} MB  {float(seconds):6.2f} s  "
              f"peak +{int(grown) / 2**20:6.0f} MiB ({int(grown) / size:.2f} of the file)  "
              f"{records} records, issues: {kinds}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="best of N for this reader")
    parser.add_argument("--skip-refs", action="store_true")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="forensics-bench-")
    try:
        nan_step = int(args.steps * 0.75)
        for label, hist_every in (("scalars", 0), ("scalars + histograms", 10)):
            run = os.path.join(tmp, label.replace(" ", "").replace("+", "_"))
            os.makedirs(run)
            path = os.path.join(run, "events.out.tfevents.1700000000.host.1.0")
            t0 = time.perf_counter()
            size = eventgen.write_run(path, steps=args.steps, tags=args.tags, nan_step=nan_step,
                                      hist_every=hist_every)
            print(f"generated {label}: {size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s; "
                  f"NaN written at step {nan_step}", flush=True)
            bench_file(label, run, size, args.repeat, args.skip_refs)
        bench_parallel(tmp, args.steps, args.repeat)
        bench_memory(tmp, os.path.join(tmp, "scalars", "events.out.tfevents.1700000000.host.1.0"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
