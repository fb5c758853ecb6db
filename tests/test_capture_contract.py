"""Capture format 2 from the recorder's side: batches kept exactly, factories checked when the
recorder starts, a raised step captured, gradient accumulation recorded as it ran."""

from __future__ import annotations

import importlib
import sys
from collections import UserDict
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from analyzer.capture import CaptureSetupError, FlightRecorder, read_meta
from analyzer.capture.batch import keepable
from analyzer.model import LOSS_NAME
from analyzer.replayer import replay
from analyzer.scenarios import models

MLP = "analyzer.scenarios.models:mlp"
KW = {"in_features": 3, "hidden": 4, "out_features": 1}
MSE = "analyzer.scenarios.losses:mse"


def _load(path: Path) -> Any:
    return torch.load(path, weights_only=True, map_location="cpu")


class _Opaque:
    pass


def test_a_batch_of_any_nest_is_kept_as_it_was() -> None:
    x = torch.randn(2, 3)
    batch = {"pair": (x, torch.tensor([1, 2])), "names": ["a", "b"], "n": 3, "scale": 0.5,
             "flag": True, "none": None, "nested": [{"ids": torch.arange(4)}]}
    kept, dropped = keepable(batch)
    assert dropped == []
    assert isinstance(kept["pair"], tuple) and isinstance(kept["names"], list)
    assert torch.equal(kept["pair"][0], x) and kept["pair"][0] is not x
    assert kept["n"] == 3 and kept["scale"] == 0.5 and kept["flag"] is True
    assert torch.equal(kept["nested"][0]["ids"], torch.arange(4))


def test_a_mapping_type_becomes_a_dict_and_an_object_is_dropped_by_name(tmp_path: Path) -> None:
    kept, dropped = keepable(UserDict({"input_ids": torch.ones(2, 3), "meta": _Opaque()}))
    assert type(kept) is dict and kept["meta"] is None
    assert dropped == ["batch['meta'] (_Opaque)"]
    torch.save(kept, tmp_path / "b.pt")  # what weights_only reads back
    back = _load(tmp_path / "b.pt")
    assert torch.equal(back["input_ids"], torch.ones(2, 3)) and back["meta"] is None


def test_a_factory_that_builds_another_model_fails_when_the_recorder_starts(
        tmp_path: Path) -> None:
    model = models.mlp(**KW)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CaptureSetupError, match=r"does not build the model being trained.*"
                                                r"builds fc1.bias as \(8,\), the live "
                                                r"model has \(4,\)"):
        FlightRecorder(tmp_path, model, opt, model_factory=MLP,
                       model_kwargs={**KW, "hidden": 8}, loss_factory=MSE)
    with pytest.raises(CaptureSetupError, match="cannot build the model"):
        FlightRecorder(tmp_path, model, opt, model_factory="analyzer.scenarios.models:nothing",
                       loss_factory=MSE)
    with pytest.raises(CaptureSetupError, match="say how the step computes its loss"):
        FlightRecorder(tmp_path, model, opt, model_factory=MLP, model_kwargs=KW)
    assert not (tmp_path / "capture").exists()


def test_a_step_that_raises_is_captured_with_the_error(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = models.mlp(**KW)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = FlightRecorder(tmp_path, model, opt, model_factory=MLP, model_kwargs=KW,
                         loss_factory=MSE)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    x[0, 0] = float("nan")
    with pytest.raises(FloatingPointError), rec.step(inputs=x, targets=y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        if not torch.isfinite(loss):  # a loop that stops before handing over its loss
            raise FloatingPointError("loss is nan")
    meta = read_meta(tmp_path / "capture" / "step_0")
    assert meta["trigger"]["what"] == "error" and meta["trigger"]["kind"] == "nan"
    assert meta["trigger"]["error"] == "FloatingPointError: loss is nan"
    result = replay(str(tmp_path))
    assert result.phase == "forward" and result.verdict.kind == "bad-input"


def test_an_unrelated_error_is_not_a_capture(tmp_path: Path) -> None:
    model = models.mlp(**KW)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = FlightRecorder(tmp_path, model, opt, model_factory=MLP, model_kwargs=KW,
                         loss_factory=MSE)
    with pytest.raises(KeyError), rec.step(inputs=torch.randn(2, 3), targets=torch.randn(2, 1)):
        raise KeyError("label")
    assert not rec.captured and rec.active


def test_accumulation_records_the_failing_micro_batch_and_the_divisor(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = models.mlp(**KW)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = FlightRecorder(tmp_path, model, opt, model_factory=MLP, model_kwargs=KW,
                         loss_factory=MSE, accumulation=3)
    good = [(torch.randn(2, 3), torch.randn(2, 1)) for _ in range(2)]
    bad = (torch.full((2, 3), float("nan")), torch.randn(2, 1))
    with rec.step(inputs=good[0][0], targets=good[0][1]) as r:
        opt.zero_grad()
        for i, (x, y) in enumerate([good[0], bad, good[1]]):
            if i:
                r.micro_batch(inputs=x, targets=y)
            loss = torch.nn.functional.mse_loss(model(x), y)
            r.loss(loss)
            (loss / 3).backward()
        opt.step()
    folder = tmp_path / "capture" / "step_0"
    meta = read_meta(folder)
    assert meta["trigger"]["micro_batch"] == 1
    assert meta["accumulation"] == {"micro_batches": 3, "divide": True, "divisor": 3,
                                    "failing": 1, "configured": 3}
    saved = _load(folder / "batch.pt")
    assert len(saved["micro_batches"]) == 3 and torch.isnan(saved["inputs"]).all()
    result = replay(str(tmp_path))
    assert result.phase == "forward" and result.verdict.kind == "bad-input"
    assert "the batch inputs of micro-batch 1" in result.verdict.summary
    assert result.forward.bad_inputs == ("inputs",)




def _project_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                    source: str) -> ModuleType:
    """A module of the user's project folder (not of this tool's tree, whose modules a
    replay refuses), imported as a training script run from that folder would."""
    project = tmp_path / "project"
    project.mkdir()
    (project / f"{name}.py").write_text(source, encoding="utf-8")
    monkeypatch.syspath_prepend(str(project))
    return importlib.import_module(name)

CHECKED_STEP = """
import torch


def checked_step():
    # A step function that stops on a non-finite loss, as many training loops do.
    def step(model, batch):
        out = model(batch["x"])
        loss = torch.log(out.abs().clamp(max=0.0)).mean()  # log(0) for every row
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()}")
        return loss
    return step
"""


def test_a_step_that_raises_on_its_own_nan_is_replayed_to_the_op(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkedsteps = _project_module(tmp_path, monkeypatch, "checkedsteps", CHECKED_STEP)

    torch.manual_seed(0)
    model = models.mlp(**KW)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = tmp_path / "run"
    rec = FlightRecorder(run, model, opt, model_factory=MLP, model_kwargs=KW,
                         step_factory=checkedsteps.checked_step)
    step = checkedsteps.checked_step()
    batch = {"x": torch.randn(4, 3)}
    with pytest.raises(FloatingPointError), rec.step(batch=batch):
        step(model, batch)
    meta = read_meta(run / "capture" / "step_0")
    assert meta["step_call"]["kind"] == "step_fn"
    assert meta["step_call"]["factory"]["factory"] == "checkedsteps:checked_step"
    monkeypatch.delitem(sys.modules, "checkedsteps")
    result = replay(str(run))  # the recorder trusted the project folder: no flag
    assert result.phase == "forward"
    assert result.forward_op is not None and result.forward_op.op == "log.default"
    assert result.forward_op.module == LOSS_NAME  # the step function's own code
    assert "FloatingPointError: loss is -inf" in (result.update.note or "")
    assert result.verdict.kind == "math-fault", result.verdict
    assert meta["trigger"]["kind"] == "-inf"


def test_a_run_whose_only_evidence_is_its_capture_is_a_failed_run(tmp_path: Path) -> None:
    from analyzer.pipeline import analyze

    torch.manual_seed(0)
    model = models.mlp(**KW)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = FlightRecorder(tmp_path, model, opt, model_factory=MLP, model_kwargs=KW,
                         loss_factory=MSE)
    for step in range(3):
        x, y = torch.randn(4, 3), torch.randn(4, 1)
        if step == 2:
            x[1] = float("inf")
        with rec.step(step, x, y) as r:  # nothing logged: no event file, no log
            r.loss(torch.nn.functional.mse_loss(model(x), y))
    report = analyze(str(tmp_path), replay=False)
    (result,) = report.results
    assert result.failed and result.incident is not None
    assert (result.incident.step, result.incident.tag, result.incident.origin) == \
        (2, "train/loss", "capture")
    assert result.incident.location.file.endswith("step_2/meta.json")


COUNTED_LOSS = """
import torch
from torch import nn


class CountedLoss(nn.Module):
    # A model that returns its own loss, summed and divided by a token count it is given,
    # as Hugging Face models that take loss kwargs are (num_items_in_batch).
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3, bias=False)

    def forward(self, x, labels, num_items_in_batch):
        h = self.fc(x)
        h = h / h.norm(dim=-1, keepdim=True)  # 0/0 on a zero row
        return {"loss": ((h - labels) ** 2).sum() / num_items_in_batch}
"""


def test_regression_a_token_count_in_the_batch_is_not_an_input_scale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch of an HF model that takes loss kwargs holds num_items_in_batch, a 0-dim
    float tensor (25.0): a count, not a sample, so no unnormalized-inputs finding."""
    from analyzer.pipeline import analyze

    countednets = _project_module(tmp_path, monkeypatch, "countednets", COUNTED_LOSS)

    torch.manual_seed(0)
    model = countednets.CountedLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = tmp_path / "run"
    rec = FlightRecorder(run, model, opt, step_kind="model_loss")
    x = torch.randn(4, 3)
    x[2] = 0.0
    batch = {"x": x, "labels": torch.zeros(4, 3), "num_items_in_batch": torch.tensor(25.0)}
    with rec.step(batch=batch) as r:
        r.loss(model(**batch)["loss"])
    monkeypatch.delitem(sys.modules, "countednets")
    (result,) = analyze(str(run)).results
    assert result.replay is not None and result.replay.verdict.kind == "math-fault"
    codes = [f.code for f in result.findings]
    assert "NF402" not in codes, codes
    assert result.findings[0].name == "division-by-zero"


def test_regression_a_training_steps_targets_are_not_its_inputs() -> None:
    """A whole batch (x, y) of a step function: the batch's statistics, which the inputs'
    scale is read from, are those of x, not of the targets beside it."""
    from analyzer.replayer.step import replay_call
    from analyzer.replayer.steps import StepBatch, StepCall

    torch.manual_seed(0)
    model = models.mlp(**KW)
    x, y = torch.randn(4, 3), torch.full((4, 1), 190.0)
    x[0] = float("nan")

    def step(m: torch.nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return torch.nn.functional.mse_loss(m(inputs), targets)

    result = replay_call(model, StepBatch(({"batch": (x, y)},)), StepCall("step_fn", step),
                         [torch.optim.SGD(model.parameters(), lr=0.1)])
    assert [s.shape for s in result.forward.batch] == [(4, 3)]
    labelled = replay_call(model, StepBatch(({"batch": {"x": x, "labels": y}},)),
                           StepCall("step_fn", lambda m, b: step(m, (b["x"], b["labels"]))),
                           [torch.optim.SGD(model.parameters(), lr=0.1)])
    assert [s.shape for s in labelled.forward.batch] == [(4, 3)]


NORMED = """
from torch import nn


def normed():
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 1))
"""


def test_regression_a_layernorm_whose_variance_overflowed_is_no_zero_variance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs of 1e22 after a divergence: LayerNorm's variance overflows float32 and its
    output is NaN, while in float64 the same op on the same inputs is finite. That is no
    normalisation of a zero variance (NF105)."""
    from analyzer.pipeline import analyze

    normednets = _project_module(tmp_path, monkeypatch, "normednets", NORMED)

    torch.manual_seed(0)
    model = normednets.normed()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = tmp_path / "run"
    rec = FlightRecorder(run, model, opt, model_factory=normednets.normed, loss_factory=MSE)
    x, y = torch.randn(4, 4) * 1e22, torch.randn(4, 1)
    with rec.step(inputs=x, targets=y) as r:
        r.loss(torch.nn.functional.mse_loss(model(x), y))
    monkeypatch.delitem(sys.modules, "normednets")
    (result,) = analyze(str(run)).results
    assert result.replay is not None and result.replay.op is not None
    assert result.replay.op.module == "1" and result.replay.op.float64_finite is True
    assert "NF105" not in [f.code for f in result.findings]


def test_a_capture_incident_takes_its_last_finite_step_from_the_logged_loss(
        tmp_path: Path, summary_run: Any) -> None:
    """The capture is the first witness of step 3; the run's own loss curve, finite through
    step 2 under another name (train_loss), gives the last finite step."""
    from analyzer.pipeline import analyze

    summary_run({"train_loss": [1.0, 0.9, 0.8]}, name="run")
    run = tmp_path / "run"
    torch.manual_seed(0)
    model = models.mlp(**KW)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = FlightRecorder(run, model, opt, model_factory=MLP, model_kwargs=KW,
                         loss_factory=MSE)
    x, y = torch.full((2, 3), float("nan")), torch.zeros(2, 1)
    with rec.step(3, x, y) as r:
        r.loss(torch.nn.functional.mse_loss(model(x), y))
    (result,) = analyze(str(run), replay=False).results
    assert result.incident is not None and result.incident.origin == "capture"
    assert (result.incident.step, result.incident.last_finite_step) == (3, 2)
