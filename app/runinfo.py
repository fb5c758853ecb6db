"""What the Run page and the checkpoints' bookkeeping show: plain rows, no Streamlit.

A run is one training as discovery grouped it (:class:`analyzer.model.RunLayout`): its
segments (a restart's ``version_1``), its files by role, the framework layouts recognised;
beside it the framework metadata read (:class:`analyzer.model.metadata.RunMetadata`) and,
per checkpoint, what the trainer saved about itself (:class:`CheckpointMeta`). This module
only reshapes those records; the words for a file are its path relative to the run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from analyzer.ingest import storage
from analyzer.model import Location, Run
from analyzer.model.metadata import SETTING_NAMES, MetadataFile, MetaValue
from analyzer.wording import alignment_words

if TYPE_CHECKING:
    from analyzer.model.checkpoints import CheckpointHistory, CheckpointScan

ROLE_ORDER = ("events", "log", "checkpoint", "metadata", "capture", "env", "listed")
ROLE_WORDS = {
    "events": "event file", "log": "log", "checkpoint": "checkpoint",
    "metadata": "metadata", "capture": "capture", "env": "environment",
    "listed": "listed, not read",
}
_NOUNS = {"events": "event file", "metadata": "metadata file", "env": "env.json",
          "listed": "file listed"}


def _count(n: int, role: str) -> str:
    noun = _NOUNS.get(role, role)
    if n == 1 or role == "env":
        return f"{n} {noun}"
    return f"{n} {noun.replace('file', 'files')}" if "file" in noun else f"{n} {noun}s"
KEY_SETTINGS = ("learning_rate", "warmup_steps", "warmup_ratio", "precision", "fp16", "bf16",
                "max_grad_norm", "logging_steps", "gradient_accumulation_steps", "seed")
"""The settings a user looks for first when a training diverged."""


def rel(path: str, root: str) -> str:
    """``path`` relative to the run's folder, unless it lies outside it."""
    try:
        out = storage.relative(path, root)  # a URL's too
    except ValueError:
        return path
    return path if out.startswith("..") else out


def value_text(value: MetaValue | float) -> str:
    """A setting as a cell: NaN and Inf spelled out, booleans as words, floats short."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "+inf" if value > 0 else "-inf"
        return f"{value:.6g}"
    return str(value)


def layout_text(run: Run) -> str:
    """The run's grouping in a few words: ``lightning: 2 segments (version_0, version_1)``."""
    layout = run.layout
    if layout is None:
        return ""
    kinds = ", ".join(layout.layouts) or "plain folder"
    if not layout.segments:
        return kinds
    labels = [os.path.basename(s.label) or s.label for s in layout.segments]
    shown = ", ".join(labels[:4]) + (", ..." if len(labels) > 4 else "")
    n = len(labels)
    return f"{kinds}: {n} segment{'' if n == 1 else 's'} ({shown})"


def segment_rows(run: Run) -> list[dict[str, object]]:
    """One row per segment, in the order written, with its files counted by role."""
    if run.layout is None:
        return []
    rows: list[dict[str, object]] = []
    for k, seg in enumerate(run.layout.segments):
        mine = [f for f in run.layout.files if f.segment == k]
        counts = {r: sum(1 for f in mine if f.role == r) for r in ROLE_ORDER}
        written = ("side by side with the others" if seg.parallel else
                   "first" if k == 0 else "after the one before (a restart)")
        rows.append({"#": k, "segment": seg.label, "written": written,
                     "files": ", ".join(_count(n, r) for r, n in counts.items() if n)})
    return rows


def file_rows(run: Run) -> list[dict[str, object]]:
    """Every file of the run by role (the roles in reading order), with its segment."""
    if run.layout is None:
        return [{"role": "file", "file": rel(f, run.path), "segment": ""} for f in run.files]
    labels = [s.label for s in run.layout.segments]
    order = {r: i for i, r in enumerate(ROLE_ORDER)}
    files = sorted(run.layout.files, key=lambda f: order.get(f.role, len(order)))
    return [{"role": ROLE_WORDS.get(f.role, f.role), "file": rel(f.path, run.path),
             "segment": labels[f.segment] if f.segment is not None else "(none)"}
            for f in files]


def setting_rows(run: Run) -> list[dict[str, object]]:
    """The training settings resolved over the metadata, each with the file and key it
    came from; the ones a diverging run is usually asked about first."""
    meta = run.metadata
    if meta is None:
        return []
    names = [n for n in SETTING_NAMES if n in meta.settings]
    names += sorted(n for n in meta.settings if n not in SETTING_NAMES)
    names.sort(key=lambda n: n not in KEY_SETTINGS)
    return [{"setting": n, "value": value_text(meta.settings[n].value),
             "from": rel(meta.settings[n].source, run.path), "key": meta.settings[n].key}
            for n in names]


def missing_settings(run: Run) -> list[str]:
    """The key settings no metadata file gave."""
    have = run.metadata.settings if run.metadata is not None else {}
    return [n for n in KEY_SETTINGS if n not in have]


def metadata_rows(run: Run) -> list[dict[str, object]]:
    """Each metadata file read: what it is, how far it was read, and its read issues."""
    meta = run.metadata
    if meta is None:
        return []
    issues = [*meta.issues, *run.issues]
    rows: list[dict[str, object]] = []
    for f in meta.files:
        said = sorted({f"{_at(i.location)}{i.kind}: {i.message}" for i in issues
                       if i.location.file == f.path})
        rows.append({"file": rel(f.path, run.path), "kind": f.kind, "framework": f.framework,
                     "status": f.status, "fields": len(f.fields), "issues": "; ".join(said)})
    return rows


def _at(loc: Location) -> str:
    if loc.line is not None:
        return f"line {loc.line}: "
    return f"byte {loc.offset}: " if loc.offset is not None else ""


def placement_lines(run: Run, source: str) -> list[str]:
    """How each numbering of one log was placed (a file may hold several: a Trainer's
    records beside DeepSpeed's counter), the one with the most points first."""
    mine = [a for a in run.alignments if a.source == source]
    if len(mine) == 1:
        return [f"steps {alignment_words(mine[0])}"]
    return [f"{a.axis.label} lines: {alignment_words(a)}" for a in mine]


def _beside(scan: CheckpointScan, run: Run | None) -> list[MetadataFile]:
    """The metadata files read from the save's own folder."""
    if run is None or run.metadata is None:
        return []
    folder = os.path.dirname(scan.path)
    return [f for f in run.metadata.files if os.path.dirname(f.path) == folder]


def global_step(scan: CheckpointScan, run: Run | None = None) -> int | None:
    """The trainer's global step at the save, as the file or the ``trainer_state.json``
    beside it counts it."""
    if scan.meta is not None and scan.meta.global_step is not None:
        return scan.meta.global_step
    for f in _beside(scan, run):
        value = f.fields.get("global_step")
        if f.kind == "trainer_state" and isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def saved_by(scan: CheckpointScan, run: Run | None = None) -> str:
    """Who wrote a save, as it says (``lightning 2.6.6``), else as the metadata files in
    its folder say (a Trainer's ``checkpoint-N/config.json``: ``transformers 5.24.0``);
    empty when neither does."""
    meta = scan.meta
    if meta is not None and meta.framework is not None:
        return f"{meta.framework} {meta.framework_version}" if meta.framework_version \
            else meta.framework
    beside = [f for f in _beside(scan, run) if f.framework != "torch"]
    for f in beside:
        version = f.fields.get(f"{f.framework}_version")
        if isinstance(version, str):
            return f"{f.framework} {version}"
    return beside[0].framework if beside else ""


SAVE_OPTIONAL = ("loss scale", "saved by", "global step", "epoch", "step from")
"""Columns of :func:`save_rows` that a page may leave out when no save has a value."""


def save_rows(history: CheckpointHistory, labels: Sequence[str],
              run: Run) -> list[dict[str, object]]:
    """One row per save: its step, file, evidence and who saved it at which step."""
    rows: list[dict[str, object]] = []
    for label, save, scan in zip(labels, history.saves, history.scans, strict=False):
        meta = scan.meta
        rows.append({
            "save": label, "step": save.step, "file": rel(save.path, run.path),
            "non-finite tensors": save.nonfinite_tensors,
            "bookkeeping non-finite": len(scan.nonfinite_metadata),
            "loss scale": save.scale, "saved by": saved_by(scan, run),
            "global step": global_step(scan, run),
            "epoch": meta.epoch if meta is not None else None,
            "step from": scan.step_source or ""})
    return rows


def bookkeeping_rows(history: CheckpointHistory,
                     labels: Sequence[str]) -> list[dict[str, object]]:
    """The trainer's own state in each save (callbacks, loop counters): not evidence. A
    callback's infinite ``kth_value`` or ``best_score`` is how it starts, not a failure."""
    rows: list[dict[str, object]] = []
    for label, scan in zip(labels, history.scans, strict=False):
        if scan.meta is None:
            continue
        for cb in scan.meta.callbacks:
            values = ", ".join(f"{k}={value_text(v)}" for k, v in cb.values.items()
                               if not k.endswith(("_path", "dirpath")))
            rows.append({"save": label, "state": cb.callback,
                         "monitor": cb.monitor or "(none)", "values": values})
    return rows


def nonfinite_bookkeeping(history: CheckpointHistory) -> list[str]:
    """Names of bookkeeping entries that hold Inf or NaN, with their role, once each."""
    seen: dict[str, None] = {}
    for scan in history.scans:
        callbacks = scan.meta.callbacks if scan.meta is not None else ()
        for t in scan.nonfinite_metadata:
            name = t.name
            for cb in callbacks:  # Lightning's state key repeats the callback's arguments
                name = name.replace(f"callbacks.{cb.key}", cb.callback)
            seen[f"{name} ({t.role})"] = None
    return list(seen)
