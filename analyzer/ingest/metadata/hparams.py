"""Lightning's ``hparams.yaml``: the hyperparameters a module saved, read as YAML data only.

The loader is PyYAML's safe loader: it builds only mappings, sequences and plain values.
``yaml.dump``, which Lightning uses, writes a tuple as ``!!python/tuple``: that is data,
read as a sequence. Every other tag (``!!python/object``, ``!!python/name``, a custom
``!tag``) would name code or a class: it is never constructed, its key is left out, and the
file's other keys are kept. Issues, by kind:

    too_large    the file is over MAX_BYTES: not parsed (hyperparameters are a few KiB)
    bad_record   a tag that is not plain data, or an integer of more than MAX_INT_DIGITS
                 digits (its line: its key is left out, the rest kept); YAML that does not
                 parse (the line where it stops; no key is kept, since the loader builds
                 the document whole)
    read_limit   the document holds more than MAX_NODES values (aliases repeating one
                 structure count each time): the keys walked before are kept
    unreadable   the file cannot be opened
    not_regular  a FIFO, device or socket named hparams.yaml: not opened
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from analyzer.ingest.metadata import open_failure
from analyzer.ingest.metadata.keys import coerce, every_plain, hparam_setting, plain
from analyzer.ingest.safeio import read_regular
from analyzer.model import IngestIssue, IssueKind, Location, MetaValue

MAX_BYTES = 1 << 20
MAX_NODES = 100_000
MAX_INT_DIGITS = 40
MAX_DEPTH = 32
"""Nested sub-configs walked; keys deeper than this are not looked at."""


@dataclass
class HparamsRead:
    """What one hparams.yaml gave: its keys (dotted path -> value: the recognised ones at
    any depth, every other plain value of the top level and one level below, bounded by
    :data:`~analyzer.ingest.metadata.keys.MAX_FIELDS`) and settings (setting -> (key,
    value)), with the issues met."""

    fields: dict[str, MetaValue] = field(default_factory=dict)
    settings: dict[str, tuple[str, MetaValue]] = field(default_factory=dict)
    issues: list[IngestIssue] = field(default_factory=list)
    parsed: bool = False


class _Refused:
    """What stands for a value whose tag was not constructed."""


_REFUSED = _Refused()


def _loader_class() -> type[yaml.SafeLoader]:
    base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc]
        refused: list[tuple[str, int]]

    def tuple_(loader: Any, node: yaml.Node) -> object:
        return loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode) \
            else _REFUSED

    def other(loader: Any, node: yaml.Node) -> object:
        loader.refused.append((f"tag {_tag(str(node.tag))} is not plain data (it names Python "
                               "code, a class or a custom type): not constructed, its key "
                               "left out", node.start_mark.line + 1))
        return _REFUSED

    def int_(loader: Any, node: yaml.Node) -> object:
        # YAML's int() of a scalar of thousands of digits raises ValueError mid-document.
        if isinstance(node, yaml.ScalarNode) and len(str(node.value)) > MAX_INT_DIGITS:
            loader.refused.append((f"an integer of more than {MAX_INT_DIGITS} digits: not "
                                   "read, its key left out", node.start_mark.line + 1))
            return _REFUSED
        return yaml.SafeLoader.construct_yaml_int(loader, node)

    Loader.add_constructor("tag:yaml.org,2002:python/tuple", tuple_)
    Loader.add_constructor("tag:yaml.org,2002:int", int_)
    Loader.add_constructor(None, other)  # every tag the safe loader does not know
    return Loader


_LOADER = _loader_class()


def _issue(path: str, kind: IssueKind, message: str, line: int | None = None) -> IngestIssue:
    return IngestIssue(Location(path, line=line), kind, message)


def read_hparams(path: str) -> HparamsRead:
    """The recognised hyperparameters of one hparams.yaml; never raises for its content."""
    out = HparamsRead()
    try:
        data = read_regular(path, MAX_BYTES + 1)
    except OSError as exc:  # NotRegularFile included
        out.issues.append(open_failure(path, exc))
        return out
    if len(data) > MAX_BYTES:
        out.issues.append(_issue(path, "too_large", f"over {MAX_BYTES} bytes: hyperparameters "
                                 "are a few KiB, the file was not parsed"))
        return out
    loader = _LOADER(data.decode("utf-8", "replace"))
    loader.refused = []
    try:
        document = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        what = getattr(exc, "problem", None) or type(exc).__name__
        out.issues.append(_issue(path, "bad_record", f"not valid YAML ({what}): no key read",
                                 line))
        return out
    except RecursionError:
        out.issues.append(_issue(path, "bad_record", "YAML nested too deeply to parse: no key "
                                 "read"))
        return out
    finally:
        loader.dispose()
    for message, line in loader.refused[:8]:
        out.issues.append(_issue(path, "bad_record", message, line))
    out.parsed = True
    if not isinstance(document, dict):
        return out
    _collect(path, document, out)
    return out


def _tag(tag: str) -> str:
    """A tag as a message shows it: its first 60 printable characters."""
    shown = "".join(c for c in tag if c.isprintable())[:60]
    return f"'{shown}'"


def _collect(path: str, document: dict[Any, Any], out: HparamsRead) -> None:
    found: dict[str, tuple[int, str, MetaValue]] = {}
    walk = _Walk()
    for keys, leaf in walk.leaves(document):
        value = plain(leaf)
        setting = hparam_setting(keys)
        if setting is None:
            continue
        got = coerce(setting, value)
        dotted = ".".join(keys)
        out.fields[dotted] = got if got is not None else value
        if got is not None and (setting not in found or len(keys) < found[setting][0]):
            found[setting] = (len(keys), dotted, got)
    if walk.exhausted:
        out.issues.append(_issue(path, "read_limit", f"more than {MAX_NODES} values "
                                 "(aliases repeating a structure?): the rest not walked"))
    out.settings = {s: (key, value) for s, (_, key, value) in found.items()}
    every_plain(document, out.fields)


class _Walk:
    """Every plain value below a mapping, breadth first, bounded in depth and in values
    visited: aliases let a small document repeat one mapping a billion times."""

    def __init__(self) -> None:
        self.exhausted = False

    def leaves(self, node: dict[Any, Any]) -> Iterator[tuple[tuple[str, ...], object]]:
        """(key path, value) pairs; a sequence's items are not hyperparameters of their own."""
        level: list[tuple[tuple[str, ...], dict[Any, Any]]] = [((), node)]
        visited = 0
        for _ in range(MAX_DEPTH):
            deeper: list[tuple[tuple[str, ...], dict[Any, Any]]] = []
            for keys, mapping in level:
                for key, value in mapping.items():
                    visited += 1
                    if visited > MAX_NODES:
                        self.exhausted = True
                        return
                    if not isinstance(key, str) or value is _REFUSED:
                        continue
                    if isinstance(value, dict):
                        deeper.append(((*keys, key), value))
                    else:
                        yield (*keys, key), value
            if not deeper:
                return
            level = deeper
