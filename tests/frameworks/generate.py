"""Run generators in this interpreter, each with its console sent to ``<root>/train.log``.

``python -m tests.frameworks.generate OUT NAME...`` writes each run into ``OUT/NAME``. The
console is redirected at the file-descriptor level, as a shell's ``> train.log 2>&1``
would, so progress bars, logging handlers made at import time and tracebacks all land
in the file. A run that dies (``DIES``) leaves its traceback there, as Python would; any
other generator that raises makes the command fail.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from tests.frameworks import hf_runs, lightning_runs, plain_runs

GENERATORS: dict[str, Callable[[Path], Path]] = {
    name[len("make_"):]: getattr(module, name)
    for module in (lightning_runs, hf_runs, plain_runs)
    for name in dir(module) if name.startswith("make_")
}


DIES = frozenset({"lightning_anomaly"})
"""Runs whose training ends with an uncaught exception, as the user's script would."""


def _run_logged(make: Callable[[Path], Path], root: Path) -> BaseException | None:
    root.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(root / "train.log", "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        died: BaseException | None = None
        try:
            make(root)
        except BaseException as exc:  # the run died: Python prints this and exits 1
            traceback.print_exc()
            died = exc
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return died


def main(argv: list[str]) -> int:
    out, names = Path(argv[0]), argv[1:]
    for name in names:
        died = _run_logged(GENERATORS[name], out / name)
        if (died is not None) != (name in DIES):
            print(f"{name}: expected {'a death' if name in DIES else 'no exception'}, "
                  f"got {died!r}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
