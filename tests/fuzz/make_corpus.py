"""Write the seed corpus: ``python -m tests.fuzz.make_corpus`` from the project root.

Each fuzz target module ``tests/fuzz/test_fuzz_<target>.py`` has a ``seeds()`` function that
returns ``{file name: bytes}``, made with the real writers; this writes them into
``tests/fuzz/corpus/<target>/``. Files a fuzz run found (``found-*``) are left alone.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
TARGETS = ("tfrecord", "logs", "checkpoints", "safetensors")


def corpus_files(target: str) -> list[str]:
    """The committed corpus files of one target, sorted."""
    folder = os.path.join(CORPUS, target)
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                  if not f.startswith(".") and f != "README.md")


def flipped_and_cut(data: Any, raw: bytes) -> bytes:
    """``raw`` with up to three bytes overwritten and then cut at a point, drawn from
    Hypothesis' ``data``: what a flipped bit and a killed writer leave of a corpus file."""
    out = bytearray(raw)
    for _ in range(data.draw(st.integers(0, 3))):
        if out:
            out[data.draw(st.integers(0, len(out) - 1))] = data.draw(st.integers(0, 255))
    return bytes(out[: data.draw(st.integers(0, len(out)))])


def main() -> int:
    for target in TARGETS:
        module = importlib.import_module(f"tests.fuzz.test_fuzz_{target}")
        folder = os.path.join(CORPUS, target)
        os.makedirs(folder, exist_ok=True)
        for name, data in sorted(module.seeds().items()):
            with open(os.path.join(folder, name), "wb") as fh:
                fh.write(data)
        print(f"{target}: {len(corpus_files(target))} files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
