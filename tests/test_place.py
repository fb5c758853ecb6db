"""The failing place post hoc: the phase signature, ties named as ties, and what breaks them."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer import cli
from analyzer.model import Run, Series
from analyzer.onset import locate
from analyzer.place import LOSS_FUNCTION
from analyzer.wording import Place, failing_place, place_words
from tests.readonly import snapshot

ROOT = Path(__file__).resolve().parent.parent
NAN, INF = math.nan, math.inf


def _series(tag: str, values: list[float]) -> Series:
    n = len(values)
    return Series(tag=tag, steps=np.arange(n, dtype=np.int64),
                  values=np.asarray(values, np.float64), wall_times=np.zeros(n),
                  source="f", positions=np.arange(n, dtype=np.int64) * 50)


def _run(**tags: list[float]) -> Run:
    return Run(path="r", name="r", files=("f",),
               series=tuple(_series(t.replace("__", "/").replace("_dot_", "."), v)
                            for t, v in tags.items()))


FLAT = [1.0] * 6


def test_backward_phase_with_one_layer_non_finite_names_that_layer() -> None:
    place = locate(_run(train__loss=[1.0] * 7, grad_norm__fc1=[*FLAT, NAN],
                        grad_norm__fc2=[*FLAT, 1.0])).place
    assert place is not None
    assert (place.kind, place.layer, place.phase, place.step) == ("layer", "fc1", "backward", 6)


def test_backward_phase_with_every_layer_non_finite_is_a_tie_with_the_loss_function() -> None:
    place = locate(_run(train__loss=[1.0] * 7, grad_norm__fc1=[*FLAT, NAN],
                        grad_norm__fc2=[*FLAT, NAN])).place
    assert place is not None
    assert place.kind == "undetermined" and place.phase == "backward"
    assert place.candidates == (LOSS_FUNCTION, "fc1", "fc2")
    assert any("capture" in w for w in place.would_decide)


def test_update_phase_is_the_optimizer_update() -> None:
    place = locate(_run(train__loss=[1.0] * 7, train__grad_norm=[1.0] * 7,
                        weight_norm__fc1=[*FLAT, INF], weight_norm__fc2=[*FLAT, 1.0])).place
    assert place is not None
    assert (place.kind, place.phase, place.layer) == ("optimizer_update", "update", "fc1")


def test_infinite_loss_from_steady_weights_is_the_loss_function() -> None:
    place = locate(_run(train__loss=[*FLAT, INF], grad_norm__fc1=[*FLAT, NAN],
                        weight_norm__fc1=[*FLAT, NAN], weight_norm__fc2=[*FLAT, NAN])).place
    assert place is not None
    assert (place.kind, place.phase) == ("loss_function", "forward")


def test_nan_loss_from_steady_weights_is_undetermined_between_loss_and_layers() -> None:
    place = locate(_run(train__loss=[*FLAT, NAN], weight_norm__fc1=[*FLAT, NAN],
                        weight_norm__fc2=[*FLAT, NAN])).place
    assert place is not None
    assert place.kind == "undetermined" and place.phase == "forward"
    assert place.candidates == (LOSS_FUNCTION, "fc1", "fc2")


def test_the_layer_whose_weights_ran_away_breaks_a_forward_tie() -> None:
    grows = [10.0 ** k for k in range(6)]
    place = locate(_run(train__loss=[*FLAT, NAN], weight_norm__fc1=[*FLAT, NAN],
                        weight_norm__fc2=[*grows, NAN])).place
    assert place is not None
    assert (place.kind, place.layer) == ("layer", "fc2")
    assert "growth" in place.decided_by


def test_layers_running_away_together_stay_a_tie() -> None:
    grows = [10.0 ** k for k in range(6)]
    place = locate(_run(train__loss=[*FLAT, NAN], weight_norm__fc1=[*grows, NAN],
                        weight_norm__fc2=[g * 1.5 for g in grows] + [NAN])).place
    assert place is not None and place.kind == "undetermined"


def test_input_tags_non_finite_name_the_input_data() -> None:
    place = locate(_run(train__loss=[*FLAT, NAN], input__max=[*FLAT, NAN],
                        weight_norm__fc1=[*FLAT, NAN])).place
    assert place is not None
    assert (place.kind, place.phase) == ("input_data", "input")


def test_finite_run_has_no_place() -> None:
    assert locate(_run(train__loss=FLAT)).place is None


def test_tie_cell_names_a_few_places_then_how_many_more() -> None:
    tied = Place(tied=("fc1", "fc2", "fc3", "fc4", "fc5"))
    assert place_words(tied, "cell") == "undetermined (fc1, fc2, fc3 and 2 more)"
    assert place_words(Place(tied=("fc1", "fc2")), "cell") == "undetermined (fc1, fc2)"
    assert place_words(Place(tied=("fc1", "fc2"))) == "undetermined between fc1 and fc2"
    assert place_words(Place(other="optimizer update"), "cell") == "(optimizer update)"


def _without_captures(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(ROOT / "sample_runs" / name, dest,
                    ignore=shutil.ignore_patterns("capture"))
    return dest


TIED_IN_FILE_ORDER = ("bad_initialisation", "division_by_zero", "fp16_no_amp",
                      "log_softmax_underflow", "nan_in_batch", "sqrt_at_zero")
"""Sample runs whose per-layer tags all went non-finite at one step, fc1 logged first."""


def test_regression_tied_layers_are_not_named_by_file_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folders = [_without_captures(n, tmp_path) for n in TIED_IN_FILE_ORDER]
    before = {f.name: snapshot(f) for f in folders}
    out = tmp_path / "report.json"
    code = cli.main(["analyze", *map(str, folders), "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 1, text
    report = json.loads(out.read_text())
    summary = {line.split()[0]: line for line in text.splitlines()
               if line.split() and line.split()[0] in TIED_IN_FILE_ORDER and "FAILED" in line}
    for run in report["runs"]:
        place, name = run["place"], run["name"]
        assert place is not None, name
        if place["kind"] == "layer":
            assert place["decided_by"] and "first" not in place["decided_by"], name
        else:
            assert place["layer"] is None, name
        if place["kind"] == "undetermined":
            assert len(place["candidates"]) >= 2 and place["would_decide"], name
            assert "undetermined (" in summary[name], summary[name]
        cells = summary[name].split("  ")
        assert "fc1" not in [c.strip() for c in cells], summary[name]
    assert {f.name: snapshot(f) for f in folders} == before


def test_with_a_capture_the_replay_names_the_layer(tmp_path: Path) -> None:
    from analyzer.api import analyze

    report = analyze(str(ROOT / "sample_runs" / "fp16_no_amp"))
    (result,) = report.results
    assert result.place is not None and result.replay is not None
    place = failing_place(result)
    assert place is not None and place.layer == result.replay.layer


def test_total_gradient_non_finite_with_logged_layers_finite_is_an_unlogged_place() -> None:
    """The hypothesis oracle of test_onset found it: no logged layer to blame."""
    place = locate(_run(train__loss=[1.0] * 7, train__grad_norm=[*FLAT, NAN],
                        grad_norm__fc1=[1.0] * 7)).place
    assert place is not None and place.phase == "backward"
    assert place.candidates == (LOSS_FUNCTION, "any layer")


_TAGS = ["train/loss", "train/grad_norm", "grad_norm/fc1.weight", "grad_norm/fc2.bias",
         "weight_norm/fc1.weight", "weight_norm/fc2.weight", "input/max", "lr"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_TAGS), st.lists(
    st.sampled_from([0.0, 1.0, 1e3, 1e30, NAN, INF, -INF]), min_size=1, max_size=12),
    min_size=1))
def test_every_reading_is_a_place_or_a_tie_of_two_or_more(tags: dict[str, list[float]]) -> None:
    run = Run(path="r", name="r", files=("f",),
              series=tuple(_series(t, v) for t, v in tags.items()))
    result = locate(run)
    place = result.place
    assert (place is None) == (result.incident is None)
    if place is None:
        return
    assert place.decided_by
    if place.kind == "undetermined":
        assert len(place.candidates) >= 2 and place.layer is None and place.would_decide
    else:
        assert not place.candidates
    assert place_words(failing_place(result) or Place(), "cell") != "fc1" or \
        place.kind == "layer"


def _write_run(folder: Path, save_step: int, model: dict[str, object]) -> None:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir()
    with SummaryWriter(str(folder)) as w:
        for step in range(7):
            bad = step == 6
            w.add_scalar("train/loss", 1.0, step)
            w.add_scalar("grad_norm/fc1.weight", NAN if bad else 1.0, step)
            w.add_scalar("grad_norm/fc2.weight", NAN if bad else 1.0, step)
    (folder / "checkpoints").mkdir()
    torch.save({"step": save_step, "model": model}, folder / "checkpoints" / f"step_{save_step}.pt")


def test_the_first_non_finite_save_singles_out_one_layer(tmp_path: Path) -> None:
    import torch

    from analyzer.api import analyze

    run = tmp_path / "run"
    _write_run(run, 6, {"fc1.weight": torch.full((4, 4), NAN), "fc2.weight": torch.ones(4, 4)})
    before = snapshot(run)
    (result,) = analyze(str(run)).results
    assert result.place is not None
    assert (result.place.kind, result.place.layer, result.place.phase) == (
        "layer", "fc1", "backward")
    assert result.place.decided_by.startswith("checkpoints: the first non-finite save")
    assert snapshot(run) == before


def test_a_float16_weight_near_its_limit_in_the_last_finite_save_breaks_the_tie(
        tmp_path: Path) -> None:
    import torch

    from analyzer.api import analyze

    run = tmp_path / "run"
    _write_run(run, 5, {"fc1.weight": torch.ones(4, 4, dtype=torch.float16),
                        "fc2.weight": torch.full((4, 4), 30000.0, dtype=torch.float16)})
    (result,) = analyze(str(run)).results
    assert result.place is not None
    assert (result.place.kind, result.place.layer) == ("layer", "fc2")
    assert "dtype's largest value" in result.place.decided_by
