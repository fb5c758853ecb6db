"""Regenerate the sample runs: ``python -m analyzer.scenarios OUT_DIR [--only NAME ...]``."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analyzer.scenarios", description=__doc__)
    parser.add_argument("out_dir", help="folder that receives one run folder per scenario")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="scenarios to run")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)

    import torch

    from analyzer.scenarios.catalog import SCENARIOS, by_name
    from analyzer.scenarios.harness import run, write_description, write_index

    if args.list:
        for sc in SCENARIOS:
            print(f"{sc.name:28s} {sc.title}")
        return 0
    table = by_name()
    unknown = [n for n in args.only or [] if n not in table]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}; see --list")
    chosen = [table[n] for n in args.only] if args.only else list(SCENARIOS)
    # One thread: the same summation order, hence the same failing step, on every machine.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out_dir, exist_ok=True)
    for sc in chosen:
        started = time.perf_counter()
        shutil.rmtree(os.path.join(args.out_dir, sc.name), ignore_errors=True)
        outcome = run(sc, args.out_dir)
        write_description(sc, args.out_dir, outcome)
        first = outcome.first_nonfinite_step
        print(
            f"{sc.name:28s} steps={outcome.steps_run:4d} "
            f"first_nonfinite={first if first is not None else '-':>5} "
            f"tag={outcome.first_nonfinite_tag or '-'} skips={len(outcome.skipped_steps)} "
            f"({time.perf_counter() - started:.1f}s)",
            flush=True,
        )
    write_index(args.out_dir, SCENARIOS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
