"""Plotly figures of the pages, built from the plain values of :mod:`app.views`."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.views import Curve, Grid, Marker, OwnPanel, log_scale

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
}
SYMBOLS = {"overflow skip": "x", "restart": "diamond", "checkpoint": "triangle-up",
           "error": "star", "min loss scale": "square", "first non-finite": "circle",
           "last finite": "circle-open", "growth onset": "triangle-right"}
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


def _bad_trace(curve: Curve, showlegend: bool) -> go.Scatter | None:
    """Non-finite points cannot be plotted: mark them at the top of the curve's range."""
    bad = curve.bad
    if not bad.any():
        return None
    finite = curve.values[~bad]
    top = float(finite.max()) if finite.size else 1.0
    texts = ["nan" if math.isnan(v) else ("+inf" if v > 0 else "-inf")
             for v in curve.values[bad]]
    return go.Scatter(x=curve.steps[bad], y=np.full(int(bad.sum()), top), mode="markers",
                      marker={"symbol": "x-thin-open", "size": 11,
                              "color": COLOURS["first non-finite"], "line": {"width": 2}},
                      name="non-finite value", legendgroup="nonfinite", showlegend=showlegend,
                      text=[f"{curve.label}: {t}" for t in texts],
                      hovertemplate="step %{x}<br>%{text}<extra></extra>")


def timeline(panels: Mapping[str, list[Curve]], marks: list[Marker],
             focus: int | None = None) -> go.Figure:
    """One row per quantity over steps, sharing the step axis, and a strip of events."""
    names = [n for n, cs in panels.items() if cs]
    rows = len(names) + 1
    heights = [1.0] * len(names) + [0.45]
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        row_heights=heights, subplot_titles=[*names, STRIP])
    shown_bad = False
    for row, name in enumerate(names, start=1):
        for curve in panels[name]:
            y = np.where(curve.bad, np.nan, curve.values)
            fig.add_trace(go.Scatter(x=curve.steps, y=y, mode="lines+markers",
                                     marker={"size": 4}, name=curve.label,
                                     hovertemplate="step %{x}<br>%{y:.6g}<extra>"
                                     + curve.label + "</extra>"), row=row, col=1)
            bad = _bad_trace(curve, not shown_bad)
            if bad is not None:
                fig.add_trace(bad, row=row, col=1)
                shown_bad = True
        if log_scale(panels[name]):
            fig.update_yaxes(type="log", row=row, col=1)
        else:
            fig.update_yaxes(tickformat=".3~g", range=_flat_range(panels[name]), row=row,
                             col=1)
    kinds = sorted({m.kind for m in marks}, key=list(COLOURS).index)
    for kind in kinds:
        picked = [m for m in marks if m.kind == kind]
        fig.add_trace(go.Scatter(
            x=[m.step for m in picked], y=[kind] * len(picked), mode="markers", name=kind,
            marker={"symbol": SYMBOLS.get(kind, "circle"), "size": 10,
                    "color": COLOURS.get(kind, "#444")},
            text=[m.text for m in picked],
            hovertemplate="step %{x}: " + kind + "<br>%{text}<extra></extra>"),
            row=rows, col=1)
    for m in marks:
        if m.kind in ("first non-finite", "growth onset"):
            fig.add_vline(x=m.step, line_color=COLOURS[m.kind], line_width=2,
                          line_dash="solid" if m.kind == "first non-finite" else "dash",
                          row="all", col=1)
    if focus is not None:
        fig.add_vline(x=focus, line_color=COLOURS["focus"], line_dash="dot", line_width=2,
                      row="all", col=1)
    fig.update_xaxes(title_text="step", row=rows, col=1)
    fig.update_layout(height=220 * len(names) + 180, hovermode="x unified", colorway=LINES,
                      margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      legend={"orientation": "h", "y": -0.08})
    return fig


def own_axis(panel: OwnPanel) -> go.Figure:
    """A source not placed on the run's global step, over its own numbering: an x axis of
    its records (or iterations), never shared with the global step's panels."""
    unit = panel.label
    fig = go.Figure()
    shown_bad = False
    for curve in panel.curves:
        y = np.where(curve.bad, np.nan, curve.values)
        fig.add_trace(go.Scatter(x=curve.steps, y=y, mode="lines+markers", marker={"size": 4},
                                 name=curve.label,
                                 hovertemplate=f"{unit} %{{x}}<br>%{{y:.6g}}<extra>"
                                 + curve.label + "</extra>"))
        bad = _bad_trace(curve, not shown_bad)
        if bad is not None:
            bad.hovertemplate = f"{unit} %{{x}}<br>%{{text}}<extra></extra>"
            fig.add_trace(bad)
            shown_bad = True
    if panel.first is not None and panel.first.step is not None:
        fig.add_vline(x=panel.first.step, line_color=COLOURS["first non-finite"], line_width=2)
    if log_scale(panel.curves):
        fig.update_yaxes(type="log")
    else:
        fig.update_yaxes(tickformat=".3~g", range=_flat_range(panel.curves))
    numbers = np.concatenate([c.steps for c in panel.curves] or [np.zeros(1, dtype=np.int64)])
    span = float(numbers.max() - numbers.min()) if numbers.size else 0.0
    fig.update_xaxes(title_text=f"{unit} ({panel.name}'s own numbering)",
                     dtick=max(1, math.ceil(span / 10)))  # a record has no half
    fig.update_layout(height=320, colorway=LINES, title=f"{panel.name}, by {unit}",
                      margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def layer_heatmap(grid: Grid, title: str, highlight: str | None,
                  first_step: int | None) -> go.Figure:
    """log10 of each per-layer value over steps; non-finite cells marked, a layer boxed."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(np.isfinite(grid.values) & (grid.values > 0),
                     np.log10(np.abs(grid.values)), np.nan)
    labels = [f"▶ {t}" if highlight and layer == highlight else t
              for t, layer in zip(grid.tags, grid.layers, strict=True)]
    fig = go.Figure(go.Heatmap(
        z=z, x=grid.steps, y=labels, colorscale="Viridis", colorbar={"title": "log10"},
        customdata=grid.values,
        hovertemplate="%{y}<br>step %{x}<br>value %{customdata:.6g}<extra></extra>"))
    rows, cols = np.nonzero(grid.nonfinite)
    if rows.size:
        fig.add_trace(go.Scatter(
            x=grid.steps[cols], y=[labels[r] for r in rows], mode="markers",
            marker={"symbol": "x", "color": COLOURS["first non-finite"], "size": 9},
            name="non-finite", hovertemplate="%{y}<br>step %{x}: non-finite<extra></extra>"))
    for i, layer in enumerate(grid.layers):
        if highlight and layer == highlight:
            fig.add_shape(type="rect", xref="paper", x0=0, x1=1, y0=i - 0.5, y1=i + 0.5,
                          line={"color": COLOURS["first non-finite"], "width": 2})
    if first_step is not None:
        fig.add_vline(x=first_step, line_color=COLOURS["first non-finite"], line_width=2)
    fig.update_layout(title=title, height=max(260, 26 * len(labels) + 120),
                      margin={"l": 10, "r": 10, "t": 40, "b": 10}, showlegend=False,
                      xaxis_title="step")
    return fig


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
    fig.update_yaxes(type="log", title_text="weight norm")
    fig.update_layout(height=360, margin={"l": 10, "r": 10, "t": 30, "b": 10}, colorway=LINES,
                      xaxis_title="step of the save")
    return fig


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
    return fig


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
    return fig


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
    return fig
