"""Plotly figures of the pages, built from the plain values of :mod:`app.views`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.views import Curve, FloatArray, Grid, Marker, OwnPanel, clip, ema, log_scale, num

LOG_TICKS = "power"
"""How a log axis writes its decades: as powers of ten (10^35, 10^-3), where Plotly's
default mixes SI suffixes with powers (10M, 100T, then 10^21 on one axis: T read as a
unit). A number format on every tick instead crowds a short axis with 9e+7, 8e+7, ..."""
COLOURS = {
    "first non-finite": "#d62728",
    "last finite": "#2ca02c",
    "growth onset": "#ff7f0e",
    "overflow skip": "#9467bd",
    "restart": "#8c564b",
    "error": "#e377c2",
    "min loss scale": "#7f7f7f",
    "checkpoint": "#17becf",
    "focus": "#1f77b4",
    "file ends": "#6b4c00",
    "read issue": "#6b4c00",
}
SYMBOLS = {"overflow skip": "x", "restart": "diamond", "checkpoint": "triangle-up",
           "error": "star", "min loss scale": "square", "first non-finite": "circle",
           "last finite": "circle-open", "growth onset": "triangle-right",
           "file ends": "square-x-open", "read issue": "hourglass"}
STRIP = "events"
LINES = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f",
         "#e377c2", "#ff7f0e"]
"""Line colours without red, which marks non-finite values and the failing step."""


def _flat_range(curves_: list[Curve]) -> list[float] | None:
    """A y range for a nearly constant quantity (a fixed learning rate logged by two
    sources with float32 rounding), which plotly would otherwise zoom into the noise."""
    vals = np.concatenate([c.values[np.isfinite(c.values)] for c in curves_] or [np.zeros(0)])
    if not vals.size:
        return None
    lo, hi = float(vals.min()), float(vals.max())
    size = max(abs(lo), abs(hi))
    if size == 0 or hi - lo > 1e-3 * size:
        return None
    return [lo - 0.5 * size, hi + 0.5 * size]


FONT = "#0e1014"
"""Text on the charts (titles, legends, hovers), the theme's text colour."""
TICK = "#474b57"
"""Tick labels and axis titles: 8.7:1 on white (the Streamlit template's grey is 3.7:1,
too faint for small text)."""


def _ink(fig: go.Figure) -> go.Figure:
    """Text colours of at least 4.5:1 on white, set on each axis and legend: the template
    Streamlit applies sets the axes' own, which a layout-wide font would not override."""
    fig.update_layout(font={"color": FONT}, title_font_color=FONT)
    fig.update_xaxes(tickfont_color=TICK, title_font_color=TICK)
    fig.update_yaxes(tickfont_color=TICK, title_font_color=TICK)
    fig.update_annotations(font_color=FONT)
    for name in list(fig.layout):
        if name.startswith("legend"):
            fig.layout[name].font.color = FONT
    return fig


PIN = "pin"
"""The overlay axes (0 to 1 over a panel's height) that non-finite marks are pinned on."""
PIN_TOP, PIN_BOTTOM = 0.95, 0.04


SKIPPED = "non-finite at an overflow skip (benign)"
"""A value the loss scaler's overflow made non-finite at a step it skipped: not a failure."""


def _bad_traces(curve: Curve, legend: str | None, shown: set[str], unit: str = "step",
                skipped: frozenset[int] = frozenset()) -> list[go.Scatter]:
    """Non-finite points have no place on a value axis: pinned at the panel's top edge on
    an overlay axis of 0 to 1 (where no value can be read from them), named in the legend;
    those at steps the loss scaler skipped a little lower, in the overflow skips' colour.
    ``shown``: the legend entries the panel already has (added to)."""
    out = []
    benign = np.isin(curve.steps, list(skipped))
    for mask, name, colour, y in (
            (curve.bad & ~benign, "non-finite value (pinned at the top)",
             COLOURS["first non-finite"], PIN_TOP),
            (curve.bad & benign, SKIPPED, COLOURS["overflow skip"], PIN_TOP - 0.08)):
        if not mask.any():
            continue
        texts = [f"{curve.label}: {num(v)}" for v in curve.values[mask]]
        trace = go.Scatter(x=curve.steps[mask], y=np.full(int(mask.sum()), y), mode="markers",
                           marker={"symbol": "x-thin-open", "size": 11, "color": colour,
                                   "line": {"width": 2}},
                           name=name, legendgroup="nonfinite" if y == PIN_TOP else "skipped",
                           showlegend=name not in shown, text=texts,
                           hovertemplate=unit + " %{x}<br>%{text}<extra></extra>")
        if legend is not None:
            trace.legend = legend
        shown.add(name)
        out.append(trace)
    return out


def _off_log_trace(curve: Curve, legend: str | None, showlegend: bool) -> go.Scatter | None:
    """Zeros and negative values of a curve drawn on a log axis: pinned at its bottom edge."""
    off = np.isfinite(curve.values) & (curve.values <= 0)
    if not off.any():
        return None
    trace = go.Scatter(x=curve.steps[off], y=np.full(int(off.sum()), PIN_BOTTOM),
                       mode="markers", marker={"symbol": "line-ns-open", "size": 9,
                                               "color": "#555555", "line": {"width": 2}},
                       name="<= 0 (off the log axis)", legendgroup="offlog",
                       showlegend=showlegend, customdata=curve.values[off],
                       hovertemplate="step %{x}<br>" + curve.label
                       + ": %{customdata:.6g}<extra></extra>")
    if legend is not None:
        trace.legend = legend
    return trace


def _axis(kind: str, n: int) -> str:
    """``yaxis``/``yaxis2``: the layout key of axis ``n``; ``kind`` is ``x`` or ``y``."""
    return f"{kind}axis" if n == 1 else f"{kind}axis{n}"


def _ref(kind: str, n: int) -> str:
    return kind if n == 1 else f"{kind}{n}"


def _legend(n: int) -> str:
    return "legend" if n == 1 else f"legend{n}"


def _pin_axis(fig: go.Figure, row: int, pin: int) -> str:
    """An invisible axis over ``row``'s height, 0 at its bottom and 1 at its top."""
    fig.layout[_axis("y", pin)] = {"overlaying": _ref("y", row), "range": [0, 1],
                                   "visible": False, "fixedrange": True, "anchor": _ref("x", row)}
    return _ref("y", pin)


def _line_traces(curve: Curve, colour: str, smooth: float, log: bool, legend: str,
                 ) -> list[go.Scatter]:
    """The curve's line (NaN gaps where it cannot be drawn); smoothed, the raw line faint
    beneath the smoothed one."""
    y = np.where(curve.bad | (log & (curve.values <= 0)), np.nan, curve.values)
    hover = "step %{x}<br>%{y:.6g}<extra>" + curve.label + "</extra>"
    if smooth <= 0:
        return [go.Scatter(x=curve.steps, y=y, mode="lines+markers", marker={"size": 4},
                           line={"color": colour}, name=curve.label, legend=legend,
                           hovertemplate=hover)]
    raw = go.Scatter(x=curve.steps, y=y, mode="lines", line={"color": colour, "width": 1},
                     opacity=0.3, name=f"{curve.label} (raw)", legend=legend,
                     legendgroup=curve.label, showlegend=False, hoverinfo="skip")
    smoothed = go.Scatter(x=curve.steps, y=ema(y, smooth), mode="lines",
                          line={"color": colour, "width": 2}, name=curve.label,
                          legend=legend, legendgroup=curve.label,
                          hovertemplate="step %{x}<br>%{y:.6g} smoothed<extra>" + curve.label
                          + "</extra>")
    return [raw, smoothed]


def timeline(panels: Mapping[str, list[Curve]], marks: list[Marker],
             focus: int | None = None, *, log: Mapping[str, bool] | None = None,
             smooth: float = 0.0, window: tuple[int, int] | None = None,
             skipped: Sequence[int] = ()) -> go.Figure:
    """One row per quantity over steps, sharing the step axis, and a strip of events.

    ``log``: each panel's y axis (log or linear; a panel not named gets
    :func:`app.views.log_scale`'s choice); ``smooth``: TensorBoard's EMA weight (0: raw);
    ``window``: the steps shown, each panel's y range fitted to the points in it (plotly
    would keep the whole run's y range on an x zoom); ``skipped``: the steps the loss
    scaler skipped, whose non-finite values are its benign overflow. Each panel has its own
    legend."""
    if window is not None:
        panels = {n: [c for c in (clip(c, *window) for c in cs) if c.steps.size]
                  for n, cs in panels.items()}
        marks = [m for m in marks if window[0] <= m.step <= window[1]]
    names = [n for n, cs in panels.items() if cs]
    rows = len(names) + 1
    heights = [1.0] * len(names) + [0.45]
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        row_heights=heights, subplot_titles=[*names, STRIP])
    legends: dict[str, object] = {}
    for row, name in enumerate(names, start=1):
        curves_ = panels[name]
        as_log = (log or {}).get(name, log_scale(curves_))
        legend = _legend(row)
        pin = ""
        shown: set[str] = set()
        extra: list[go.Scatter] = []  # after the lines: the legend lists the curves first
        for n, curve in enumerate(curves_):
            for trace in _line_traces(curve, LINES[n % len(LINES)], smooth, as_log, legend):
                fig.add_trace(trace, row=row, col=1)
            extra += _bad_traces(curve, legend, shown, skipped=frozenset(skipped))
            off = _off_log_trace(curve, legend, "off" not in shown) if as_log else None
            if off is not None:
                extra.append(off)
                shown.add("off")
        for trace in extra:
            pin = pin or _pin_axis(fig, row, rows + row)
            trace.xaxis, trace.yaxis = _ref("x", row), pin
            fig.add_trace(trace)
        if as_log:
            fig.update_yaxes(type="log", exponentformat=LOG_TICKS, row=row, col=1)
        else:
            fig.update_yaxes(tickformat=".3~g", range=_flat_range(curves_), row=row, col=1)
        top = fig.layout[_axis("y", row)].domain[1]
        legends[legend] = {"x": 1.01, "xanchor": "left", "y": top, "yanchor": "top",
                           "font": {"size": 11, "color": FONT}, "bgcolor": "rgba(0,0,0,0)"}
    kinds = sorted({m.kind for m in marks}, key=lambda k: (list(COLOURS).index(k)
                                                        if k in COLOURS else len(COLOURS), k))
    for kind in kinds:
        picked = [m for m in marks if m.kind == kind]
        fig.add_trace(go.Scatter(
            x=[m.step for m in picked], y=[kind] * len(picked), mode="markers", name=kind,
            marker={"symbol": SYMBOLS.get(kind, "circle"), "size": 10,
                    "color": COLOURS.get(kind, "#444")},
            text=[m.text for m in picked], showlegend=False,
            hovertemplate="step %{x}: " + kind + "<br>%{text}<extra></extra>"),
            row=rows, col=1)
    for m in marks:
        if m.kind in ("first non-finite", "growth onset"):
            fig.add_vline(x=m.step, line_color=COLOURS[m.kind], line_width=2,
                          line_dash="solid" if m.kind == "first non-finite" else "dash",
                          row="all", col=1)
        elif m.kind == "file ends":
            fig.add_vline(x=m.step, line_color=COLOURS[m.kind], line_width=2,
                          line_dash="longdash", row="all", col=1)
    if focus is not None and (window is None or window[0] <= focus <= window[1]):
        # Drawn last and above the traces: it stays visible on the failure's own step.
        fig.add_vline(x=focus, line_color=COLOURS["focus"], line_dash="dot", line_width=3,
                      layer="above", row="all", col=1)
    if window is not None:
        pad = max(0.5, (window[1] - window[0]) * 0.02)
        fig.update_xaxes(range=[window[0] - pad, window[1] + pad])
    fig.update_xaxes(title_text="step", row=rows, col=1)
    fig.update_layout(height=220 * len(names) + 180, hovermode="x unified", colorway=LINES,
                      margin={"l": 10, "r": 10, "t": 30, "b": 10}, font={"color": FONT},
                      **legends)
    return _ink(fig)


def own_axis(panel: OwnPanel) -> go.Figure:
    """A source not placed on the run's global step, over its own numbering: an x axis of
    its records (or iterations), never shared with the global step's panels."""
    unit = panel.label
    fig = go.Figure()
    shown: set[str] = set()
    for curve in panel.curves:
        y = np.where(curve.bad, np.nan, curve.values)
        fig.add_trace(go.Scatter(x=curve.steps, y=y, mode="lines+markers", marker={"size": 4},
                                 name=curve.label,
                                 hovertemplate=f"{unit} %{{x}}<br>%{{y:.6g}}<extra>"
                                 + curve.label + "</extra>"))
        for bad in _bad_traces(curve, None, shown, unit):
            bad.yaxis = _pin_axis(fig, 1, 2)
            fig.add_trace(bad)
    if panel.first is not None and panel.first.step is not None:
        fig.add_vline(x=panel.first.step, line_color=COLOURS["first non-finite"], line_width=2)
    if log_scale(panel.curves):
        fig.update_yaxes(type="log", exponentformat=LOG_TICKS)
    else:
        fig.update_yaxes(tickformat=".3~g", range=_flat_range(panel.curves))
    numbers = np.concatenate([c.steps for c in panel.curves] or [np.zeros(1, dtype=np.int64)])
    span = float(numbers.max() - numbers.min()) if numbers.size else 0.0
    fig.update_xaxes(title_text=f"{unit} ({panel.name}'s own numbering)",
                     dtick=max(1, math.ceil(span / 10)))  # a record has no half
    fig.update_layout(height=320, colorway=LINES, title=f"{panel.name}, by {unit}",
                      font={"color": FONT},
                      margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      legend={"orientation": "h", "y": -0.25})
    return _ink(fig)


ZERO = "#a9a9a9"
"""The colour of a cell logged as exactly 0: apart from every colour of the scale and from
the blank of a step the tag was not logged at."""


def heat_values(grid: Grid, shared: bool = False) -> FloatArray:
    """What each cell is coloured by: log10 of its magnitude, each row spread over its own
    range (0 its lowest, 1 its highest) so that a row at 1e20 does not flatten the others;
    ``shared``: the raw log10, one scale for every row. NaN where nothing finite and non-zero
    was logged (zeros and non-finite cells are drawn apart)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(grid.logged & np.isfinite(grid.values) & (grid.values != 0),
                     np.log10(np.abs(grid.values)), np.nan)
    if shared or not z.size:
        return np.asarray(z, dtype=np.float64)
    out = np.full(z.shape, np.nan)
    for r in range(z.shape[0]):
        row = z[r]
        seen = np.isfinite(row)
        if not seen.any():
            continue
        lo, hi = float(row[seen].min()), float(row[seen].max())
        out[r, seen] = (row[seen] - lo) / (hi - lo) if hi > lo else 0.5
    return out


def _cell_words(grid: Grid) -> list[list[str]]:
    """Each cell's hover: its raw value, ``0 (logged)``, or ``not logged``."""
    return [[num(float(v)) + (" (logged)" if v == 0 else "") if seen else "not logged"
             for v, seen in zip(vals, logged, strict=True)]
            for vals, logged in zip(grid.values, grid.logged, strict=True)]


def layer_heatmap(grid: Grid, title: str, highlight: str | None,
                  first_step: int | None, shared: bool = False,
                  skipped: Sequence[int] = ()) -> go.Figure:
    """Each per-layer value over steps, coloured by :func:`heat_values`; exact zeros in a
    colour of their own, non-finite cells marked (in the overflow skips' colour at a step
    the loss scaler skipped: its benign overflow), a layer boxed. The hover gives the raw
    value whatever the colour scale."""
    labels = [f"▶ {t}" if highlight and layer == highlight else t
              for t, layer in zip(grid.tags, grid.layers, strict=True)]
    words = _cell_words(grid)
    bar: dict[str, object] = {
        "title": {"text": "log10" if shared else "each row:<br>its own<br>log range",
                  "font": {"color": FONT}}, "tickfont": {"color": TICK}}
    if not shared:
        bar |= {"tickvals": [0, 1], "ticktext": ["row's lowest", "row's highest"]}
    fig = go.Figure(go.Heatmap(
        z=heat_values(grid, shared), x=grid.steps, y=labels, colorscale="Viridis",
        colorbar={**bar, "x": 1.02}, text=words, name="value",
        hovertemplate="%{y}<br>step %{x}<br>%{text}<extra></extra>"))
    zeros = grid.logged & (grid.values == 0)
    if zeros.any():
        fig.add_trace(go.Heatmap(
            z=np.where(zeros, 1.0, np.nan), x=grid.steps, y=labels, text=words,
            colorscale=[[0, ZERO], [1, ZERO]], showscale=False, name="0 (logged)",
            hoverongaps=False, hovertemplate="%{y}<br>step %{x}<br>0 (logged)<extra></extra>"))
    benign = np.isin(grid.steps, list(skipped))[None, :]
    for mask, name, colour in ((grid.nonfinite & ~benign, "non-finite",
                                COLOURS["first non-finite"]),
                               (grid.nonfinite & benign, SKIPPED, COLOURS["overflow skip"])):
        rows, cols = np.nonzero(mask)
        if not rows.size:
            continue
        fig.add_trace(go.Scatter(
            x=grid.steps[cols], y=[labels[r] for r in rows], mode="markers",
            marker={"symbol": "x", "color": colour, "size": 9}, name=name,
            text=[words[r][c] for r, c in zip(rows, cols, strict=True)],
            hovertemplate="%{y}<br>step %{x}: %{text}<extra>" + name + "</extra>"))
    for i, layer in enumerate(grid.layers):
        if highlight and layer == highlight:
            fig.add_shape(type="rect", xref="paper", x0=0, x1=1, y0=i - 0.5, y1=i + 0.5,
                          line={"color": COLOURS["first non-finite"], "width": 2})
    if first_step is not None:
        fig.add_vline(x=first_step, line_color=COLOURS["first non-finite"], line_width=2)
    fig.update_layout(title=title, height=max(260, 26 * len(labels) + 120),
                      margin={"l": 10, "r": 10, "t": 40, "b": 10}, showlegend=False,
                      xaxis_title="step", font={"color": FONT}, plot_bgcolor="white")
    return _ink(fig)


def checkpoint_norms(steps: list[int | None], norms: Mapping[str, list[float | None]],
                     bad_from: int | None) -> go.Figure:
    """Each layer's weight norm at each save, with the first non-finite save marked."""
    fig = go.Figure()
    xs = [s if s is not None else i for i, s in enumerate(steps)]
    for layer, values in norms.items():
        ys = [v if v is not None and math.isfinite(v) else None for v in values]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=layer,
                                 hovertemplate="step %{x}<br>%{y:.6g}<extra>" + layer
                                 + "</extra>"))
    if bad_from is not None and bad_from < len(xs):
        fig.add_vline(x=xs[bad_from], line_color=COLOURS["first non-finite"], line_width=2)
    fig.update_yaxes(type="log", exponentformat=LOG_TICKS, title_text="weight norm")
    fig.update_layout(height=360, margin={"l": 10, "r": 10, "t": 30, "b": 10}, colorway=LINES,
                      xaxis_title="step of the save")
    return _ink(fig)


def cause_bars(labels: list[str], runs: list[int]) -> go.Figure:
    """Causes ranked by the failed runs each explains, the most at the top."""
    fig = go.Figure(go.Bar(x=runs, y=labels, orientation="h",
                           marker_color=COLOURS["first non-finite"],
                           hovertemplate="%{y}: %{x} runs<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title_text=None)
    most = max(runs, default=1)
    fig.update_xaxes(title_text="failed runs explained", dtick=max(1, math.ceil(most / 10)))
    fig.update_layout(height=max(220, 34 * len(labels) + 110), showlegend=False,
                      margin={"l": 10, "r": 10, "t": 30, "b": 10})
    return _ink(fig)


def step_histogram(lows: list[int], highs: list[int], runs: list[int]) -> go.Figure:
    """Failed runs by their first non-finite step, one bar per bin ``[low, high]``."""
    centres = [(lo + hi) / 2 for lo, hi in zip(lows, highs, strict=True)]
    widths = [max(hi - lo, 1) for lo, hi in zip(lows, highs, strict=True)]
    texts = [f"steps {lo}-{hi}" if hi != lo else f"step {lo}"
             for lo, hi in zip(lows, highs, strict=True)]
    fig = go.Figure(go.Bar(x=centres, y=runs, width=widths, text=texts,
                           marker_color=COLOURS["first non-finite"], textposition="none",
                           hovertemplate="%{text}: %{y} runs<extra></extra>"))
    fig.update_xaxes(title_text="first non-finite step")
    fig.update_yaxes(title_text="failed runs")
    fig.update_layout(height=300, bargap=0.05, showlegend=False,
                      margin={"l": 10, "r": 10, "t": 30, "b": 10})
    return _ink(fig)


OUTCOME_COLOURS = {"failed": COLOURS["first non-finite"], "healthy": COLOURS["last finite"]}


def separator_strip(key: str, values: Mapping[str, list[float]], names: Mapping[str, list[str]],
                    cut: float | None, log: bool) -> go.Figure:
    """Each run's value of ``key`` by outcome (failed, healthy), jittered apart, with the
    cut that best separates them; a log axis when the values span decades."""
    fig = go.Figure()
    rng = np.random.default_rng(0)  # the same jitter on every rerun
    for row, outcome in enumerate(("failed", "healthy")):
        xs = values.get(outcome, [])
        ys = row + rng.uniform(-0.25, 0.25, len(xs))
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=outcome,
                                 marker={"color": OUTCOME_COLOURS[outcome], "size": 8,
                                         "opacity": 0.75},
                                 text=list(names.get(outcome, [])),
                                 hovertemplate="%{text}<br>" + key + " = %{x:.4g}"
                                 "<extra>" + outcome + "</extra>"))
    if cut is not None:
        fig.add_vline(x=cut, line_color=COLOURS["growth onset"], line_dash="dash", line_width=2)
    fig.update_yaxes(tickvals=[0, 1], ticktext=["failed", "healthy"], range=[-0.6, 1.6])
    fig.update_xaxes(title_text=key, type="log" if log else "linear")
    fig.update_layout(height=280, showlegend=False, margin={"l": 10, "r": 10, "t": 30, "b": 10})
    return _ink(fig)
