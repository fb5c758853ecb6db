"""Throughput of text-log ingest on a generated log.

Writes a log of about ``--size-mb`` megabytes into a temporary folder, times
``analyzer.ingest.logs.read_log`` on it, and compares with a reference measured in
the same run: a plain Python loop that decodes and iterates the same file's lines.

    .venv/bin/python bench/logs.py                 # 100 MB, every profile mixed
    .venv/bin/python bench/logs.py --profile megatron --size-mb 20 --repeat 1
    .venv/bin/python bench/logs.py --size-mb 1 --zero-tail-gb 1   # a crash's NUL tail
    .venv/bin/python bench/logs.py --profile all --size-mb 20     # one table, every profile

With ``--zero-tail-gb`` the log gets a zero-filled tail of that many GiB (sparse: it
takes no disk), and the reference is a plain chunked read of the whole file, NULs
included, so that the ratio is what skipping the tail costs beyond reading it.

Both wall-clock and process CPU times are printed, each the best of ``--repeat``
runs; the reference and ``read_log`` runs alternate.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from analyzer.ingest.logs import LogRead, read_log


def _hf(rng: random.Random, step: int) -> str:
    bars = "\r".join(
        f" {s // 50:2d}%|{'█' * (s // 500):<10}| {s}/5000 [00:{s % 60:02d}<04:11,  4.95it/s]"
        for s in range(step - 4, step + 1)
    )
    return (
        f"{bars}\r{{'loss': {rng.uniform(1, 3):.4f}, 'grad_norm': {rng.uniform(0.5, 4):.4f}, "
        f"'learning_rate': {rng.uniform(1e-5, 5e-5):.6e}, 'epoch': {step / 5000:.2f}}}\n"
    )


def _deepspeed(rng: random.Random, step: int) -> str:
    line = (
        f"[2024-03-11 10:02:40,004] [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, "
        f"skipped={step // 997}, lr=[{rng.uniform(1e-5, 5e-5):.6e}], mom=[(0.9, 0.999)]\n"
    )
    if step % 97 == 0:
        line += (
            "[2024-03-11 10:02:31,378] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] "
            "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
        )
    return line


def _megatron(rng: random.Random, step: int) -> str:
    return (
        f" [2024-08-01 09:44:55] iteration {step:8d}/  500000 | consumed samples: {step * 96:12d}"
        f" | elapsed time per iteration (ms): {rng.uniform(600, 700):.1f} | learning rate: "
        f"{rng.uniform(1e-5, 3e-4):.3E} | global batch size:    96 | lm loss: "
        f"{rng.uniform(2, 9):.6E} | loss scale: 65536.0 | grad norm: {rng.uniform(0.5, 5):.3f} "
        "| number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )


def _lightning(rng: random.Random, step: int) -> str:
    epoch, batch = divmod(step, 1000)
    return (
        f"\rEpoch {epoch}:  {batch // 10:2d}%|{'█' * (batch // 100):<10}| {batch}/1000 "
        f"[00:12<00:15, 36.50it/s, loss={rng.uniform(0.1, 2):.3f}, v_num=0]"
        + ("\n" if batch % 50 == 0 else "")
    )


def _mmengine(rng: random.Random, step: int) -> str:
    epoch, it = divmod(step, 1509)
    return (
        f"2024/06/19 01:21:51 - mmengine - INFO - Epoch(train)  [{epoch + 1}][{it:4d}/1509]  "
        f"base_lr: 2.0000e-04 lr: {rng.uniform(1e-6, 2e-4):.4e}  eta: 8:27:55  time: 0.2526  "
        f"data_time: 0.0334  memory: 9182  grad_norm: {rng.uniform(1, 50):.4f}  loss: "
        f"{rng.uniform(10, 60):.4f}  loss_cls: {rng.uniform(1, 20):.4f}  loss_bbox: 18.8034\n"
    )


def _noise(rng: random.Random, step: int) -> str:
    return (
        f"2024-03-11 10:02:{step % 60:02d} | INFO | data.loader | worker {step % 8} "
        f"prefetched shard {rng.randrange(10_000)} of the training set\n"
    )


PROFILES: dict[str, tuple[Callable[[random.Random, int], str], ...]] = {
    "hf": (_hf, _deepspeed),
    "megatron": (_megatron,),
    "lightning": (_lightning,),
    "mmengine": (_mmengine,),
    "mixed": (_hf, _deepspeed, _megatron, _lightning, _mmengine, _noise),
}


def _blocks(profile: str, seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    makers = PROFILES[profile]
    for step in itertools.count(5):
        for make in makers:
            yield make(rng, step)


def generate(path: Path, profile: str, size_mb: float, seed: int = 0) -> int:
    target = int(size_mb * 1_000_000)
    written = 0
    with path.open("w", encoding="utf-8") as out:
        batch: list[str] = []
        for block in _blocks(profile, seed):
            batch.append(block)
            written += len(block.encode())
            if len(batch) >= 2000:
                out.write("".join(batch))
                batch.clear()
            if written >= target:
                break
        out.write("".join(batch))
    return path.stat().st_size


def _reference(path: Path) -> None:
    with path.open(encoding="utf-8", errors="replace", newline="") as handle:
        for _line in handle:
            pass


def _raw_reference(path: Path) -> None:
    with path.open("rb") as handle:
        while handle.read(1 << 22):
            pass


def _timed(run: Callable[[], object], best: list[float]) -> object:
    """Run once; keep the lower wall-clock and process CPU times in ``best``. On a
    shared machine CPU time moves less than wall time, which includes time spent
    waiting for a core."""
    start, start_cpu = time.perf_counter(), time.process_time()
    result = run()
    best[0] = min(best[0], time.perf_counter() - start)
    best[1] = min(best[1], time.process_time() - start_cpu)
    return result


def _measure(profile: str, size_mb: float, repeat: int, zero_tail_gb: float) -> tuple[
    float, list[float], list[float], LogRead
]:
    """Size in MB, the reference's and read_log's best (wall, CPU) times, the last read."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train.log"
        size = generate(path, profile, size_mb)
        reference = _reference
        if zero_tail_gb:
            size += int(zero_tail_gb * (1 << 30))
            os.truncate(path, size)
            reference = _raw_reference
        ref = [float("inf")] * 2
        best = [float("inf")] * 2
        read = None
        for _ in range(repeat):  # interleaved, so that load changes hit both alike
            _timed(lambda: reference(path), ref)
            read = _timed(lambda: read_log(str(path)), best)
        assert isinstance(read, LogRead)
        return size / 1e6, ref, best, read


def _table(size_mb: float, repeat: int) -> None:
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| profile | read_log (CPU) | reference (CPU) | ratio |")
    print("|---|---|---|---|")
    for profile in PROFILES:
        mb, ref, best, _ = _measure(profile, size_mb, repeat, 0.0)
        print(f"| {profile} | {mb / best[1]:.1f} MB/s | {mb / ref[1]:.0f} MB/s | "
              f"{best[1] / ref[1]:.1f}x |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100.0)
    parser.add_argument("--profile", choices=[*sorted(PROFILES), "all"], default="mixed")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--zero-tail-gb", type=float, default=0.0)
    args = parser.parse_args()
    if args.profile == "all":
        _table(args.size_mb, args.repeat)
        return
    mb, ref, best, read = _measure(args.profile, args.size_mb, args.repeat, args.zero_tail_gb)
    print(f"log: {mb:.1f} MB, profile {args.profile}, NUL tail {args.zero_tail_gb:g} GiB")
    (ref_wall, ref_cpu), (wall, cpu) = ref, best
    points = sum(len(s) for s in read.series)
    print(f"{'':36s} {'wall':>16s}  {'CPU (this process)':>20s}")
    for label, w, c in (
        ("reference (read in chunks)" if args.zero_tail_gb else
         "reference (decode + iterate lines)", ref_wall, ref_cpu),
        ("read_log", wall, cpu),
    ):
        print(f"{label:36s} {w:6.2f} s {mb / w:6.1f} MB/s  {c:6.2f} s {mb / c:7.1f} MB/s")
    print(f"ratio read_log / reference: wall {wall / ref_wall:.1f}x, CPU {cpu / ref_cpu:.1f}x")
    print(
        f"found {len(read.series)} series, {points} points, {len(read.events)} events, "
        f"framework {read.framework} ({read.confidence})"
    )


if __name__ == "__main__":
    main()
