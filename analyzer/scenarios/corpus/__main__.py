"""Generate the corpus: ``python -m analyzer.scenarios.corpus OUT_DIR [--only NAME ...]``."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time


def generate(out_dir: str, names: list[str] | None = None, quiet: bool = True) -> list[str]:
    """Train the chosen cases (all by default) into ``out_dir``; return their names."""
    import warnings

    import torch

    from analyzer.scenarios.corpus import CASES, SPLIT
    from analyzer.scenarios.corpus.run import run_case, write_info

    chosen = [c for c in CASES if names is None or c.name in names]
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(out_dir, exist_ok=True)
    for case in chosen:
        started = time.perf_counter()
        shutil.rmtree(os.path.join(out_dir, case.name), ignore_errors=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcome = run_case(case, out_dir)
        write_info(case, out_dir, outcome, SPLIT[case.name])
        if not quiet:
            first = outcome.first_nonfinite_step
            print(f"{case.name:30s} {SPLIT[case.name]:8s} {case.intended:28s} "
                  f"steps={outcome.steps_run:5d} first_nonfinite="
                  f"{first if first is not None else '-':>5} "
                  f"({time.perf_counter() - started:.1f}s)", flush=True)
    return [c.name for c in chosen]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analyzer.scenarios.corpus",
                                     description=__doc__)
    parser.add_argument("out_dir")
    parser.add_argument("--only", nargs="+", metavar="NAME")
    args = parser.parse_args(argv)
    from analyzer.scenarios.corpus import CASES

    unknown = set(args.only or []) - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    started = time.perf_counter()
    done = generate(args.out_dir, args.only, quiet=False)
    print(f"{len(done)} runs in {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
