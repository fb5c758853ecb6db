"""Start-up cost of the command line, as ratios to the bare interpreter timed in the same run.

Timed, best of ``--repeat`` runs each, interleaved so that a change of load hits every
command alike:

* ``python -c pass``: the interpreter alone, the reference;
* ``forensics --help``;
* ``forensics analyze RUN --no-replay`` on a copy of ``sample_runs/nan_in_batch`` without
  its capture folder (its checkpoints hold Adam's moments);
* the same on a small run written here by the real writers: a log, a ``torch.save``
  checkpoint with SGD's momentum and a safetensors checkpoint holding a NaN.

Each line also says which of torch, pandas and scipy the command imported. The copies
live in a fresh temporary folder, deleted at the end. Compiled bytecode is kept in that
folder (``PYTHONPYCACHEPREFIX``), as an installed package has it, after one untimed run
of each command; ``--no-bytecode`` times every run compiling the sources instead (as
under ``PYTHONDONTWRITEBYTECODE``).

Usage: ``python bench/startup.py [--repeat 5] [--no-bytecode]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "pandas", "scipy", "streamlit")
_PROBE = (
    "import sys\n"
    "from analyzer.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit:\n"
    "    pass\n"
    f"print('heavy:', [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)\n"
)


def _small_run(folder: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    run = folder / "written"
    (run / "checkpoints").mkdir(parents=True)
    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 64)).sum().backward()
    optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 5},
               run / "checkpoints" / "step_5.pt")
    save_file({"weight": torch.randn(32, 64), "bias": torch.full((32,), float("nan"))},
              str(run / "checkpoints" / "step_9.safetensors"))
    lines = [f"step {i} loss {1 / (i + 1):.4f}" for i in range(8)] + ["step 8 loss nan"]
    (run / "train.log").write_text("\n".join(lines) + "\n")
    return run


def _sample_copy(folder: Path) -> Path:
    run = folder / "nan_in_batch"
    shutil.copytree(ROOT / "sample_runs" / "nan_in_batch", run,
                    ignore=shutil.ignore_patterns("capture"))
    return run


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    seconds = time.perf_counter() - start
    heavy = next((line for line in done.stderr.splitlines() if line.startswith("heavy:")), "")
    return seconds, heavy.removeprefix("heavy:").strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-bytecode", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if args.no_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(folder / "bytecode")
    try:
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "forensics --help": [sys.executable, "-c", _PROBE, "--help"],
            "analyze nan_in_batch copy, no capture": [
                sys.executable, "-c", _PROBE, "analyze", str(_sample_copy(folder)),
                "--no-replay"],
            "analyze small written run": [
                sys.executable, "-c", _PROBE, "analyze", str(_small_run(folder)),
                "--no-replay"],
        }
        best: dict[str, float] = {}
        heavy: dict[str, str] = {}
        for argv in commands.values():
            _time(argv, env)  # untimed: compiles the bytecode (or warms the page cache)
        for _ in range(args.repeat):
            for name, argv in commands.items():
                seconds, loaded = _time(argv, env)
                best[name] = min(best.get(name, seconds), seconds)
                heavy[name] = loaded
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; bytecode "
          f"{'compiled every run' if args.no_bytecode else 'cached'}")
    print(f"| command | best of {args.repeat} | / python -c pass | imported |")
    print("|---|---|---|---|")
    bare = best["python -c pass"]
    for name, seconds in best.items():
        print(f"| {name} | {seconds:.3f} s | {seconds / bare:.1f} | {heavy[name] or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
