"""What the pages show, computed from the analyzer's records: plain values, no Streamlit.

The data module calls the analyzer and caches; this module only reshapes records into
rows, curves and grids, so that it can be tested without a running app.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from analyzer.ingest import storage
from analyzer.ingest.tb import is_event_file
from analyzer.model import Event, Incident, Location, Run, RunResult, Series
from analyzer.tags import TagRole, layer_from_tag, role
from analyzer.wording import (
    alignment_words,
    step_words,
)

if TYPE_CHECKING:
    from analyzer.model.checkpoints import SaveRef

FloatArray = npt.NDArray[np.float64]
TIMELINE_ROLES = (TagRole.LOSS, TagRole.GRAD_NORM, TagRole.LEARNING_RATE, TagRole.LOSS_SCALE)


@dataclass(frozen=True)
class TagRoles:
    """What each tag measures (:func:`analyzer.tags.role`) and the layer a per-layer tag
    names."""

    roles: Mapping[str, TagRole]
    layers: Mapping[str, str]

    def tags(self, role: TagRole) -> list[str]:
        return sorted(t for t, r in self.roles.items() if r is role)


def tag_roles(tags: Sequence[str]) -> TagRoles:
    roles = {t: role(t) for t in tags}
    layers = {t: layer for t in tags if (layer := layer_from_tag(t)) is not None}
    return TagRoles({t: r for t, r in roles.items() if r is not TagRole.OTHER}, layers)


@dataclass(frozen=True)
class Growth:
    """The exponential run-up of a curve before the failure."""

    tag: str
    onset_step: int
    decades: float
    doubling_steps: float


GROWTH_RULE = "exploding-gradients"
"""The rule whose evidence dates the run-up of the gradient norm (else the loss)."""


def growth_of(result: RunResult) -> Growth | None:
    """The exponential run-up to the failure, as the exploding-gradients finding's evidence
    carries it: its tag, onset, growth factor and doubling time."""
    for finding in result.findings:
        if finding.name != GROWTH_RULE:
            continue
        for e in finding.evidence:
            if (e.subject is not None and e.onset is not None and e.value is not None
                    and e.ratio is not None and e.ratio > 0):
                return Growth(e.subject, e.onset, math.log10(e.ratio), e.value)
    return None


def save_labels(saves: Sequence[SaveRef]) -> list[str]:
    """One distinct column label per save: ``step 10``, with the file name where two saves
    share a step (Lightning's ``last.ckpt`` beside ``epoch=0-step=10.ckpt``), and a number
    where even that repeats."""
    base = [f"step {s.step}" if s.step is not None else os.path.basename(s.path) for s in saves]
    repeated = {b for b in base if base.count(b) > 1}
    labels = [f"{b} ({os.path.basename(s.path)})" if b in repeated and s.step is not None else b
              for b, s in zip(base, saves, strict=True)]
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def placements(run: Run) -> list[tuple[str, str]]:
    """(file name, how its steps were placed) for each source that is not an event file,
    once per numbering its lines are on (named by its word where a file has several)."""
    count: dict[str, int] = {}
    for a in run.alignments:
        count[a.source] = count.get(a.source, 0) + 1
    return [(os.path.basename(a.source) + (f" ({a.axis.label} lines)" if count[a.source] > 1
                                           else ""), alignment_words(a))
            for a in run.alignments]


def placement_text(run: Run) -> str:
    return "; ".join(f"{name}: {words}" for name, words in placements(run))


@dataclass(frozen=True)
class Curve:
    """One tag of one source file, in step order, with its non-finite points apart."""

    label: str
    tag: str
    source: str
    steps: npt.NDArray[np.int64]
    values: FloatArray
    axis: str = "step"
    """What ``steps`` count: ``step`` on the run's global step, else the source's own word."""

    @property
    def bad(self) -> npt.NDArray[np.bool_]:
        return np.asarray(~np.isfinite(self.values), dtype=bool)


def source_name(path: str) -> str:
    """A short name for a source file: ``events`` for event files, else the file name."""
    name = os.path.basename(path)
    return "events" if is_event_file(name) else name


def where(loc: Location | None, run_path: str) -> str:
    """A location with its file relative to the run's folder."""
    if loc is None:
        return ""
    try:
        rel = storage.relative(loc.file, run_path)  # a URL's too
    except ValueError:
        rel = loc.file
    return str(Location(loc.file if rel.startswith("..") else rel, loc.offset, loc.line))


def _placed(run: Run) -> list[Series]:
    """The series on the run's global step (every aligned source's)."""
    return [s for s in run.series if run.is_aligned(s.source, s.axis)]


def curves(run: Run, tags: list[str]) -> list[Curve]:
    """Every series of these tags on the run's global step, one curve per source file,
    labelled by tag and file. A source not placed on the global step is left out: its
    numbers are its own (:func:`own_panels`)."""
    out = []
    placed = _placed(run)
    many = len({s.source for s in placed if s.tag in tags}) > 1
    for s in placed:
        if s.tag not in tags or not len(s):
            continue
        order = np.argsort(s.steps, kind="stable")
        label = f"{s.tag} ({source_name(s.source)})" if many else s.tag
        out.append(Curve(label, s.tag, s.source, s.steps[order], s.values[order]))
    return out


@dataclass(frozen=True)
class OwnPanel:
    """A source whose steps could not be placed on the run's global step, drawn over its own
    numbering: ``label`` is its word for the number (``record``), ``placed`` says why."""

    source: str
    label: str
    placed: str
    curves: list[Curve]
    first: Incident | None = None
    """The first non-finite value the locator found in this source."""

    @property
    def name(self) -> str:
        return source_name(self.source)


def own_panels(result: RunResult, tags: list[str]) -> list[OwnPanel]:
    """One panel per unaligned source that logged any of ``tags``."""
    run = result.run
    out = []
    for a in run.alignments:
        if a.aligned:
            continue
        mine = [s for s in run.series if s.source == a.source and s.tag in tags and len(s)]
        if not mine:
            continue
        drawn = []
        for s in mine:
            order = np.argsort(s.steps, kind="stable")
            drawn.append(Curve(s.tag, s.tag, s.source, s.steps[order], s.values[order],
                               a.axis.label))
        seen = [i for i in result.tag_incidents
                if i.location.file == a.source and i.step is not None]
        first = min(seen, key=lambda i: (i.earliest_step or 0, i.location.line or 0),
                    default=None)
        out.append(OwnPanel(a.source, a.axis.label, alignment_words(a), drawn, first))
    return out


def log_scale(curves_: list[Curve]) -> bool:
    """A log axis when every finite value is positive and they span two decades or more."""
    vals = np.concatenate([c.values[np.isfinite(c.values)] for c in curves_] or [np.zeros(0)])
    if vals.size < 2 or (vals <= 0).any():
        return False
    return bool(vals.max() / vals.min() >= 100.0)


@dataclass(frozen=True)
class Marker:
    """A step worth a mark on the timeline: the failure, a skip, a restart, a save."""

    kind: str
    step: int
    text: str


def event_step(event: Event) -> int | None:
    if event.step is not None:
        return event.step
    after = event.detail.get("after_step")
    return after if isinstance(after, int) else None


def markers(result: RunResult, growth: Growth | None) -> list[Marker]:
    run = result.run
    out = []
    if result.incident is not None and result.incident.aligned:
        inc = result.incident
        if inc.step is not None:
            what = f"{inc.tag} = {inc.kind}" + (" after this step" if inc.after else "")
            out.append(Marker("first non-finite", inc.step, what))
        if inc.last_finite_step is not None:
            out.append(Marker("last finite", inc.last_finite_step, f"{inc.tag} still finite"))
    if growth is not None:
        out.append(Marker("growth onset", growth.onset_step,
                          f"{growth.tag} rose {growth.decades:.1f} decades from here, doubling "
                          f"every {growth.doubling_steps:.3g} steps"))
    out += [Marker("overflow skip", s, "the loss scaler skipped this step")
            for s in result.overflow_skips]
    firsts = _first_steps(run)
    segment = _segment_of(run)
    for e in run.events:
        step = event_step(e) if run.is_aligned(e.location.file, e.axis) else None
        if step is not None and e.kind in ("restart", "error", "min_loss_scale"):
            text = f"{e.message} ({where(e.location, run.path)})"
            if e.kind == "restart" and e.detail.get("reason") == "new_file":
                # The event carries the new file's first record (its file_version, at step
                # 0): the restart is where that file's values begin.
                step = firsts.get(e.location.file, step)
                if e.location.file in segment:
                    text = f"{segment[e.location.file]} begins: {text}"
            out.append(Marker(e.kind.replace("_", " "), step, text))
    if run.checkpoints is not None:
        bad = run.checkpoints.first_nonfinite
        for i, save in enumerate(run.checkpoints.saves):
            if save.step is not None:
                state = "non-finite" if bad is not None and i >= bad else "finite"
                out.append(Marker("checkpoint", save.step,
                                  f"{os.path.basename(save.path)}: {state}"))
    return out


def _first_steps(run: Run) -> dict[str, int]:
    """The lowest step each event file logged a curve at. A tag of one point is left out
    where the file has curves: Lightning writes ``hp_metric`` at step 0 in every version,
    the resumed one included, at setup rather than where the training resumed."""
    curves: dict[str, int] = {}
    points: dict[str, int] = {}
    for s in run.series:
        if len(s) and is_event_file(s.source):
            low = int(s.steps.min())
            held = curves if len(s) > 1 else points
            held[s.source] = min(low, held.get(s.source, low))
    return points | curves


def _segment_of(run: Run) -> dict[str, str]:
    """The segment label of each event file that lies in a segment after the first."""
    if run.layout is None:
        return {}
    labels = [seg.label for seg in run.layout.segments]
    return {f.path: labels[f.segment] for f in run.layout.files
            if f.role == "events" and f.segment is not None and f.segment > 0}


@dataclass(frozen=True)
class Grid:
    """Per-layer values over steps: rows are tags, columns steps."""

    tags: list[str]
    layers: list[str]
    steps: npt.NDArray[np.int64]
    values: FloatArray
    logged: npt.NDArray[np.bool_]
    """True where the tag has a point at that step; the other cells are NaN fillers."""

    @property
    def empty(self) -> bool:
        return not self.tags

    @property
    def nonfinite(self) -> npt.NDArray[np.bool_]:
        return np.asarray(self.logged & ~np.isfinite(self.values), dtype=bool)


def layer_grid(run: Run, tags: list[str], layer_of: Mapping[str, str]) -> Grid:
    """A grid of the last value logged per step of each per-layer tag, NaN where none was."""
    chosen = [s for s in _placed(run) if s.tag in tags and len(s)]
    if not chosen:
        return Grid([], [], np.zeros(0, dtype=np.int64), np.zeros((0, 0)),
                    np.zeros((0, 0), dtype=bool))
    steps = np.unique(np.concatenate([s.steps for s in chosen]))
    order = sorted({s.tag for s in chosen}, key=lambda t: (_first_position(chosen, t), t))
    grid = np.full((len(order), steps.size), np.nan)
    logged = np.zeros(grid.shape, dtype=bool)
    for s in chosen:
        row, cols = order.index(s.tag), np.searchsorted(steps, s.steps)
        grid[row, cols] = s.values
        logged[row, cols] = True
    return Grid(order, [layer_of.get(t, t) for t in order], steps, grid, logged)


def _first_position(series: list[Series], tag: str) -> int:
    """Tags in the order the run logged them, which is usually the order of the model."""
    return min(int(s.positions[0]) for s in series if s.tag == tag)


@dataclass(frozen=True)
class LogHit:
    """The first line of a log that reports a non-finite value."""

    file: str
    line: int
    step: int | None
    what: str
    after: bool = False
    """The line names no step; ``step`` is the last one logged before it."""
    unit: str = "step"
    """``step`` when ``step`` is on the run's global step, else the log's own word for its
    numbers (``record``): the log was not placed on the run's steps."""
    own: str | None = None
    """The log's own number for ``step`` where alignment mapped it (``record 29``)."""
    aligned: bool = True
    """False when the log's numbers could not be placed on the run's steps."""

    @property
    def step_text(self) -> str:
        words = step_words(self.step, self.after, unit=self.unit)
        return f"{words} ({self.own})" if self.own else words

    @property
    def heading(self) -> str:
        """``train.log line 34: step 28 (record 29)``."""
        at = f"{os.path.basename(self.file)} line {self.line}"
        return f"{at}: {self.step_text}" if self.step is not None else at


def own_number(run: Run, source: str, step: int | None) -> str | None:
    """The source's own number for a global ``step`` (``record 29``), where its alignment
    mapped its numbers; None where they are the global step as they stand."""
    placed = run.alignment_of(source)
    if step is None or placed is None or not placed.aligned:
        return None
    label = placed.axis.label
    if (placed.offset, placed.stride, placed.divisor) == (0, 1, 1) and label == "step":
        return None
    own = placed.to_own(step)
    if own is None:
        return None
    return f"{label} {own}" if label != "step" else f"logged as step {own}"


def log_hit(run: Run, file: str, line: int, step: int | None, what: str,
            after: bool = False) -> LogHit:
    """A line of a log, its step worded on the run's global step when the log was placed
    on it, else in the log's own numbers."""
    placed = run.alignment_of(file)
    if placed is not None and not placed.aligned:
        return LogHit(file, line, step, what, after, placed.axis.label, aligned=False)
    return LogHit(file, line, step, what, after, own=own_number(run, file, step))


def log_hits(result: RunResult) -> list[LogHit]:
    """Per log file, its first line that shows a non-finite value: those on the run's global
    step earliest first, then those of logs not placed on it."""
    run = result.run
    hits: dict[str, LogHit] = {}
    for inc in result.tag_incidents:
        loc = inc.location
        if loc.line is None:
            continue
        hit = log_hit(run, loc.file, loc.line, inc.step, f"{inc.tag} = {inc.kind}", inc.after)
        held = hits.get(loc.file)
        if held is None or (hit.line < held.line):
            hits[loc.file] = hit
    for e in run.events:
        if e.kind in ("nonfinite", "error") and e.location.line is not None:
            held = hits.get(e.location.file)
            if held is None or e.location.line < held.line:
                step = event_step(e)
                placed_after = e.step is None and step is not None
                hits[e.location.file] = log_hit(run, e.location.file, e.location.line, step,
                                                e.message, placed_after)
    return sorted(hits.values(),
                  key=lambda h: (not h.aligned, h.step is None, h.step or 0, h.file))


def step_at_line(run: Run, file: str, line: int) -> int | None:
    """The step a log line reports, from the series read out of that line (on the global
    step when the log was placed on it, else the log's own number)."""
    for s in run.series:
        if s.source == file and s.position_unit == "line":
            hit = np.flatnonzero(s.positions == line)
            if hit.size:
                return int(s.steps[hit[0]])
    for e in run.events:
        if e.location.file == file and e.location.line == line:
            return event_step(e)
    return None


def num(value: float | None) -> str:
    """A number for a table cell; NaN and Inf spelled out (a blank cell would hide them)."""
    if value is None:
        return ""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:.6g}"


@dataclass(frozen=True)
class View:
    """What one source logged for one tag at a step, and at the step before."""

    source: str
    tag: str
    before: float | None
    at: float | None
    where: Location | None


def views_at(run: Run, step: int) -> list[View]:
    """Every source's value of every tag at the global ``step`` (and the last one before it);
    a source not placed on the global step has no value there."""
    out = []
    for s in _placed(run):
        at = np.flatnonzero(s.steps == step)
        if not at.size:
            continue
        earlier = np.flatnonzero(s.steps < step)
        before = float(s.values[earlier[-1]]) if earlier.size else None
        i = int(at[-1])
        out.append(View(source_name(s.source), s.tag, before, float(s.values[i]),
                        s.location(i)))
    out.sort(key=lambda v: (math.isfinite(v.at if v.at is not None else 0.0), v.source, v.tag))
    return out


def view_rows(seen: list[View], run_path: str, step: int) -> list[dict[str, str]]:
    """Rows of the table that lines the sources up at one step."""
    return [{"source": v.source, "tag": v.tag, "step before": num(v.before),
             f"step {step}": num(v.at), "where": where(v.where, run_path)} for v in seen]


_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
"""A terminal's control sequence (tqdm moves the cursor up with ``ESC[A``)."""
_NONFINITE = re.compile(r"(?<![\w.])[-+]?(nan|inf|infinity)(?![\w])", re.IGNORECASE)
FRAMES_SHOWN = 4


def frames(text: str, marked: bool = False) -> list[str]:
    """A log line as a terminal would show it, one row per frame a bare ``\r`` starts (a
    progress bar redrawn, a record printed over it), control sequences and blank frames
    left out. A context line shows its last frame, where the terminal leaves it; the marked
    line also the frames that name a NaN or Inf, which a later frame drew over."""
    shown = [f for f in (_ESCAPE.sub("", part).rstrip() for part in text.split("\r"))
             if f.strip()]
    if len(shown) <= 1:
        return shown or [""]
    keep = [f for f in shown[:-1] if marked and _NONFINITE.search(f)][:FRAMES_SHOWN]
    over = len(shown) - 1 - len(keep)
    note = [f"({over} earlier frame{'' if over == 1 else 's'} of this line drawn over)"] \
        if over else []
    return [*note, *keep, shown[-1]]
