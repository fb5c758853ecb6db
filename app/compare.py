"""What the Compare page shows, from the analyzer's records: plain values, no Streamlit.

The chosen run is set beside other runs: which runs by default (its siblings, healthy ones
first), their curves on one step axis, shifted to line up at step 0 or at the failure, the
keys whose values differ between them (settings, hyperparameters, environment, checkpoint
dtypes), and the findings one side has and the other has not.

Aligned at the failure, a failed run's steps are counted from its own first non-finite
step, so that the run-ups of several failed runs lie over each other at x = 0; a healthy
run has no failure of its own and is counted from the chosen run's (it keeps its place
beside the chosen run, as on the global step). A chosen run that did not fail lends the
earliest failure among the runs compared instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from analyzer.fleet.hyperparams import hyperparameters
from analyzer.model import RunResult
from analyzer.pipeline import same_folder
from app import views
from app.runinfo import value_text

DEFAULT_CAP = 3
"""Runs set beside the chosen one by default: more overlaid curves stop being readable."""
ROLES = views.TIMELINE_ROLES
ALIGN_START = "align at step 0"
ALIGN_FAILURE = "align at the failure"
GROUPS = ("setting", "hyperparameter", "environment", "checkpoint", "capture")


@dataclass(frozen=True)
class Candidate:
    """A run that may be compared: its name, folder and whether it is healthy (finite
    and readable; None where it has not been analysed)."""

    name: str
    path: str
    healthy: bool | None = None


def healthy(result: RunResult | None, error: str | None = None) -> bool:
    """Whether a run is a healthy baseline: finite and read whole. A run whose files were
    cut short (damaged) or could not be read is not, though no value of it is non-finite."""
    from app.health import health

    return health(result, error).status == "finite"


LOOK = 12
"""Siblings whose health is looked at, at most, to find the healthy defaults: each costs
the analysis of a run, and a sweep folder may hold hundreds."""


def with_health(chosen: Candidate, candidates: Sequence[Candidate],
                healthy_of: Callable[[Candidate], bool], cap: int = DEFAULT_CAP,
                look: int = LOOK) -> list[Candidate]:
    """``candidates`` with the health of the chosen run's siblings filled in, by name,
    until ``cap`` healthy ones are found or ``look`` have been looked at; the others'
    stays unknown (None) and they are offered after the healthy ones."""
    here = same_folder(chosen.path)
    siblings = sorted((c for c in candidates
                       if c.name != chosen.name and same_folder(c.path) == here),
                      key=lambda c: c.name)
    known: dict[str, bool] = {}
    for c in siblings[:look]:
        known[c.name] = healthy_of(c)
        if sum(known.values()) >= cap:
            break
    return [replace(c, healthy=known[c.name]) if c.name in known else c for c in candidates]


def ordered(chosen: Candidate, candidates: Sequence[Candidate]) -> list[Candidate]:
    """Every run but the chosen one, its siblings (same parent folder) first, healthy ones
    first among them, then the rest of the root; by name within each."""
    here = same_folder(chosen.path)

    def key(c: Candidate) -> tuple[int, int, str]:
        return (same_folder(c.path) != here, c.healthy is not True, c.name)

    return sorted((c for c in candidates if c.name != chosen.name), key=key)


def default_picks(chosen: Candidate, candidates: Sequence[Candidate],
                  cap: int = DEFAULT_CAP) -> list[str]:
    """The chosen run's siblings, healthy ones first, at most ``cap``."""
    here = same_folder(chosen.path)
    return [c.name for c in ordered(chosen, candidates) if same_folder(c.path) == here][:cap]


PICKS = "compare_picks"
"""The session key of the runs picked beside each chosen run, by its name."""


def picker_key(chosen: str) -> str:
    """The session key of the runs picked beside ``chosen``: one per chosen run, so that
    a run picked in the sidebar starts from its own siblings, and coming back to a run
    finds the picks made for it."""
    return f"compare_with:{chosen}"


def failure_step(result: RunResult) -> int | None:
    """The run's first non-finite step on its global step, when it has one."""
    inc = result.incident
    return inc.step if inc is not None and inc.aligned else None


def offsets(runs: Mapping[str, RunResult], mode: str) -> dict[str, int]:
    """What is taken off each run's steps, by name (``runs``: the chosen run first, then
    the others, by the names the page shows)."""
    if mode != ALIGN_FAILURE:
        return dict.fromkeys(runs, 0)
    reference = reference_step(runs)
    out = {}
    for name, result in runs.items():
        own = failure_step(result)
        out[name] = own if own is not None else (reference or 0)
    return out


def reference_step(runs: Mapping[str, RunResult]) -> int | None:
    """The step a healthy run is counted from when aligned at the failure: the chosen
    run's (the first's) failure, else the earliest among the others; None when no run
    failed."""
    results = list(runs.values())
    own = failure_step(results[0]) if results else None
    if own is not None:
        return own
    steps = [s for r in results[1:] if (s := failure_step(r)) is not None]
    return min(steps) if steps else None


@dataclass(frozen=True)
class Line:
    """One curve of one run, its steps already shifted."""

    run: str
    curve: views.Curve
    chosen: bool
    skipped: frozenset[int] = frozenset()
    """The shifted steps a dynamic loss scaler skipped: a non-finite value there is the
    scaler's benign overflow, not the failure."""


def panels(runs: Mapping[str, RunResult], roles_of: Mapping[str, views.TagRoles],
           mode: str) -> dict[str, list[Line]]:
    """One panel per quantity some run logged (loss, gradient norm, learning rate, loss
    scale), each holding every run's curves of it, shifted by :func:`offsets`; the chosen
    run is the first of ``runs``."""
    shift = offsets(runs, mode)
    first = next(iter(runs), None)
    out: dict[str, list[Line]] = {}
    for role in ROLES:
        lines = []
        for name, result in runs.items():
            roles = roles_of.get(name)
            if roles is None:
                continue
            for c in views.curves(result.run, roles.tags(role)):
                moved = views.Curve(c.label, c.tag, c.source, c.steps - shift[name], c.values,
                                    c.axis)
                skipped = frozenset(s - shift[name] for s in result.overflow_skips)
                lines.append(Line(name, moved, name == first, skipped))
        if lines:
            out[role.value] = lines
    return out


def has_curves(drawn: Mapping[str, list[Line]], run: str) -> bool:
    """Whether ``run`` has a line on any panel (an unreadable run has none)."""
    return any(line.run == run for lines in drawn.values() for line in lines)


def _group(key: str) -> str:
    if key.startswith("env."):
        return "environment"
    if key.startswith("capture."):
        return "capture"
    return "hyperparameter"


def _cell(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool | int | float | str):
        return value_text(value)
    return str(value)


def checkpoint_keys(result: RunResult) -> dict[str, str]:
    """The dtypes the run's checkpoints hold, by what they hold (weights, optimizer state),
    and the precision a trainer saved; several dtypes are listed together."""
    history = result.run.checkpoints
    if history is None or not history.scans:
        return {}
    dtypes: dict[str, set[str]] = {}
    precisions: set[str] = set()
    for scan in history.scans:
        for t in scan.tensors:
            if t.role in ("weights", "optimizer", "scaler"):
                dtypes.setdefault(t.role, set()).add(t.dtype)
        if scan.meta is not None and scan.meta.precision is not None:
            precisions.add(scan.meta.precision)
    out = {f"checkpoint.{role} dtype": ", ".join(sorted(found))
           for role, found in sorted(dtypes.items())}
    if precisions:
        out["checkpoint.precision"] = ", ".join(sorted(precisions))
    return out


def keys_of(result: RunResult) -> dict[tuple[str, str], str | None]:
    """Every compared key of a run, by (group, key): the settings resolved over its
    metadata (``learning_rate``), the files' own keys not already given as a setting,
    its environment and capture, and its checkpoints' dtypes."""
    out: dict[tuple[str, str], str | None] = {}
    run = result.run
    given: set[str] = set()
    if run.metadata is not None:
        for name, setting in run.metadata.settings.items():
            out[("setting", name)] = _cell(setting.value)
            given.add(setting.key)
    for key, value in hyperparameters(result).items():
        if key not in given:
            out[(_group(key), key)] = _cell(value)
    for key, text in checkpoint_keys(result).items():
        out[("checkpoint", key)] = text
    return out


@dataclass(frozen=True)
class KeyDiff:
    """The key table: ``rows`` one per key (group, key, then a column per run named by the
    run), and how many keys every run has with the same value."""

    rows: list[dict[str, str | None]]
    same: int
    columns: list[str]


def key_diff(runs: Mapping[str, RunResult], show_all: bool = False) -> KeyDiff:
    """The keys whose values differ between the runs (a key one run lacks differs), a
    column per run by name, the chosen run (the first) first; every key with
    ``show_all``."""
    names = list(runs)
    per_run = [keys_of(r) for r in runs.values()]
    order = {g: k for k, g in enumerate(GROUPS)}
    keys = sorted({k for keys in per_run for k in keys}, key=lambda k: (order[k[0]], k[1]))
    rows = []
    same = 0
    for group, key in keys:
        values = [keys.get((group, key)) for keys in per_run]
        equal = len(set(values)) == 1
        same += equal
        if equal and not show_all:
            continue
        rows.append({"group": group, "key": key, **dict(zip(names, values, strict=True))})
    return KeyDiff(rows, same, ["group", "key", *names])


def finding_diff(chosen: RunResult, others: Mapping[str, RunResult]
                 ) -> tuple[list[dict[str, str]], list[dict[str, str]], int]:
    """The rules that fired on the chosen run and on none of the others, the rules that
    fired on some other run and not on the chosen one (with the runs), and how many fired
    on both sides."""
    mine = {f.code: f for f in chosen.findings}
    theirs: dict[str, list[tuple[str, str]]] = {}
    names: dict[str, tuple[str, str]] = {}
    for name, other in others.items():
        for f in other.findings:
            theirs.setdefault(f.code, []).append((name, f.confidence))
            names.setdefault(f.code, (f.name, f.role))
    only_mine = [{"code": f.code, "rule": f.name, "confidence": f.confidence, "role": f.role,
                  "title": f.title} for f in chosen.findings if f.code not in theirs]
    only_theirs = [{"code": code, "rule": names[code][0], "role": names[code][1],
                    "runs": ", ".join(f"{run} ({conf})" for run, conf in runs)}
                   for code, runs in sorted(theirs.items()) if code not in mine]
    return only_mine, only_theirs, sum(1 for code in mine if code in theirs)


CHOSEN_WIDTH = 3.5
OTHER_WIDTH = 1.6
NONFINITE = "non-finite value"
SKIPPED = "overflow skipped by the loss scaler (benign)"
DASHES = ("solid", "dash", "dot", "dashdot", "longdash")
"""A run's several tags in one panel (train and validation loss) differ by dash; runs
differ by colour."""


def colours(names: Sequence[str]) -> dict[str, str]:
    """A colour per run, the chosen run (the first) the first: never red, which marks the
    failure and non-finite values."""
    from app.charts import COLOURS, LINES

    # Nor the colour that marks a scaler's overflow skips.
    palette = [c for c in LINES if c != COLOURS["overflow skip"]]
    return {name: palette[k % len(palette)] for k, name in enumerate(names)}


def log_default(lines: Sequence[Line]) -> bool:
    """A log axis by default for a panel whose positive values span two decades with no
    zero (as the Timeline's), or six decades even beside a zero: a run that diverged to
    1e37 flattens a healthy run's loss onto 0 on a linear axis, and a log rounded to 0.0000
    must not keep the panel linear. A zero is not drawn on a log axis (the toggle says)."""
    span, _ = views.positive_span([ln.curve for ln in lines])
    return views.log_scale([ln.curve for ln in lines]) or (span is not None and span >= 1e6)


def figure(drawn: Mapping[str, list[Line]], names: Sequence[str], mode: str,
           failures: Mapping[str, int | None],
           log: Mapping[str, bool] | None = None) -> object:
    """The overlaid curves, one row per quantity on a shared step axis; the chosen run
    bold. A non-finite point cannot be drawn as a value: it is marked with a red cross at
    the top edge of its panel (on an axis of its own, so it reads as no value), at its
    step; one at a step the loss scaler skipped is its benign overflow, marked a little
    lower in the overflow-skip colour. The chosen run's failure is the red line; another
    failed run's is dashed in its colour (aligned at the failure, each failed run's lies
    at 0)."""
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from app.charts import COLOURS

    red = COLOURS["first non-finite"]
    colour = colours(names)
    titles = list(drawn)
    fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=titles, specs=[[{"secondary_y": True}]] * len(titles))
    legend: set[str] = set()
    marked: set[str] = set()
    axis = "from the failure" if mode == ALIGN_FAILURE else "step"
    for row, title in enumerate(titles, start=1):
        tags: dict[str, list[str]] = {}
        for line in drawn[title]:
            c = line.curve
            seen = tags.setdefault(line.run, [])
            if c.label not in seen:
                seen.append(c.label)
            dash = DASHES[seen.index(c.label) % len(DASHES)]
            fig.add_trace(go.Scatter(
                x=c.steps, y=np.where(c.bad, np.nan, c.values), mode="lines",
                name=line.run, legendgroup=line.run, showlegend=line.run not in legend,
                line={"color": colour[line.run], "dash": dash,
                      "width": CHOSEN_WIDTH if line.chosen else OTHER_WIDTH},
                hovertemplate=f"{line.run}: {c.label}<br>{axis} %{{x}}<br>%{{y:.6g}}"
                              "<extra></extra>"),
                row=row, col=1)
            legend.add(line.run)
            benign = np.isin(c.steps, list(line.skipped))
            for mask, kind, y in ((c.bad & ~benign, NONFINITE, 0.96),
                                  (c.bad & benign, SKIPPED, 0.88)):
                if not mask.any():
                    continue
                words = [views.num(v) for v in c.values[mask]]
                fig.add_trace(go.Scatter(
                    x=c.steps[mask], y=np.full(int(mask.sum()), y), mode="markers",
                    name=kind, legendgroup=kind, showlegend=kind not in marked,
                    marker={"symbol": "x-thin-open", "size": 10, "line": {"width": 2},
                            "color": red if kind == NONFINITE else COLOURS["overflow skip"]},
                    text=[f"{line.run}: {c.label} = {w}" for w in words],
                    hovertemplate=axis + " %{x}<br>%{text}<extra></extra>"),
                    row=row, col=1, secondary_y=True)
                marked.add(kind)
        fig.update_yaxes(range=[0, 1], visible=False, fixedrange=True, row=row, col=1,
                         secondary_y=True)
        # Full numbers on a log axis too: its default labels a minor tick by its digit.
        fig.update_yaxes(tickformat=".3~g", row=row, col=1, secondary_y=False,
                         type="log" if (log or {}).get(title, log_default(drawn[title]))
                         else "linear")
    if mode == ALIGN_FAILURE:
        if any(step is not None for step in failures.values()):
            fig.add_vline(x=0, line_color=red, line_width=2, row="all", col=1)
    else:
        for k, name in enumerate(names):
            step = failures.get(name)
            if step is not None:
                fig.add_vline(x=step, line_color=red if k == 0 else colour[name],
                              line_dash="solid" if k == 0 else "dash",
                              line_width=2 if k == 0 else 1, row="all", col=1)
    label = ("steps from the failure (a failed run's own, a healthy run's from the chosen "
             "run's)" if mode == ALIGN_FAILURE else "step")
    fig.update_xaxes(title_text=label, row=len(titles), col=1)
    fig.update_layout(height=230 * len(titles) + 90, hovermode="closest",
                      margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      legend={"orientation": "h", "y": -0.12 if len(titles) > 1 else -0.3})
    return fig
