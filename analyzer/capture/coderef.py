"""Reading a capture's ``"code"`` record, and what a replay runs of a training script.

The record is written by :mod:`analyzer.capture.code` on the training machine; here it is
read from an analysed folder, written by anyone: whatever is malformed is treated as
absent. :func:`top_level_code` is what a replay runs of a training script. This module
imports neither torch nor :mod:`analyzer.trust` (which reads records through it).
"""

from __future__ import annotations

import ast
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import CodeType

SAVED_MAIN = "source/__main__.py"
"""Where, inside a capture's step folder, the training script is saved."""

SOURCE_LIMIT = 8 * 2**20
"""The largest script or module file hashed or saved; a bigger one is not code to replay."""

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class RecordedFile:
    """One file of the record: where it was, the import root it came from, its hash."""

    file: str
    root: str | None
    sha256: str | None


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


# --- the reading side (a record from an analysed folder) ---------------------------------


def _file_entry(value: object) -> RecordedFile | None:
    if not isinstance(value, Mapping):
        return None
    file, root, digest = value.get("file"), value.get("root"), value.get("sha256")
    if not _absolute(file):
        return None
    assert isinstance(file, str)
    return RecordedFile(os.path.normpath(file),
                        os.path.normpath(root) if _absolute(root) and isinstance(root, str)
                        else None,
                        digest if is_sha256(digest) and isinstance(digest, str) else None)


def _absolute(value: object) -> bool:
    return isinstance(value, str) and "\x00" not in value and os.path.isabs(value)


def recorded_modules(code: object) -> dict[str, RecordedFile]:
    """The record's modules by dotted name (the well-formed entries only)."""
    modules = code.get("modules") if isinstance(code, Mapping) else None
    if not isinstance(modules, Mapping):
        return {}
    out = {}
    for name, value in modules.items():
        entry = _file_entry(value)
        if isinstance(name, str) and entry is not None:
            out[name] = entry
    return out


def recorded_main(code: object) -> RecordedFile | None:
    """The record's training script, when it has a well-formed one."""
    return _file_entry(code.get("main")) if isinstance(code, Mapping) else None


def recorded_roots(code: object) -> list[str]:
    entries = [*recorded_modules(code).values(), recorded_main(code)]
    return list(dict.fromkeys(e.root for e in entries if e is not None and e.root))


def recorded_hashes(code: object) -> list[str]:
    """The hashes of the user's own code: the script's, and those of modules with a root
    (not the standard library's or site-packages')."""
    own = [e for e in recorded_modules(code).values() if e.root]
    entries = [*own, recorded_main(code)]
    return list(dict.fromkeys(e.sha256 for e in entries if e is not None and e.sha256))


# --- what a replay runs of a training script --------------------------------------------


def _trains(node: ast.stmt) -> bool:
    """Whether a top-level statement is one a replay skips: it would run the training."""
    if isinstance(node, ast.Expr):  # main(), trainer.fit(model), sys.exit(main()), ...
        return not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str))
    return isinstance(node, ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith
                      | ast.Raise)


def top_level_code(source: bytes, filename: str) -> CodeType:
    """The training script's top level less the statements that would train.

    Kept, and run: imports, definitions (functions, classes, decorators), assignments,
    ``if`` / ``try`` / ``match`` blocks and docstrings. Skipped: every other expression
    statement (a call such as ``main()`` or ``trainer.fit(model)``, wherever it appears
    at the top level) and top-level ``for``, ``while``, ``with`` and ``raise`` statements.
    The replay runs it under a private module name, so an
    ``if __name__ == "__main__":`` block is kept but its body does not run. An assignment
    whose value trains (``history = train()``) would still run: such a script needs the
    guard. Raises SyntaxError for a file that is not Python.
    """
    tree = ast.parse(source, filename)
    tree.body = [node for node in tree.body if not _trains(node)]
    return compile(tree, filename, "exec", dont_inherit=True)
