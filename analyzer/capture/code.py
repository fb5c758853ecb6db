"""Where a run's code lives: the ``"code"`` record of a capture's meta.json.

A replay rebuilds the model by calling the factories a capture names. So that it finds
them with no ``--import-path``, the recorder records, when it starts, where each
factory's module came from::

    "code": {"modules": {"mypkg.models": {"file": "/proj/mypkg/models.py",
                                          "root": "/proj", "sha256": "..."}},
             "main": {"file": "/proj/train.py", "root": "/proj", "sha256": "...",
                      "saved": "source/__main__.py"}}          # or null

- ``root`` is the ``sys.path`` entry the module was imported from: the folder below which
  the module's dotted name spells its file (``/proj`` for ``mypkg.models`` in
  ``/proj/mypkg/models.py``). It is null for modules of the standard library,
  site-packages and this tool, which a replay never imports factories from.
- ``sha256`` is the hash of the file's bytes when the recorder started, so that a replay
  can say the code changed since.
- ``main`` is the training script, for factories defined in it (``python train.py``, or
  ``python -m pkg.train``: their module is ``__main__``). Its bytes are read once, when the
  recorder starts (the code that ran, not the file as it may be edited later), kept in
  memory and written with the capture as ``source/__main__.py``.

On the training machine :func:`register_trust` adds the roots to the user's trusted
folders and the hashes to the trusted sources of :mod:`analyzer.trust`, so that the
common case replays with no flag. Nothing on the record side raises into training.

The reading side (:func:`recorded_modules`, :func:`recorded_main`, :func:`top_level_code`:
what a replay runs of a training script) is :mod:`analyzer.capture.coderef`'s, which
:mod:`analyzer.trust` reads records through; it is re-exported here. Nothing here imports
torch.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from analyzer.capture.coderef import (
    SAVED_MAIN,
    SOURCE_LIMIT,
    RecordedFile,
    is_sha256,
    recorded_hashes,
    recorded_main,
    recorded_modules,
    recorded_roots,
    sha256_of,
    top_level_code,
)

_SOURCES: dict[str, bytes] = {}
"""The training script's bytes by their sha256, as read when recorded."""

__all__ = ["SAVED_MAIN", "SOURCE_LIMIT", "RecordedFile", "code_record", "is_sha256",
           "main_source", "recorded_hashes", "recorded_main", "recorded_modules",
           "recorded_roots", "register_trust", "sha256_of", "top_level_code",
           "write_main_source"]


# --- the record side (the training machine) ----------------------------------------------


def code_record(targets: Sequence[str]) -> dict[str, Any]:
    """Where the code of each factory ``"module:attr"`` (or dotted ``module.Class``) lives.

    Modules are looked up in ``sys.modules`` (the recorder has imported them), else found
    without being run. A target that cannot be located is left out; nothing raises.
    """
    modules: dict[str, dict[str, Any]] = {}
    main: dict[str, Any] | None = None
    for target in targets:
        name = _module_name(target)
        if name is None:
            continue
        try:
            if name == "__main__":
                main = main or _main_entry()
            elif name not in modules:
                entry = _module_entry(name)
                if entry is not None:
                    modules[name] = entry
        except Exception:  # a module that cannot be located is only not recorded
            continue
    return {"modules": modules, "main": main}


def main_source(record: Mapping[str, Any]) -> bytes | None:
    """The training script's bytes as read when ``record`` was made, or None."""
    main = record.get("main")
    digest = main.get("sha256") if isinstance(main, Mapping) else None
    return _SOURCES.get(digest) if isinstance(digest, str) else None


def write_main_source(step_folder: str, record: Mapping[str, Any]) -> str | None:
    """Write the training script into ``step_folder/source/__main__.py``; its path, or None
    when the record has no script. OSError propagates, as for any file of the capture."""
    data = main_source(record)
    if data is None:
        return None
    path = os.path.join(step_folder, *SAVED_MAIN.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def register_trust(record: Mapping[str, Any]) -> list[str]:
    """Trust the record's code on this machine: its roots as trusted folders, the hashes
    of the script and of the modules under those roots as trusted sources. The filesystem
    root, the home folder and site-packages are not trusted as folders (a note says so;
    the script's saved copy still replays, by its hash). Never raises; returns notes on
    what was not done."""
    notes: list[str] = []
    try:
        from analyzer import trust
        from analyzer.errors import UsageError

        for root in recorded_roots(record):
            try:
                trust.trust_folder(root)
            except UsageError as exc:
                notes.append(f"code root not trusted: {exc}")
        trust.trust_sources(recorded_hashes(record))
    except Exception as exc:  # the configuration folder may be read-only, full, ...
        notes.append(f"could not record the code as trusted: {type(exc).__name__}: {exc}")
    return notes


def _module_name(target: str) -> str | None:
    if not isinstance(target, str):
        return None
    name = target.partition(":")[0] if ":" in target else target.rpartition(".")[0]
    return name if name and all(p.isidentifier() for p in name.split(".")) else None


def _module_entry(name: str) -> dict[str, Any] | None:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None) if module is not None else None
    if path is None and module is None:
        spec = importlib.util.find_spec(name)
        path = getattr(spec, "origin", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    file = os.path.realpath(path)
    data = _read(file)
    root = None if _not_replay_code(file) else _root_of(name, file)
    return {"file": file, "root": root, "sha256": sha256_of(data) if data is not None else None}


def _main_entry() -> dict[str, Any] | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return None  # an interactive session or a notebook: no script to keep
    file = os.path.realpath(path)
    data = _read(file)
    if data is None:
        return None
    digest = sha256_of(data)
    _SOURCES[digest] = data
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    # python -m pkg.train: the root is the folder above pkg/; python train.py: its folder.
    root = _root_of(name, file) if isinstance(name, str) else os.path.dirname(file)
    if root is not None and _not_replay_code(file):
        root = None
    return {"file": file, "root": root, "sha256": digest, "saved": SAVED_MAIN}


def _read(file: str) -> bytes | None:
    try:
        with open(file, "rb") as fh:
            data = fh.read(SOURCE_LIMIT + 1)
    except OSError:
        return None
    return data if len(data) <= SOURCE_LIMIT else None


def _root_of(name: str, file: str) -> str | None:
    """The folder below which ``name`` spells ``file``, or None when it does not."""
    stem = os.path.basename(file).partition(".")[0]
    head = os.path.dirname(file) if stem == "__init__" else os.path.join(
        os.path.dirname(file), stem)
    for part in reversed(name.split(".")):
        if os.path.basename(head) != part:
            return None
        head = os.path.dirname(head)
    return head


def _not_replay_code(file: str) -> bool:
    from analyzer.trust import is_system, tool_root

    own = os.path.join(tool_root(), "analyzer")
    return is_system(file) or file.startswith(own + os.sep)


