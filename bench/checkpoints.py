"""Throughput and peak memory of the checkpoint scan on a generated checkpoint.

Writes a training checkpoint of about ``--size-gb`` (model weights plus Adam's two
moments, one layer holding a NaN) into a fresh temporary folder, scans it in a child
process, and deletes it. Reported, from the same run:

* scan throughput in GB/s, and as a ratio to a plain sequential read of the same file
  (the reference: what the disk and page cache allow);
* peak RSS growth of the scanning process: its peak resident set minus its resident
  set after imports, as a share of the file size (target: under 0.25).

``--many N`` writes N small tensors (64 float32 values each) instead, where the cost per
tensor (pickle, header, bookkeeping) dominates rather than the reading of values.

Each scan is timed three ways per repeat, interleaved: in a process without torch
(``numpy``: numpy reads and reduces, torch is imported only where a result is torch's
own, and that import is then counted), in one that imported torch before (``loaded``:
the same reading, torch's reductions), and with the numpy shortcuts turned off
(``torch``: ``torch.load`` on the meta device and torch reductions, as before them);
medians of ``--repeat`` runs, and the ratios to ``torch``. Peak RSS is the ``numpy``
run's.

Usage: ``python bench/checkpoints.py [--size-gb 2] [--format pt|safetensors] [--many N]
[--repeat 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

_CHILD = r"""
import json, os, resource, sys, time
from analyzer.ingest.checkpoints import scan_checkpoint
from analyzer.ingest.ckpt import leaves, safetensors_file, scan as scan_module

if sys.argv[2] != "numpy":
    import torch  # imported before the baseline so it is not counted as scan memory
if sys.argv[2] == "torch":  # the reading before numpy took over
    scan_module.agrees_without_torch = lambda *args: False
    leaves.np_type = safetensors_file.np_type = lambda name: None

def status(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None

# ru_maxrss keeps the parent's peak across fork and exec, so on Linux the kernel's own
# high-water mark is reset here (clear_refs 5) and read back after the scan.
linux = os.path.exists("/proc/self/clear_refs")
if linux:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
base = status("VmRSS") if linux else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
scan = scan_checkpoint(sys.argv[1])
seconds = time.perf_counter() - start
peak = status("VmHWM") if linux else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({
    "seconds": seconds, "base_kib": base, "peak_kib": peak,
    "tensors": len(scan.tensors), "nonfinite_layers": [l.layer for l in scan.nonfinite_layers],
    "issues": [str(i) for i in scan.issues], "read_mode": scan.read_mode,
    "torch_imported": "torch" in sys.modules,
}))
"""

LAYER = (4096, 4096)


def _write_many(path: str, count: int, fmt: str) -> int:
    import torch

    generator = torch.Generator().manual_seed(0)
    model = {f"blocks.{i // 8}.p{i % 8}.weight": torch.randn(64, generator=generator)
             for i in range(count)}
    model["blocks.0.p0.weight"][3] = float("nan")
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(model, path)
    else:
        torch.save({"model": model, "step": 1000}, path)
    return os.path.getsize(path)


def _write(path: str, size_gb: float, fmt: str) -> int:
    import torch

    per_layer = LAYER[0] * LAYER[1] * 4
    layers = max(1, round(size_gb * 1e9 / (3 * per_layer)))
    generator = torch.Generator().manual_seed(0)
    model = {}
    for i in range(layers):
        model[f"blocks.{i}.mlp.weight"] = torch.randn(LAYER, generator=generator) * 0.02
        model[f"blocks.{i}.mlp.bias"] = torch.zeros(LAYER[0])
    model[f"blocks.{layers // 2}.mlp.weight"][7, 7] = float("nan")
    if fmt == "safetensors":
        from safetensors.torch import save_file

        tensors = dict(model)
        for i in range(layers):
            tensors[f"optimizer.{i}.exp_avg"] = torch.randn(LAYER, generator=generator) * 1e-3
            tensors[f"optimizer.{i}.exp_avg_sq"] = torch.rand(LAYER, generator=generator) * 1e-6
        save_file(tensors, path)
    else:
        state = {}
        for index in range(2 * layers):
            shape = LAYER if index % 2 == 0 else (LAYER[0],)
            state[index] = {
                "step": torch.tensor(1000.0),
                "exp_avg": torch.randn(shape, generator=generator) * 1e-3,
                "exp_avg_sq": torch.rand(shape, generator=generator) * 1e-6,
            }
        groups = [{"params": list(range(2 * layers)), "lr": 1e-4, "eps": 1e-8}]
        checkpoint = {
            "model": model,
            "optimizer": {"state": state, "param_groups": groups},
            "scaler": {
                "scale": 1024.0,
                "growth_factor": 2.0,
                "backoff_factor": 0.5,
                "growth_interval": 2000,
                "_growth_tracker": 0,
            },
            "step": 1000,
        }
        torch.save(checkpoint, path)
    return os.path.getsize(path)


def _read_rate(path: str) -> float:
    buffer = bytearray(16 << 20)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(buffer):
            pass
    return os.path.getsize(path) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--format", choices=("pt", "safetensors"), default="pt")
    parser.add_argument("--many", type=int, default=0, metavar="N",
                        help="N small tensors instead of --size-gb of large ones")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="ckpt-bench-")
    try:
        path = os.path.join(folder, f"bench.{args.format}")
        if args.many:
            size = _write_many(path, args.many, args.format)
        else:
            size = _write(path, args.size_gb, args.format)
        read_rate = _read_rate(path)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        runs: dict[str, list[dict[str, Any]]] = {"numpy": [], "loaded": [], "torch": []}
        for _ in range(args.repeat):
            for mode in runs:
                child = subprocess.run([sys.executable, "-c", _CHILD, path, mode],
                                       capture_output=True, text=True, cwd=root)
                if child.returncode != 0:
                    print(child.stderr, file=sys.stderr)
                    return 1
                runs[mode].append(json.loads(child.stdout))
        by_time = sorted(runs["numpy"], key=lambda r: float(r["seconds"]))
        result = by_time[len(by_time) // 2]
        before = sorted(float(r["seconds"]) for r in runs["torch"])
        before_seconds = before[len(before) // 2]
        loaded = sorted(float(r["seconds"]) for r in runs["loaded"])
        loaded_seconds = loaded[len(loaded) // 2]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    growth = (result["peak_kib"] - result["base_kib"]) * 1024
    rate = size / result["seconds"]
    report = {
        "format": args.format,
        "tensors_written": args.many or None,
        "tensors_per_s": round(result["tensors"] / result["seconds"]) if args.many else None,
        "file_bytes": size,
        "scan_seconds": round(result["seconds"], 3),
        "scan_seconds_torch_path": round(before_seconds, 3),
        "torch_path_over_numpy": round(before_seconds / result["seconds"], 2),
        "scan_seconds_torch_loaded": round(loaded_seconds, 3),
        "torch_path_over_loaded": round(before_seconds / loaded_seconds, 2),
        "numpy_run_imported_torch": result["torch_imported"],
        "scan_gb_per_s": round(rate / 1e9, 3),
        "read_gb_per_s": round(read_rate / 1e9, 3),
        "scan_over_read": round(rate / read_rate, 3),
        "rss_after_imports_mib": round(result["base_kib"] / 1024),
        "rss_peak_mib": round(result["peak_kib"] / 1024),
        "rss_growth_mib": round(growth / 2**20),
        "rss_growth_over_file": round(growth / size, 3),
        "target_met": growth < size / 4,
        "tensors": result["tensors"],
        "nonfinite_layers": result["nonfinite_layers"],
        "read_mode": result["read_mode"],
    }
    print(json.dumps(report, indent=2))
    return 0 if (report["target_met"] or args.many) and report["nonfinite_layers"] else 1


if __name__ == "__main__":
    sys.exit(main())
