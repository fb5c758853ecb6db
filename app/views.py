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

from analyzer.ingest.tb import is_event_file
from analyzer.model import Event, Incident, IngestIssue, Location, Run, RunResult, Series
from analyzer.tags import TagRole, layer_from_tag, role
from analyzer.wording import (
    Place,
    alignment_words,
    incident_step,
    place_words,
    step_words,
)
from app.runinfo import rel

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
    return str(Location(rel(loc.file, run_path), loc.offset, loc.line))


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
        # a log may place some of its numberings and not others: only the series on this
        # alignment's axis are off the run's steps (the others are on the timeline's panels)
        mine = [s for s in run.series if s.source == a.source and s.axis == a.axis
                and s.tag in tags and len(s)]
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


ZEROS_ON_LOG = 0.1
"""The share of exact zeros a log axis may leave off (marked at the panel's bottom edge): a
loss printed to four decimals logs 0.0000 once it is small, and those few zeros must not
flatten the whole curve onto a linear axis."""


def positive_span(curves_: Sequence[Curve]) -> tuple[float | None, float]:
    """How many times over the curves' positive finite values span (max / min), None when
    some finite value is negative or fewer than two are positive; and the share of the
    finite values that are exact zeros."""
    vals = np.concatenate([c.values[np.isfinite(c.values)] for c in curves_] or [np.zeros(0)])
    positive = vals[vals > 0]
    zeros = (vals.size - positive.size) / vals.size if vals.size else 0.0
    if positive.size < 2 or (vals < 0).any():
        return None, zeros
    return float(positive.max() / positive.min()), zeros


def log_scale(curves_: Sequence[Curve]) -> bool:
    """A log axis when no finite value is negative, the positive ones span two decades or
    more, and at most :data:`ZEROS_ON_LOG` of the values are exact zeros."""
    span, zeros = positive_span(curves_)
    return span is not None and span >= 100.0 and zeros <= ZEROS_ON_LOG


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
        for save in run.checkpoints.saves:
            if save.step is not None:
                # each save's own evidence: an optimizer.pt saved beside non-finite weights
                # may hold none (the Layers page's saves table counts the same)
                state = "non-finite" if save.nonfinite_tensors else "finite"
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
    # a log's own non-finite value that no incident points at: the locator keeps one
    # incident per tag, and at a tie of sources it points at the event file
    logs = {log.path for log in run.logs}
    found: dict[str, LogHit] = {}
    for series in run.series:
        if series.source not in logs:
            continue
        bad = np.flatnonzero(~np.isfinite(series.values))
        if not bad.size or series.position_unit != "line":
            continue
        i = int(bad[np.argmin(series.positions[bad])])
        line, step = int(series.positions[i]), int(series.steps[i])
        held = found.get(series.source)
        if series.source not in hits and (held is None or line < held.line):
            value = float(series.values[i])
            kind = num(value)
            benign = (" (at a step the loss scaler skipped: its benign overflow)"
                      if step in result.overflow_skips else "")
            found[series.source] = log_hit(run, series.source, line, step,
                                           f"{series.tag} = {kind}{benign}")
    for e in run.events:
        if e.kind in ("nonfinite", "error") and e.location.line is not None:
            held = hits.get(e.location.file)
            if held is None or e.location.line < held.line:
                step = event_step(e)
                placed_after = e.step is None and step is not None
                hits[e.location.file] = log_hit(run, e.location.file, e.location.line, step,
                                                e.message, placed_after)
    # at one step, a line an incident or event points at comes before one found this way
    # (hf_nan: the console's 'grad_norm': 'nan' before trainer_state.json's NaN)
    ranked = [(h, False) for h in hits.values()]
    ranked += [(h, True) for file, h in found.items() if file not in hits]
    ranked.sort(key=lambda p: (not p[0].aligned, p[0].step is None, p[0].step or 0, p[1],
                               p[0].file))
    return [h for h, _ in ranked]


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


# The timeline's controls (issue 19): a click, the steps shown, smoothing, a flat panel.

def step_of_click(event: object) -> int | None:
    """The step of the point clicked on a timeline chart: ``st.plotly_chart``'s selection
    event (``{"selection": {"points": [{"x": 24, ...}], ...}}``) carries the point's x, which
    is a step on every row of the chart. None when nothing is selected."""
    selection = event.get("selection") if isinstance(event, Mapping) else None
    points = selection.get("points") if isinstance(selection, Mapping) else None
    if not isinstance(points, Sequence) or not points:
        return None
    first = points[0]
    x = first.get("x") if isinstance(first, Mapping) else None
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return round(x)


def ema(values: FloatArray, weight: float) -> FloatArray:
    """TensorBoard's smoothing: an exponential moving average, debiased at the start so the
    first points are not pulled towards 0. Non-finite values are skipped (they keep the
    average where it was) and stay non-finite in the output, where they are marked apart."""
    if weight <= 0:
        return values.copy()
    out = np.full(values.shape, np.nan)
    last, n = 0.0, 0
    for i, v in enumerate(values):
        if not math.isfinite(v):
            out[i] = v
            continue
        last = last * weight + (1 - weight) * float(v)
        n += 1
        out[i] = last / (1 - weight ** n)
    return out


def clip(curve: Curve, lo: int, hi: int) -> Curve:
    """The curve's points with steps in ``[lo, hi]``."""
    keep = (curve.steps >= lo) & (curve.steps <= hi)
    return Curve(curve.label, curve.tag, curve.source, curve.steps[keep], curve.values[keep],
                 curve.axis)


def step_span(panels: Mapping[str, list[Curve]], marks: Sequence[Marker] = (),
              ) -> tuple[int, int] | None:
    """The lowest and highest step any curve of the panels logged or any mark is at (a
    failure found in a checkpoint after an event file's cut end)."""
    steps = [c.steps for cs in panels.values() for c in cs if c.steps.size]
    if not steps:
        return None
    every = np.concatenate([*steps, np.array([m.step for m in marks], dtype=np.int64)])
    return int(every.min()), int(every.max())


def around(span: tuple[int, int], step: int) -> tuple[int, int]:
    """The steps shown "around the failure": a fifth of the run (10 steps at least) before
    ``step`` and a twentieth (3 at least) after, within the run."""
    lo, hi = span
    before, after = max(10, (hi - lo) // 5), max(3, (hi - lo) // 20)
    return max(lo, min(step - before, hi)), min(hi, max(step + after, lo))


def constant(curves_: list[Curve]) -> float | None:
    """The one value every point of these curves holds (a loss scale that never moved),
    allowing float32's rounding between two sources; None when any point differs or is
    non-finite, or there is no point."""
    vals = np.concatenate([c.values for c in curves_] or [np.zeros(0)])
    if not vals.size or not np.isfinite(vals).all():
        return None
    lo, hi = float(vals.min()), float(vals.max())
    if hi - lo > 1e-6 * max(abs(lo), abs(hi)):
        return None
    return float(vals[0])


ENDING_KINDS = frozenset({"truncated", "zero_tail", "read_limit", "absurd_length",
                          "bad_length_crc"})
"""Read issues after which nothing more of the file is read: its record ends there."""


def _step_before(run: Run, loc: Location) -> int | None:
    """The last step read from ``loc``'s file before that place (its byte offset or line),
    or the file's last step where the place is not one its points are positioned by."""
    best: int | None = None
    for s in _placed(run):
        if s.source != loc.file or not len(s):
            continue
        at = loc.offset if s.position_unit == "offset" else loc.line
        steps = s.steps if at is None else s.steps[s.positions < at]
        if steps.size:
            best = max(best if best is not None else int(steps.min()), int(steps.max()))
    return best


def issue_marks(run: Run) -> tuple[list[Marker], list[IngestIssue]]:
    """A mark at the last step read from a file before each of its read issues (``file
    ends: events.out... cut at byte 2048``), and the issues no step can place (a file with
    no point on the run's steps, damage before its first point)."""
    marks, apart = [], []
    for issue in run.issues:
        loc = issue.location
        name = os.path.basename(loc.file)
        at = (f"byte {loc.offset}" if loc.offset is not None else
              f"line {loc.line}" if loc.line is not None else "")
        step = _step_before(run, loc)
        if step is None:
            apart.append(issue)
        elif issue.kind in ENDING_KINDS:
            marks.append(Marker("file ends", step, f"{name} cut at {at or 'its end'}: "
                                f"{issue.message}"))
        else:
            marks.append(Marker("read issue", step, f"{name}{' at ' + at if at else ''}: "
                                f"{issue.kind}: {issue.message}"))
    return marks, apart


def collapse_constant(panels: Mapping[str, list[Curve]]) -> tuple[dict[str, list[Curve]],
                                                                  list[str]]:
    """The panels worth a chart, and a line for each one whose every point holds one value
    (``loss scale 65536 throughout``): a flat line would take a row to say so."""
    kept: dict[str, list[Curve]] = {}
    said = []
    for name, cs in panels.items():
        value = constant(cs) if cs else None
        if value is None:
            kept[name] = cs
        else:
            said.append(f"{name} {value:.6g} throughout")
    return kept, said


FIRST_PANEL = "first non-finite tag"
"""The panel of a failing tag no role's panel plots (a weight norm), so it is on a chart."""


def failing_tags(result: RunResult) -> list[str]:
    """The tag that went non-finite first and the first per-layer tag to, each once."""
    out = []
    for inc in (result.incident, result.layer_incident):
        if inc is not None and inc.aligned and inc.tag not in out:
            out.append(inc.tag)
    return out


def layer_lines(result: RunResult, place: Place | None, by_replay: bool) -> list[str]:
    """What the Layers page says first, in the headline's words: where the failure was made
    (``place``: :func:`analyzer.wording.failing_place`), then the first per-layer tag the logs
    show non-finite, as what it is: where the values were first seen, which need not be where
    they were made (a loss function's NaN reaches every layer's gradient at once)."""
    out = []
    if place is not None:
        how = "the replay saw the operation" if by_replay else "read from the logged values"
        out.append(f"Where the failure was made: {place_words(place, mark='**')} ({how}).")
    lay = result.layer_incident
    if lay is None:
        return out
    first = (f"First per-layer tag to go non-finite in the logs: `{lay.tag}` (layer "
             f"**{lay.layer}**, {lay.kind} {incident_step(lay, result.run, 'at')}).")
    elsewhere = place is not None and (place.loss_fn or place.other is not None or (
        place.layer is not None and place.layer != lay.layer))
    if elsewhere:
        first += (" That is where the non-finite values were first logged, not where they "
                  "were made.")
    out.append(first)
    return out


def timeline_panels(result: RunResult, roles: TagRoles) -> dict[str, list[Curve]]:
    """The Timeline's panels: one per role of :data:`TIMELINE_ROLES`, and
    :data:`FIRST_PANEL` holding the failing tags (:func:`failing_tags`) none of them plots."""
    run = result.run
    panels = {r.value: curves(run, roles.tags(r)) for r in TIMELINE_ROLES}
    plotted = {c.tag for cs in panels.values() for c in cs}
    unplotted = [t for t in failing_tags(result) if t not in plotted]
    first = curves(run, unplotted)  # none where the tag is a checkpoint's, not a series
    if first:
        panels[FIRST_PANEL] = first
    return panels
