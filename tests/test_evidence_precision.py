"""The run's one precision reading (analyzer/rules/evidence_precision.py): the dtype its model
computes in and from what, and whether a dynamic loss scaler ran, read once for every rule.

Every run is written in tmp_path by torch's SummaryWriter, torch.save and a YAML file as
Lightning writes its hparams.yaml; none is read from outside the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from analyzer.rules.evidence import RunEvidence
from analyzer.rules.evidence_precision import PrecisionReading, float16_model, precision
from tests.readonly import analyse_read_only


def _run(folder: Path, losses: list[float], scales: list[float] | None = None,
         hparams: str | None = None) -> RunEvidence:
    """A run that logged ``losses`` (and ``scales`` as its loss scale from step 0)."""
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(str(folder))
    for step, loss in enumerate(losses):
        writer.add_scalar("train/loss", loss, step)
    for step, scale in enumerate(scales or []):
        writer.add_scalar("train/loss_scale", scale, step)
    writer.close()
    if hparams is not None:
        (folder / "hparams.yaml").write_text(hparams, encoding="utf-8")
    return RunEvidence(analyse_read_only(folder))


def _steady_losses(n: int = 30, nan_at: int = 25) -> list[float]:
    """A flat float32 loss (no float16 number among its values) that turns NaN at once."""
    rng = np.random.default_rng(0)
    out = [float(0.6931 + 1e-3 * rng.standard_normal()) for _ in range(n)]
    out[nan_at:] = [float("nan")] * (n - nan_at)
    return out


def _read(ev: RunEvidence) -> PrecisionReading:
    first = precision(ev)
    assert precision(ev) is first  # read once per run
    return first


def test_a_scale_of_one_at_every_step_is_a_disabled_scaler(tmp_path: Path) -> None:
    reading = _read(_run(tmp_path / "r", _steady_losses(), scales=[1.0] * 30))
    assert reading.scaler.state == "disabled"
    assert reading.scaler.why == "train/loss_scale is 1.0 at every logged step"
    assert reading.half_words() is None  # a disabled scaler says nothing of float16


def test_a_scale_that_moved_is_a_working_scaler(tmp_path: Path) -> None:
    scales = [65536.0] * 5 + [32768.0] * 5 + [16384.0] * 5
    reading = _read(_run(tmp_path / "r", _steady_losses(), scales=scales))
    assert reading.scaler.state == "dynamic" and reading.scaler.skips  # read from the drops
    assert reading.half_words() == ("train/loss_scale is logged with values other than 1.0 "
                                    "(float16 autocast)")
    assert not reading.half_model  # autocast keeps the model's weights float32


def test_regression_a_one_point_scale_of_one_is_unknown_to_every_rule(tmp_path: Path) -> None:
    # One logged 1.0 is what a disabled scaler shows and also one at its floor: it was a
    # dynamic scaler to fp16-overflow and no scaler to unnormalized-inputs.
    reading = _read(_run(tmp_path / "r", _steady_losses(), scales=[1.0]))
    assert reading.scaler.state == "unknown" and reading.half_words() is None


def test_regression_a_non_finite_point_among_ones_is_unknown(tmp_path: Path) -> None:
    # Finite points all 1.0 beside a NaN: no rule may read it as disabled while another
    # reads it as a scaler at work.
    ev = _run(tmp_path / "r", _steady_losses(), scales=[1.0] * 10 + [float("nan")])
    assert _read(ev).scaler.state == "unknown"


def test_no_scale_logged_is_no_scaler(tmp_path: Path) -> None:
    reading = _read(_run(tmp_path / "r", _steady_losses()))
    assert reading.scaler.state == "none" and reading.scaler.why is None
    assert reading.compute == () and reading.model is None and not reading.half_model


def test_skips_in_a_log_are_a_working_scaler(tmp_path: Path) -> None:
    folder = tmp_path / "r"
    _run(folder, _steady_losses())
    (folder / "train.log").write_text(
        "".join(f"step {i} loss 0.69\n" for i in range(5))
        + "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0\n",
        encoding="utf-8")
    ev = RunEvidence(analyse_read_only(folder))
    if not ev.events("overflow_skip"):
        raise AssertionError("the log's skip line was not read as a skip")
    reading = _read(ev)
    assert reading.scaler.state == "dynamic" and reading.scaler.skips
    assert reading.half_words() == "the loss scaler skipped overflowing steps (float16 autocast)"


def test_a_saved_scaler_state_is_a_working_scaler(tmp_path: Path) -> None:
    # GradScaler.state_dict() is empty when the scaler is disabled: a saved scale means
    # it ran, even where no scale was logged.
    folder = tmp_path / "r"
    _run(folder, _steady_losses())
    scaler = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5,
              "growth_interval": 2000, "_growth_tracker": 3}
    model = torch.nn.Linear(4, 2)
    torch.save({"model": model.state_dict(), "scaler": scaler, "global_step": 20},
               folder / "step_20.pt")
    reading = _read(RunEvidence(analyse_read_only(folder)))
    assert reading.scaler.state == "dynamic"
    assert reading.scaler.why is not None and "scale 1024" in reading.scaler.why


def test_regression_float16_weights_make_a_sudden_nan_unsteady(tmp_path: Path) -> None:
    # The sudden-NaN reading (a steady run that turns NaN at once) ignored a checkpoint's
    # float16 weights, which every precision rule reads as a float16 model.
    from analyzer.rules.evidence_sudden import _steady

    folder = tmp_path / "r"
    _run(folder, _steady_losses())
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)).half()
    torch.save({"model": model.state_dict(), "global_step": 20}, folder / "step_20.pt")
    ev = RunEvidence(analyse_read_only(folder))
    reading = _read(ev)
    assert reading.model is None and reading.weights is not None and reading.half_model
    assert reading.half_words() == reading.weights.evidence().text
    assert [c.dtype for c in reading.compute] == ["float16"]
    assert ev.onset is not None and not _steady(ev, ev.onset)
    plain = _run(tmp_path / "plain", _steady_losses())
    assert plain.onset is not None and _steady(plain, plain.onset)  # float32: steady


def test_configured_precisions(tmp_path: Path) -> None:
    cases = {"16-true": ("float16", False), "bf16-true": ("bfloat16", False),
             "16-mixed": ("float16", True), "bf16-mixed": ("bfloat16", True)}
    for name, (dtype, masters) in cases.items():
        ev = _run(tmp_path / name, _steady_losses(), hparams=f"precision: {name}\n")
        reading = _read(ev)
        meta = ev.result.run.metadata
        assert meta is not None and meta.text("precision") == name, name
        assert [(c.dtype, c.masters) for c in reading.compute] == [(dtype, masters)], name
        half = dtype == "float16" and not masters
        assert reading.half_model is half and (float16_model(ev) is not None) is half, name
        assert f"precision={name}" in reading.compute[0].why


def test_float16_exact_curves_are_a_float16_model(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    losses = [float(np.float16(0.5 + 0.3 * rng.random())) for _ in range(40)]
    reading = _read(_run(tmp_path / "r", losses))
    assert reading.model is not None and "exactly representable in float16" in reading.model
    assert reading.compute[0].dtype == "float16" and not reading.compute[0].masters


def test_regression_float16_weights_defer_unnormalized_inputs_to_the_range(
        tmp_path: Path) -> None:
    # unnormalized-inputs lowers itself in a float16 run (float16's range is the nearer
    # cause) but read the model's dtype only from its configuration and curves, not from
    # a checkpoint whose weights are float16 without float32 masters.
    from tests.test_rules_scale import _cnn, _failures, _images, _train

    run = tmp_path / "raw"
    _train(run, _cnn(), _images(True), lr=0.01, steps=20, save_every=1)
    before = next(f for f in _failures(analyse_read_only(run)) if f.name == "unnormalized-inputs")
    assert before.confidence == "medium"
    saves = sorted((run / "checkpoints").glob("step_*.pt"), key=lambda p: int(p.stem[5:]))
    last = torch.load(saves[-1], weights_only=True)
    last["model"] = {k: v.half() for k, v in last["model"].items()}
    torch.save(last, saves[-1])
    ev = RunEvidence(analyse_read_only(run))
    assert _read(ev).weights is not None
    after = next(f for f in _failures(ev.result) if f.name == "unnormalized-inputs")
    assert after.confidence == "low"
    assert any(e.subject == "dtype" and "float16" in e.text for e in after.evidence)


def test_a_deepspeed_fp16_engine_computes_in_float16_beside_float32_masters(
        tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).half()
    save = tmp_path / "engine" / "global_step10"
    save.mkdir(parents=True)
    torch.save({"module": model.state_dict(), "global_steps": 10, "ds_version": "0.16.4",
                "ds_config": {"fp16": {"enabled": True}}}, save / "mp_rank_00_model_states.pt")
    reading = _read(RunEvidence(analyse_read_only(tmp_path / "engine")))
    assert [(c.dtype, c.masters) for c in reading.compute] == [("float16", True)]
    assert "precision=fp16" in reading.compute[0].why
    assert not reading.half_model and reading.weights is None


def test_a_trainers_fp16_flag_is_autocast(tmp_path: Path) -> None:
    ev = _run(tmp_path / "r", _steady_losses(), hparams="fp16: true\nbf16: false\n")
    meta = ev.result.run.metadata
    assert meta is not None and meta.flag("fp16") is True
    reading = _read(ev)
    assert [(c.dtype, c.masters) for c in reading.compute] == [("float16", True)]
    assert not reading.half_model
