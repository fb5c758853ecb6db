"""The Timeline's and the Layers page's charts (issue 19): figures built from the records of
real sample runs and of runs written here by torch's SummaryWriter, and the pages' controls
under Streamlit's AppTest."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ROOT / "app" / "streamlit_app.py"
SAMPLES = ROOT / "sample_runs"
CHOSEN = ("adam_eps_fp16", "amp_benign_skips", "nan_in_batch")

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from analyzer.model import RunResult  # noqa: E402
from app import charts, views  # noqa: E402


def _have_samples() -> None:
    if not all((SAMPLES / n / "scenario.json").exists() for n in CHOSEN):
        pytest.skip("sample_runs/ lacks the runs these tests read (make samples)")


def _expected(name: str) -> dict[str, Any]:
    return dict(json.loads((SAMPLES / name / "scenario.json").read_text())["expected"])


@pytest.fixture(scope="module")
def results() -> dict[str, RunResult]:
    """The three sample runs the issue names, analysed without a replay (read only)."""
    from analyzer import api

    _have_samples()
    report = api.analyze([str(SAMPLES / n) for n in CHOSEN], replay=False)
    return {r.run.name: r for r in report.results}


def _panels(result: RunResult) -> dict[str, list[views.Curve]]:
    return views.timeline_panels(result, views.tag_roles(result.run.tags()))


def _array(raw: Any) -> list[float]:
    """A trace's x or y: plotly writes numpy arrays as base64 typed arrays in JSON."""
    import base64

    if isinstance(raw, dict):
        data = np.frombuffer(base64.b64decode(raw["bdata"]), dtype=np.dtype(raw["dtype"]))
        return [float(v) for v in data]
    return [float("nan") if v is None else float(v) for v in raw]


def _spec(fig: Any) -> dict[str, Any]:
    return dict(json.loads(fig.to_json()))


def _axis_key(ref: str) -> str:
    """``y3`` -> ``yaxis3``; ``y`` -> ``yaxis``."""
    return ref[0] + "axis" + ref[1:]


# Point 4: the tag that failed first is on a chart.

def test_regression_first_nonfinite_weight_norm_is_on_the_timeline(
        results: dict[str, RunResult]) -> None:
    result = results["adam_eps_fp16"]
    tag = _expected("adam_eps_fp16")["tag"]
    assert result.incident is not None and result.incident.tag == tag
    panels = _panels(result)
    assert [c.tag for c in panels[views.FIRST_PANEL]] == [tag]
    spec = _spec(charts.timeline(panels, views.markers(result, None)))
    names = [t["name"] for t in spec["data"] if t.get("mode") == "lines+markers"]
    assert tag in names
    # A tag a role's panel already plots gets no panel of its own.
    assert views.FIRST_PANEL not in _panels(results["nan_in_batch"])


# Point 7: non-finite marks, legends, scale, smoothing, steps shown, flat panels, focus.

def test_regression_nonfinite_marks_are_pinned_at_the_panels_top_not_at_a_value(
        results: dict[str, RunResult]) -> None:
    result = results["nan_in_batch"]
    spec = _spec(charts.timeline(_panels(result), views.markers(result, None)))
    bad = [t for t in spec["data"] if t.get("legendgroup") == "nonfinite"]
    assert bad
    layout = spec["layout"]
    for trace in bad:
        pin = layout[_axis_key(trace["yaxis"])]
        # An axis of 0..1 over the panel's own height, drawn on it, showing no values.
        assert pin["range"] == [0, 1] and pin["visible"] is False
        assert pin["overlaying"] == trace["xaxis"].replace("x", "y")
        assert set(_array(trace["y"])) == {charts.PIN_TOP}
        assert {math.isfinite(v) for v in _array(trace["x"])} == {True}
    step = _expected("nan_in_batch")["first_nonfinite_step"]
    assert step in _array(bad[0]["x"])


def test_nonfinite_values_at_overflow_skips_are_marked_benign(
        results: dict[str, RunResult]) -> None:
    result = results["amp_benign_skips"]
    assert result.overflow_skips
    spec = _spec(charts.timeline(_panels(result), views.markers(result, None),
                                 skipped=result.overflow_skips))
    marked = [t for t in spec["data"] if t.get("legendgroup") in ("nonfinite", "skipped")]
    assert marked and {t["name"] for t in marked} == {charts.SKIPPED}
    steps = {x for t in marked for x in _array(t["x"])}
    assert steps <= {float(s) for s in result.overflow_skips}
    assert {t["marker"]["color"] for t in marked} == {charts.COLOURS["overflow skip"]}


def test_regression_each_panel_has_its_own_legend(results: dict[str, RunResult]) -> None:
    result = results["amp_benign_skips"]
    panels = {n: cs for n, cs in _panels(result).items() if cs}
    spec = _spec(charts.timeline(panels, views.markers(result, None)))
    lines = [t for t in spec["data"] if t.get("mode") == "lines+markers"]
    by_axis: dict[str, set[str]] = {}
    for t in lines:
        by_axis.setdefault(t.get("yaxis", "y"), set()).add(t.get("legend", "legend"))
    assert len(by_axis) == len(panels) >= 3
    assert all(len(legends) == 1 for legends in by_axis.values())
    legends = {next(iter(v)) for v in by_axis.values()}
    assert len(legends) == len(panels)
    for name in legends:  # each placed beside its own panel, not one list below all
        assert spec["layout"][name]["x"] > 1
    tops = sorted(spec["layout"][n]["y"] for n in legends)
    assert len(set(tops)) == len(tops)
    strip = [t for t in spec["data"] if t.get("mode") == "markers" and "legendgroup" not in t]
    assert strip and not any(t.get("showlegend", True) for t in strip)


def _write(folder: Path, tags: dict[str, list[float]]) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for tag, values in tags.items():
        for step, value in enumerate(values):
            writer.add_scalar(tag, value, step)
    writer.close()
    return folder


def _analyse(folder: Path) -> RunResult:
    from analyzer import api

    (result,) = api.analyze(str(folder), replay=False).results
    return result


def test_regression_a_constant_loss_scale_is_a_caption_not_a_panel(tmp_path: Path) -> None:
    losses = [2.0 * math.exp(-s / 10) for s in range(30)]
    result = _analyse(_write(tmp_path / "run", {"train/loss": losses,
                                                "amp/loss_scale": [65536.0] * 30}))
    panels = _panels(result)
    assert [c.tag for c in panels["loss scale"]] == ["amp/loss_scale"]
    kept, said = views.collapse_constant(panels)
    assert "loss scale" not in kept and "loss" in kept
    assert said == ["loss scale 65536 throughout"]
    spec = _spec(charts.timeline({n: c for n, c in kept.items() if c}, []))
    titles = [a["text"] for a in spec["layout"]["annotations"]]
    assert "loss scale" not in titles and "loss" in titles


@pytest.fixture(scope="module")
def flat_tail(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """A loss that decays over two decades then sits at exactly 0."""
    losses = [10.0 * math.exp(-s / 3) for s in range(20)] + [0.0] * 20
    return _analyse(_write(tmp_path_factory.mktemp("flat") / "run", {"train/loss": losses}))


def test_regression_log_toggle_keeps_a_loss_that_sits_at_zero_readable(
        flat_tail: RunResult) -> None:
    panels = {"loss": _panels(flat_tail)["loss"]}
    assert not views.log_scale(panels["loss"])  # a zero: linear by default
    spec = _spec(charts.timeline(panels, []))
    assert spec["layout"]["yaxis"].get("type") != "log"
    spec = _spec(charts.timeline(panels, [], log={"loss": True}))
    assert spec["layout"]["yaxis"]["type"] == "log"
    (line,) = [t for t in spec["data"] if t.get("mode") == "lines+markers"]
    ys = _array(line["y"])
    assert all(math.isnan(v) for v in ys[20:]) and all(v > 0 for v in ys[:20])
    (zeros,) = [t for t in spec["data"] if t.get("legendgroup") == "offlog"]
    assert _array(zeros["x"]) == [float(s) for s in range(20, 40)]
    assert set(_array(zeros["y"])) == {charts.PIN_BOTTOM}  # at the panel's bottom edge
    assert spec["layout"][_axis_key(zeros["yaxis"])]["range"] == [0, 1]


def test_smoothing_is_tensorboards_debiased_ema_over_a_faint_raw_line(
        results: dict[str, RunResult]) -> None:
    values = np.array([1.0, 3.0, float("nan"), 2.0])
    w = 0.5
    # By hand: last = 0.5, 0.5*0.5+1.5 = 1.75, kept, 0.875+1 = 1.875; debiased by 1-w^n.
    expected = [0.5 / 0.5, 1.75 / 0.75, float("nan"), 1.875 / 0.875]
    got = views.ema(values, w)
    assert np.allclose(got, expected, equal_nan=True)
    assert np.array_equal(views.ema(values, 0.0), values, equal_nan=True)
    result = results["nan_in_batch"]
    panels = {"loss": _panels(result)["loss"]}
    spec = _spec(charts.timeline(panels, [], smooth=0.6))
    raw = [t for t in spec["data"] if t["name"].endswith("(raw)")]
    smooth = [t for t in spec["data"] if t.get("legendgroup") in
              {c.label for c in panels["loss"]} and not t["name"].endswith("(raw)")]
    assert len(raw) == len(smooth) == len(panels["loss"])
    assert all(t["opacity"] < 0.5 and t["showlegend"] is False for t in raw)
    curve = panels["loss"][0]
    (mine,) = [t for t in smooth if t["name"] == curve.label]
    finite = np.where(curve.bad, np.nan, curve.values)
    assert np.allclose(_array(mine["y"]), views.ema(finite, 0.6), equal_nan=True)


def test_regression_steps_shown_refit_the_y_axes(results: dict[str, RunResult]) -> None:
    result = results["amp_benign_skips"]
    panels = {n: cs for n, cs in _panels(result).items() if cs}
    window = (150, 199)
    whole = _spec(charts.timeline(panels, views.markers(result, None)))
    part = _spec(charts.timeline(panels, views.markers(result, None), window=window))
    for trace in part["data"]:
        xs = _array(trace["x"])
        assert all(window[0] <= x <= window[1] for x in xs), trace["name"]
    assert part["layout"]["xaxis"]["range"][0] < window[0] <= window[1] \
        < part["layout"]["xaxis"]["range"][1]

    def top(spec: dict[str, Any], name: str) -> float:
        (t,) = [t for t in spec["data"] if t["name"] == name and t.get("mode") ==
                "lines+markers"]
        return max(v for v in _array(t["y"]) if math.isfinite(v))

    # The early, larger values are not in the points the y axis fits.
    assert top(part, "train/grad_norm") < 0.5 * top(whole, "train/grad_norm")
    span = views.step_span(panels)
    assert span == (0, 199)
    # A failure marked past the curves' last step (a checkpoint's, after a cut event file)
    # is within the steps shown.
    assert views.step_span(panels, [views.Marker("first non-finite", 250, "")]) == (0, 250)
    assert views.around((0, 100), 50) == (30, 55)
    assert views.around((0, 41), 40) == (30, 41)


def test_regression_focus_line_is_drawn_above_the_failure_line_on_its_step(
        results: dict[str, RunResult]) -> None:
    result = results["nan_in_batch"]
    step = _expected("nan_in_batch")["first_nonfinite_step"]
    spec = _spec(charts.timeline(_panels(result), views.markers(result, None), focus=step))
    shapes = spec["layout"]["shapes"]
    failure = [i for i, s in enumerate(shapes)
               if s["line"]["color"] == charts.COLOURS["first non-finite"]]
    focus = [i for i, s in enumerate(shapes) if s["line"]["color"] == charts.COLOURS["focus"]]
    assert failure and focus and min(focus) > max(failure)  # drawn later: on top
    for i in focus:
        assert shapes[i]["x0"] == step and shapes[i]["layer"] == "above"
        assert shapes[i]["line"]["dash"] != shapes[failure[0]]["line"].get("dash", "solid")
        assert shapes[i]["line"]["width"] > shapes[failure[0]]["line"]["width"]


def test_chart_text_meets_small_text_contrast(results: dict[str, RunResult]) -> None:
    result = results["nan_in_batch"]
    spec = _spec(charts.timeline(_panels(result), views.markers(result, None)))
    layout = spec["layout"]
    assert layout["font"]["color"] == charts.FONT
    assert all(a["font"]["color"] == charts.FONT for a in layout["annotations"])
    axes = [v for k, v in layout.items() if k.startswith(("xaxis", "yaxis"))
            and v.get("visible", True)]
    assert axes and all(a["tickfont"]["color"] == charts.TICK for a in axes)
    legends = [v for k, v in layout.items() if k.startswith("legend")]
    assert legends and all(v["font"]["color"] == charts.FONT for v in legends)

    def luminance(hex_: str) -> float:
        rgb = [int(hex_[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    for colour in (charts.FONT, charts.TICK):  # on white: WCAG's 4.5:1 for small text
        assert 1.05 / (luminance(colour) + 0.05) >= 4.5


# Point 2: a truncated event file's end is marked at the last step read from it.

@pytest.fixture(scope="module")
def cut_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = _write(tmp_path_factory.mktemp("cut") / "runs" / "cut",
                    {"train/loss": [1.0 / (1 + s) for s in range(60)]})
    (events,) = folder.glob("events.out.tfevents.*")
    data = events.read_bytes()
    events.write_bytes(data[: len(data) // 2])
    return folder


def test_regression_a_cut_event_file_is_marked_where_its_record_ends(cut_run: Path) -> None:
    result = _analyse(cut_run)
    (issue,) = [i for i in result.run.issues if i.kind == "truncated"]
    assert issue.location.offset is not None
    last = int(max(s.steps.max() for s in result.run.series if len(s)))
    marks, apart = views.issue_marks(result.run)
    assert not apart
    (mark,) = marks
    assert (mark.kind, mark.step) == ("file ends", last)
    assert mark.text.startswith(f"{Path(issue.location.file).name} cut at byte "
                                f"{issue.location.offset}")
    spec = _spec(charts.timeline(_panels(result), marks))
    strip = [t for t in spec["data"] if t["name"] == "file ends"]
    assert strip and _array(strip[0]["x"]) == [float(last)]


def test_issues_of_a_file_with_nothing_read_are_kept_apart(tmp_path: Path) -> None:
    from analyzer.model import IngestIssue, Location, Run

    issue = IngestIssue(Location("r/events.out.tfevents.1.host", 0), "not_an_event", "noise")
    marks, apart = views.issue_marks(Run("r", "r", (), issues=(issue,)))
    assert marks == [] and apart == [issue]


# Point 8: the heatmap's zeros and its colours per row.

def test_regression_heatmap_zeros_are_apart_from_cells_not_logged(
        results: dict[str, RunResult]) -> None:
    result = results["adam_eps_fp16"]
    roles = views.tag_roles(result.run.tags())
    from analyzer.tags import TagRole

    grid = views.layer_grid(result.run, roles.tags(TagRole.LAYER_GRAD), roles.layers)
    zeros = grid.logged & (grid.values == 0)
    assert zeros.sum(axis=1).max() >= 30  # the zero gradients the issue names
    fig = charts.layer_heatmap(grid, "t", None, 40)
    main, zero = fig.data[0], fig.data[1]
    assert zero.name == "0 (logged)" and zero.showscale is False
    assert np.array_equal(~np.isnan(np.asarray(zero.z, dtype=float)), zeros)
    assert {c for row in zero.colorscale for c in row[1:]} == {charts.ZERO}
    words = main.text
    colours = np.asarray(main.z, dtype=float)
    for r, c in zip(*np.nonzero(zeros), strict=True):
        assert words[r][c] == "0 (logged)"
        assert math.isnan(colours[r][c])  # not on the colour scale
    for r, c in zip(*np.nonzero(~grid.logged), strict=True):
        assert words[r][c] == "not logged"


def test_heatmap_marks_overflow_skips_apart_from_failures(
        results: dict[str, RunResult]) -> None:
    from analyzer.tags import TagRole

    result = results["amp_benign_skips"]
    roles = views.tag_roles(result.run.tags())
    grid = views.layer_grid(result.run, roles.tags(TagRole.LAYER_GRAD), roles.layers)
    assert grid.nonfinite.any()
    fig = charts.layer_heatmap(grid, "t", None, None, skipped=result.overflow_skips)
    marked = [t for t in fig.data if t.type == "scatter"]
    assert [t.name for t in marked] == [charts.SKIPPED]
    assert len(marked[0].x) == int(grid.nonfinite.sum())


def test_regression_heatmap_colours_each_row_by_its_own_range(
        results: dict[str, RunResult]) -> None:
    from analyzer.tags import TagRole

    result = results["nan_in_batch"]
    roles = views.tag_roles(result.run.tags())
    grid = views.layer_grid(result.run, roles.tags(TagRole.LAYER_WEIGHT), roles.layers)
    # A row a thousand million times larger than the others, as a layer at 1e20 would be.
    big = views.Grid(grid.tags, grid.layers, grid.steps,
                     np.vstack([grid.values[:1] * 1e20, grid.values[1:]]), grid.logged)
    z = charts.heat_values(big)
    for row, vals in zip(z, big.values, strict=True):
        seen = row[np.isfinite(row)]
        distinct = np.unique(vals[np.isfinite(vals) & (vals != 0)])
        if distinct.size > 1:
            assert math.isclose(seen.min(), 0.0) and math.isclose(seen.max(), 1.0)
    assert np.nanmax(charts.heat_values(big, shared=True)[0]) > 19
    raw = charts.layer_heatmap(big, "t", None, None).data[0].text
    assert raw[0][0] == views.num(float(big.values[0][0]))  # the hover keeps the raw value


# Point 5 (Layers): the logged first layer as what it is, the place as the headline says.

def test_regression_layers_say_where_it_was_made_in_the_headlines_words(
        results: dict[str, RunResult]) -> None:
    from analyzer.wording import failing_place, place_words

    for name, result in results.items():
        place = failing_place(result)
        lines = views.layer_lines(result, place, False)
        if place is not None:
            assert place_words(place, mark="**") in lines[0], name
        if result.layer_incident is not None:
            assert lines[-1].startswith("First per-layer tag to go non-finite in the logs: "
                                        f"`{result.layer_incident.tag}`"), name
        assert not any(line.startswith("First layer whose") for line in lines), name


# The click: streamlit's selection event, as its docstring gives its shape.

def test_step_of_click_reads_streamlits_selection_event() -> None:
    event = {"selection": {"points": [{"curve_number": 2, "point_number": 9,
                                       "point_index": 9, "x": 24.0, "y": 7.2,
                                       "legendgroup": "x"}],
                           "point_indices": [9], "box": [], "lasso": []}}
    assert views.step_of_click(event) == 24
    empty = {"selection": {"points": [], "point_indices": [], "box": [], "lasso": []}}
    assert views.step_of_click(empty) is None
    assert views.step_of_click(None) is None
    assert views.step_of_click({"selection": {"points": [{"x": "a"}]}}) is None


# The pages under AppTest.

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, cut_run: Path) -> Iterator[Path]:
    """A copy of the three sample runs and the cut one as the dashboard's root."""
    _have_samples()
    root = tmp_path_factory.mktemp("served") / "runs"
    for name in CHOSEN:
        shutil.copytree(SAMPLES / name, root / name)
    shutil.copytree(cut_run, root / "cut")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORENSICS_RUNS", str(root))
        yield root


def _timeline(run: str, **params: str) -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=300)
    at.query_params["run"] = run
    for key, value in params.items():
        at.query_params[key] = value
    at.switch_page("app_pages/timeline.py").run()
    _ok(at)
    return at


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _chart(at: AppTest) -> dict[str, Any]:
    chart = next(c for c in at.get("plotly_chart") if "timeline_chart" in c.proto.id)
    return dict(json.loads(chart.proto.spec))


def _texts(at: AppTest) -> str:
    parts = [str(e.value) for kind in ("markdown", "caption", "subheader", "warning")
             for e in at.get(kind)]
    return "\n".join(parts + [f.value.to_string() for f in at.dataframe])


def test_timeline_controls(served: Path) -> None:
    at = _timeline("amp_benign_skips")
    spec = _chart(at)
    assert spec["layout"]["yaxis"]["type"] == "log"  # the loss spans two decades
    assert "learning rate 0.001 throughout" in _texts(at)
    at.toggle(key="timeline_log_amp_benign_skips_loss").set_value(False).run()
    _ok(at)
    assert _chart(at)["layout"]["yaxis"].get("type") != "log"
    at.slider(key="timeline_smooth").set_value(0.8).run()
    _ok(at)
    assert any(t["name"].endswith("(raw)") for t in _chart(at)["data"])
    at.slider(key="timeline_steps_amp_benign_skips").set_value((100, 120)).run()
    _ok(at)
    xs = [x for t in _chart(at)["data"] for x in _array(t["x"])]
    assert xs and min(xs) >= 100 and max(xs) <= 120
    at.button(key="timeline_all").click().run()
    _ok(at)
    assert at.slider(key="timeline_steps_amp_benign_skips").value == (0, 199)
    assert at.button(key="timeline_around").disabled  # no failure to go around


def test_timeline_around_the_failure_and_the_first_tag(served: Path) -> None:
    at = _timeline("adam_eps_fp16")
    names = {t["name"] for t in _chart(at)["data"]}
    assert _expected("adam_eps_fp16")["tag"] in names
    at.button(key="timeline_around").click().run()
    _ok(at)
    lo, hi = at.slider(key="timeline_steps_adam_eps_fp16").value
    assert lo < 40 <= hi


def test_regression_a_click_on_a_point_selects_its_step(served: Path) -> None:
    at = _timeline("nan_in_batch")
    assert not any("in every source" in s.value for s in at.subheader)
    at.session_state["timeline_chart"] = {"selection": {
        "points": [{"curve_number": 0, "point_number": 24, "point_index": 24, "x": 24,
                    "y": 0.5}], "point_indices": [24], "box": [], "lasso": []}}
    at.run()
    _ok(at)
    assert at.query_params["step"] in ("24", ["24"])
    assert "Step 24 in every source" in [s.value for s in at.subheader]
    focus = [s for s in _chart(at)["layout"]["shapes"]
             if s["line"]["color"] == charts.COLOURS["focus"]]
    assert focus and {s["x0"] for s in focus} == {24}
    # A link to another step afterwards is not taken back by the selection the chart keeps.
    at.query_params["step"] = "10"
    at.run()
    assert "Step 10 in every source" in [s.value for s in at.subheader]


def test_regression_timeline_marks_where_a_cut_file_ends(served: Path) -> None:
    at = _timeline("cut")
    marks = next(f.value for f in at.dataframe if "mark" in f.value.columns)
    ends = marks[marks["mark"] == "file ends"]
    assert len(ends) == 1 and " cut at byte " in ends["what"].iloc[0]
    assert "file ends" in {t["name"] for t in _chart(at)["data"]}


def test_regression_layers_page_agrees_with_the_headline(served: Path) -> None:
    from app import data

    at = AppTest.from_file(str(ENTRY), default_timeout=300)
    at.query_params["run"] = "nan_in_batch"
    at.switch_page("app_pages/layers.py").run()
    if any(str(c.value).startswith("Replaying the captured step") for c in at.caption):
        data.replays.drain()
        at.run()
    _ok(at)
    shown = [str(m.value) for m in at.markdown]
    headline = next(m for m in shown if m.startswith("**nan_in_batch**"))
    (made,) = [m for m in shown if m.startswith("Where the failure was made: ")]
    place = made.removeprefix("Where the failure was made: ").split(" (")[0]
    assert place in headline
    assert any(m.startswith("First per-layer tag to go non-finite in the logs: ")
               for m in shown)
    assert not any(m.startswith(("First layer whose", "Where the replay saw",
                                 "Where the logged values place")) for m in shown)
    assert at.toggle(key="layers_shared").value is False
    at.toggle(key="layers_shared").set_value(True).run()
    _ok(at)


def test_regression_layers_checkpoint_tables_show_no_none_and_short_numbers(
        served: Path) -> None:
    """The checkpoint tables (growth, saves, bookkeeping, counts) went through
    st.dataframe: growth printed with every digit, a save's missing loss scale or epoch as
    "None", a global step missing in one save as NaN beside 24.0 in another."""
    at = AppTest.from_file(str(ENTRY), default_timeout=300)
    at.query_params["run"] = "adam_eps_fp16"
    at.switch_page("app_pages/layers.py").run()
    _ok(at)
    columns = [list(f.value.columns) for f in at.dataframe]
    assert any("non-finite tensors" in c for c in columns), columns
    assert any("growth over finite saves" in c for c in columns), columns
    for frame in at.dataframe:
        table = frame.value
        floats = [c for c in table.columns if table[c].dtype.kind == "f"]
        assert not floats, (list(table.columns), floats)
        assert not table.isna().any().any(), table.head()
        assert not (table.astype(str) == "None").any().any(), table.head()
    saves = frame_of(at, "non-finite tensors")["save"].tolist()
    counts = [f.value for f in at.dataframe if set(saves) <= set(f.value.columns)]
    # the per-layer counts keep their layer, which a table drawn without its index drops
    assert counts and all(c.columns[0] == "layer" for c in counts)


def frame_of(at: AppTest, column: str) -> Any:
    return next(f.value for f in at.dataframe if column in f.value.columns)


@pytest.fixture(scope="module")
def hf_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    pytest.importorskip("transformers")
    from tests.frameworks import corpus

    root = tmp_path_factory.mktemp("hf_served") / "runs"
    shutil.copytree(corpus.get("hf_nan", tmp_path_factory), root / "hf_nan")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FORENSICS_RUNS", str(root))
        yield root


def test_regression_layers_tables_of_a_trainer_run_hold_no_nan_for_a_save_without_layers(
        hf_served: Path) -> None:
    """A Trainer's checkpoint-N/optimizer.pt holds no layer's weights: its columns of the
    per-layer counts were all NaN, drawn "nan" as if the counts were non-finite; the growth
    table was blank in every cell (one finite save), the saves table had columns blank in
    every row and was cut at the page's edge."""
    at = AppTest.from_file(str(ENTRY), default_timeout=300)
    at.query_params["run"] = "hf_nan"
    at.switch_page("app_pages/layers.py").run()
    _ok(at)
    saves = frame_of(at, "non-finite tensors")
    assert "global step" in saves.columns  # the last save's trainer_state.json has it
    assert "loss scale" not in saves.columns and "epoch" not in saves.columns
    counts = next(f.value for f in at.dataframe if f.value.columns[0] == "layer"
                  and any(str(c).startswith("step ") for c in f.value.columns))
    assert list(counts.columns[1:]) == [s for s in saves["save"] if "optimizer" not in s]
    assert not (counts == "nan").any().any(), counts.head()
    for frame in at.dataframe:
        table = frame.value
        blank = [c for c in table.columns if (table[c].astype(str) == "").all()]
        assert not blank, (list(table.columns), blank)
    assert not any("growth over finite saves" in f.value.columns for f in at.dataframe)
    assert any("needs two saves whose weights are finite" in str(c.value) for c in at.caption)


def test_regression_a_log_drawn_apart_holds_only_its_unplaced_series(
        results: dict[str, RunResult]) -> None:
    """amp_benign_skips' train.log has its loss and lr placed on the global step (drawn on
    the timeline's panels) and one loss record it could not place: the panel drawn apart,
    'not on the run's steps', showed all three, with 'loss' twice in its legend."""
    result = results["amp_benign_skips"]
    run = result.run
    own = views.own_panels(result, ["loss", "lr", "train/loss"])
    assert own, "train.log's unplaced record"
    for panel in own:
        unplaced = {(s.tag, len(s)) for s in run.series if s.source == panel.source
                    and not run.is_aligned(s.source, s.axis)}
        assert {(c.tag, len(c.steps)) for c in panel.curves} <= unplaced
        labels = [c.label for c in panel.curves]
        assert len(labels) == len(set(labels)), labels
    placed = {c.source for c in views.curves(run, ["loss"])}
    assert any(s.endswith("train.log") for s in placed)


def test_regression_log_axes_label_ticks_as_numbers_not_si_suffixes(
        results: dict[str, RunResult]) -> None:
    """A diverging loss on a log axis was labelled 1, 10M, 100T, 10^21, 10^28: Plotly's SI
    suffixes (T, a trillion, read as a unit) then powers on the same axis."""
    panels = _panels(results["adam_eps_fp16"])
    spec = _spec(charts.timeline(panels, [], log=dict.fromkeys(panels, True)))
    logs = [v for k, v in spec["layout"].items() if k.startswith("yaxis")
            and isinstance(v, dict) and v.get("type") == "log"]
    assert logs
    assert all(v.get("exponentformat") == charts.LOG_TICKS != "B" for v in logs)


def test_regression_a_finite_save_after_the_first_non_finite_one_is_marked_finite(
        hf_served: Path) -> None:
    """hf_nan's checkpoint-16/optimizer.pt holds no non-finite tensor (its weights beside
    it do): the Timeline marked it 'non-finite' (every save from the first non-finite one
    on), while the Layers page's saves table counts 0 for it."""
    at = AppTest.from_file(str(ENTRY), default_timeout=300)
    at.query_params["run"] = "hf_nan"
    at.switch_page("app_pages/timeline.py").run()
    _ok(at)
    marks = frame_of(at, "mark")
    saves = marks[marks["mark"] == "checkpoint"]
    by = {(int(step), what) for step, what in zip(saves["step"], saves["what"], strict=True)}
    assert (16, "optimizer.pt: finite") in by and (16, "model.safetensors: non-finite") in by
    assert (8, "model.safetensors: finite") in by


def test_regression_a_few_printed_zeros_do_not_flatten_a_loss_onto_a_linear_axis() -> None:
    # healthy_control's train.log prints its loss to four decimals: two of its 200 values
    # read 0.0000, which kept the whole curve on a linear axis, its tail flat on 0.
    from analyzer import api

    run = api.read(str(SAMPLES / "healthy_control"))[0]
    logged = [s for s in run.series if s.tag == "loss" and s.source.endswith("train.log")]
    assert logged and 0 < int((logged[0].values == 0).sum()) <= 0.1 * len(logged[0])
    curves = views.curves(run, ["loss"])
    assert views.log_scale(curves)
    negative = views.Curve("x", "x", "s", np.arange(3), np.array([-1.0, 1.0, 1000.0]))
    assert not views.log_scale([negative])
