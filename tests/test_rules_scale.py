"""The inputs' scale and the initial weights' scale read post hoc (analyzer.rules.evidence_scale),
and the three causes they tell apart: unnormalized inputs, bad initialisation and a learning
rate too high, which all blow a run up within a few steps.

Every run here is a real training of a tiny model in tmp_path, logged with torch's
SummaryWriter and saved with torch.save, as a user's loop would."""

from __future__ import annotations

import hashlib
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

import analyzer
from analyzer.model import Finding, Run, RunResult, Series
from analyzer.onset import locate
from analyzer.rules import evaluate
from analyzer.rules.evidence import RunEvidence
from analyzer.rules.evidence_scale import UNNORMALIZED_RMS, init_scales, input_scale

Batches = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(folder)): (p.stat().st_size,
                                         hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _train(run: Path, model: torch.nn.Module, batches: Batches, *, lr: float, steps: int,
           per_layer: bool = True, save_every: int | None = None, adam: bool = False,
           histograms: bool = False) -> None:
    """A plain loop: MSE regression, one optimizer step per batch; the loss, the total and
    per-parameter gradient norms (before the step), weight norms (after it) and the rate
    logged every step; a checkpoint every ``save_every`` steps; stops two steps after the
    loss went non-finite."""
    run.mkdir(parents=True)
    opt: torch.optim.Optimizer = (torch.optim.Adam(model.parameters(), lr=lr) if adam else
                                  torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
    writer = SummaryWriter(str(run))
    bad: int | None = None
    for step in range(steps):
        x, y = batches(step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
        loss.backward()  # type: ignore[no-untyped-call]
        named = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for _, p in named])
        writer.add_scalar("train/loss", loss.item(), step)
        writer.add_scalar("train/grad_norm", float(total), step)
        if per_layer:
            for n, p in named:
                writer.add_scalar(f"grad_norm/{n}", float(p.grad.norm()), step)  # type: ignore[union-attr]
        if histograms:
            for n, p in named:
                writer.add_histogram(f"grads/{n}", p.grad, step)
        opt.step()
        if per_layer:
            for n, p in named:
                writer.add_scalar(f"weight_norm/{n}", float(p.detach().norm()), step)
        writer.add_scalar("train/lr", lr, step)
        if save_every and step % save_every == save_every - 1:
            (run / "checkpoints").mkdir(exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "step": step}, run / "checkpoints" / f"step_{step}.pt")
        if not math.isfinite(loss.item()):
            bad = step if bad is None else bad
            if step >= bad + 2:
                break
    writer.close()


def _cnn(weight_scale: float = 1.0, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3), torch.nn.LeakyReLU(0.2), torch.nn.Conv2d(8, 8, 3),
        torch.nn.LeakyReLU(0.2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 1))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight"):
                p.mul_(weight_scale)
    return model


def _images(raw: bool, seed: int = 0) -> Batches:
    """8x8 grey images of 0-255 intensities, raw or standardized; a regression target."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (128, 1, 8, 8), generator=g).float()
    y = (x.mean((1, 2, 3)) - 127.5) / 10.0
    if not raw:
        x = (x - 127.5) / 73.9
    return lambda step: (x[(step % 4) * 32:(step % 4) * 32 + 32],
                         y[(step % 4) * 32:(step % 4) * 32 + 32])


def _features(raw: bool, shape: tuple[int, ...], seed: int = 0) -> Batches:
    """Standardized features, or counts around 200 that nobody scaled."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((64, *shape), generator=g)
    if raw:
        x = 200.0 + 60.0 * x
    y = torch.randn(64, generator=g)
    return lambda step: (x[(step % 2) * 32:(step % 2) * 32 + 32],
                         y[(step % 2) * 32:(step % 2) * 32 + 32])


class _Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(6, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(x)[0][:, -1])  # type: ignore[no-any-return]


class _Reversed(torch.nn.Module):
    """A first layer whose name sorts last: ``zz_in`` then ``aa_out``."""

    def __init__(self) -> None:
        super().__init__()
        self.zz_in = torch.nn.Linear(20, 16)
        self.aa_out = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.aa_out(torch.tanh(self.zz_in(x)))  # type: ignore[no-any-return]


def _analyze(run: Path) -> RunResult:
    return analyzer.analyze(str(run), replay=False).results[0]


def _failures(result: RunResult) -> list[Finding]:
    return [f for f in result.findings if f.role == "cause"]


def _rms(x: torch.Tensor) -> float:
    return float(x.pow(2).mean().sqrt())


@pytest.mark.parametrize("raw", [False, True], ids=["standardized", "raw"])
@pytest.mark.parametrize("kind", ["linear", "conv", "gru"])
def test_input_scale_reads_the_inputs_rms_from_a_real_first_layer(tmp_path: Path, kind: str,
                                                                  raw: bool) -> None:
    torch.manual_seed(1)
    model: torch.nn.Module
    if kind == "linear":
        model, batches = (torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(),
                                              torch.nn.Linear(32, 1)), _features(raw, (20,)))
    elif kind == "conv":
        model, batches = _cnn(), _images(raw)
    else:
        model, batches = _Recurrent(), _features(raw, (12, 6))
    _train(tmp_path / "run", model, batches, lr=1e-7, steps=3, save_every=3)
    scale = input_scale(RunEvidence(_analyze(tmp_path / "run")))
    assert scale is not None
    truth = _rms(batches(0)[0])
    assert (scale.rms >= UNNORMALIZED_RMS) is raw, scale.text()
    if kind != "gru":  # a recurrent layer's bias gradients cancel over time: a rougher reading
        assert truth / 3 < scale.rms < truth * 3, (scale.text(), truth)
    assert scale.fan_source.startswith("shapes in step_2.pt")


def test_without_a_checkpoint_the_first_norms_give_the_fan_in(tmp_path: Path) -> None:
    # PyTorch's default init draws weight and bias from one uniform: ‖W‖/‖b‖ = sqrt(fan_in)
    _train(tmp_path / "run", _cnn(), _images(True), lr=1e-7, steps=3)
    scale = input_scale(RunEvidence(_analyze(tmp_path / "run")))
    assert scale is not None and "default init" in scale.fan_source
    assert 9 / 2 < scale.fan_in < 9 * 2  # Conv2d(1, 8, 3): nine inputs per output
    assert scale.rms > UNNORMALIZED_RMS


def test_regression_first_layer_is_the_first_the_file_wrote_not_by_name(tmp_path: Path) -> None:
    # readers sort tags by name; aa_out sorted first read the hidden activations (~0.5)
    _train(tmp_path / "run", _Reversed(), _features(True, (20,)), lr=1e-7, steps=3)
    scale = input_scale(RunEvidence(_analyze(tmp_path / "run")))
    assert scale is not None and scale.param == "zz_in.weight"
    assert scale.rms > UNNORMALIZED_RMS


def test_gradient_histograms_read_the_inputs_scale(tmp_path: Path) -> None:
    # a histogram holds the tensor's sum of squares and element count: its norm and size
    for raw in (True, False):
        run = tmp_path / f"raw_{raw}"
        _train(run, _cnn(), _images(raw), lr=1e-7, steps=3, per_layer=False, histograms=True)
        scale = input_scale(RunEvidence(_analyze(run)))
        assert scale is not None and scale.grad_source.startswith("gradient histograms")
        assert scale.fan_in == 9 and scale.fan_source == "histograms' element counts"
        assert (scale.rms >= UNNORMALIZED_RMS) is raw, scale.text()


def test_a_checkpoint_that_starts_elsewhere_rules_out_a_later_layers_tags(
        tmp_path: Path) -> None:
    # per-layer tags of the head only: its inputs are activations, not the data
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1))
    run = tmp_path / "run"
    _train(run, model, _features(True, (20,)), lr=1e-7, steps=3, save_every=3)
    for tag in ("grad_norm/0.weight", "grad_norm/0.bias"):
        assert tag in {s.tag for s in _analyze(run).run.series}
    ev = RunEvidence(_analyze(run))
    ev.layer_grad_norms.pop("grad_norm/0.weight")
    ev.layer_grad_norms.pop("grad_norm/0.bias")
    scale = input_scale(ev)  # not the head's tags: the saved momentum of the first layer
    assert scale is not None and scale.param == "0.weight"
    assert scale.grad_source.startswith("momentum_buffer")


def test_a_bias_free_first_layer_gives_no_reading(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 16, bias=False), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1))
    _train(tmp_path / "run", model, _features(True, (20,)), lr=1e-7, steps=3, save_every=3)
    assert input_scale(RunEvidence(_analyze(tmp_path / "run"))) is None


@pytest.mark.parametrize("adam", [False, True], ids=["sgd-momentum", "adam"])
def test_optimizer_moments_in_a_checkpoint_read_the_inputs_scale(tmp_path: Path,
                                                                 adam: bool) -> None:
    # only totals logged: the saved momentum (or Adam's first moment) sums the same gradients
    for raw in (True, False):
        run = tmp_path / f"raw_{raw}"
        _train(run, _cnn(), _images(raw), lr=1e-7, steps=4, per_layer=False, save_every=4,
               adam=adam)
        scale = input_scale(RunEvidence(_analyze(run)))
        assert scale is not None
        assert scale.grad_source.startswith("exp_avg" if adam else "momentum_buffer")
        assert (scale.rms >= UNNORMALIZED_RMS) is raw, scale.text()


def test_regression_raw_pixels_that_blow_up_are_unnormalized_inputs_not_the_rate(
        tmp_path: Path) -> None:
    run = tmp_path / "raw"
    _train(run, _cnn(), _images(True), lr=0.01, steps=20, save_every=1)
    before = _snapshot(run)
    result = _analyze(run)
    assert result.incident is not None
    causes = _failures(result)
    top = causes[0]
    assert (top.name, top.confidence) == ("unnormalized-inputs", "medium")
    assert "inputs' RMS near" in top.evidence[0].text
    assert any(e.text.startswith("not seen") for e in top.evidence)
    assert all(f.confidence == "low" for f in causes
               if f.name in ("learning-rate-too-high", "bad-initialisation"))
    assert _snapshot(run) == before


def test_regression_weights_drawn_large_are_bad_initialisation_not_the_rate(
        tmp_path: Path) -> None:
    # early norms stay under bad-initialisation's 1e5 and grow for five steps, as a too
    # high rate's do: only the weights' first norms against their shape tell the two apart
    run = tmp_path / "big"
    _train(run, _cnn(weight_scale=8.0), _images(False), lr=1e-3, steps=20, save_every=5)
    result = _analyze(run)
    assert result.incident is not None
    ev = RunEvidence(result)
    first = init_scales(ev)[0]
    assert first.param == "0.weight" and first.ratio > 4  # drawn 8x the default
    top = _failures(result)[0]
    assert top.name == "bad-initialisation"
    assert "that PyTorch's default init gives this shape" in top.evidence[0].text
    scale = input_scale(ev)
    assert scale is not None and scale.rms < UNNORMALIZED_RMS


def test_default_init_is_not_read_as_oversized(tmp_path: Path) -> None:
    _train(tmp_path / "run", _cnn(), _images(False), lr=1e-3, steps=3, save_every=3)
    scales = init_scales(RunEvidence(_analyze(tmp_path / "run")))
    assert scales and all(0.3 < s.ratio < 1.5 for s in scales), [s.ratio for s in scales]


def test_a_rate_above_every_ceiling_stays_learning_rate_too_high(tmp_path: Path) -> None:
    # standardized inputs and the default init: a first norm that is sane, then the updates
    run = tmp_path / "lr"
    _train(run, _cnn(), _images(False), lr=3.0, steps=20, save_every=1)
    result = _analyze(run)
    assert result.incident is not None
    assert _failures(result)[0].name == "learning-rate-too-high"


def test_regression_totals_alone_tie_weights_and_inputs_too_large(tmp_path: Path) -> None:
    # only the loss, the total norm and the rate: a huge early norm is either scale's
    run = tmp_path / "raw"
    _train(run, _cnn(), _images(True), lr=0.01, steps=20, per_layer=False)
    result = _analyze(run)
    top, second = _failures(result)[:2]
    assert {top.name, second.name} == {"bad-initialisation", "unnormalized-inputs"}
    assert (top.confidence, top.score) == (second.confidence, second.score)
    assert (second.rank_note or "").startswith(
        "undetermined between bad-initialisation and unnormalized-inputs")


def test_raw_inputs_in_a_healthy_run_are_no_failure(tmp_path: Path) -> None:
    run = tmp_path / "slow"
    _train(run, _cnn(), _images(True), lr=1e-7, steps=6, save_every=3)
    result = _analyze(run)
    assert result.incident is None
    assert not [f for f in result.findings if f.role in ("cause", "symptom")]


SAMPLE_RUNS = Path(__file__).resolve().parent.parent / "sample_runs"


@pytest.mark.parametrize(("name", "cause", "confidence"), [
    ("unnormalized_inputs", "unnormalized-inputs", "medium"),
    # the checkpoint's shapes show weights 15x the default init's, with a first norm of 1e5
    ("bad_initialisation", "bad-initialisation", "high"),
    # raw features too, but a .half() model: float16's range is the nearer cause
    ("fp16_no_amp", "fp16-overflow", "medium"),
])
def test_regression_sample_scale_causes_without_capture(tmp_path: Path, name: str, cause: str,
                                                        confidence: str) -> None:
    run = tmp_path / name
    shutil.copytree(SAMPLE_RUNS / name, run, ignore=shutil.ignore_patterns("capture"))
    top = _failures(_analyze(run))[0]
    assert (top.name, top.confidence) == (cause, confidence)


def test_regression_a_huge_second_norm_at_a_sane_rate_is_tied_between_the_scales() -> None:
    def series(tag: str, values: list[float]) -> Series:
        n = len(values)
        return Series(tag=tag, steps=np.arange(n, dtype=np.int64),
                      values=np.asarray(values, dtype=np.float64), wall_times=np.zeros(n),
                      source="events", positions=np.arange(n, dtype=np.int64) * 40)

    nan = float("nan")
    run = Run(path="r", name="r", files=("events",), series=(
        series("train/grad_norm", [135.3, 3.3e7, math.inf, nan, nan]),
        series("train/loss", [24.4, 1.3e8, 2.3e28, nan, nan]),
        series("train/lr", [0.01] * 5)))
    result = locate(run)
    top, second = [f for f in result.findings or evaluate(result)[0] if f.role == "cause"][:2]
    assert {top.name, second.name} == {"bad-initialisation", "unnormalized-inputs"}
    assert (top.confidence, top.score) == (second.confidence, second.score)


def _constructed(loss_scale: list[float] | None, one_line: bool = False) -> list[Finding]:
    """A blow-up whose first layer reads inputs of RMS ~200 (‖∇W‖/‖∇b‖ = 800 against
    ‖W‖/‖b‖ = 4 at step 0), the per-parameter tags in the order a writer logs them."""
    n = 12
    rng = np.random.default_rng(0)  # float32-looking values, not float16-exact ones
    grads = [10.0 * 4.0 ** i * (1 + 0.1 * rng.random()) for i in range(n - 1)] + [math.inf]
    curves = {"train/loss": [1.3 * 4.0 ** i * (1 + 0.1 * rng.random())
                             for i in range(n - 1)] + [math.inf],
              "train/grad_norm": grads,
              "grad_norm/fc.weight": [g * 0.9 for g in grads],
              "grad_norm/fc.bias": [g * 0.9 / 800 for g in grads],
              "weight_norm/fc.weight": [2.0 + 0.1 * i for i in range(n)],
              "weight_norm/fc.bias": [0.5] * n,
              "train/lr": [0.01] * n}
    if loss_scale is not None:
        curves["amp/loss_scale"] = loss_scale
    series = tuple(Series(tag=tag, steps=np.arange(n, dtype=np.int64),
                          values=np.asarray(v, dtype=np.float64), wall_times=np.zeros(n),
                          source="events",
                          positions=np.arange(n, dtype=np.int64) * 1000 + (0 if one_line else k))
                   for k, (tag, v) in enumerate(curves.items()))
    result = locate(Run(path="r", name="r", files=("events",), series=series))
    return [f for f in result.findings or evaluate(result)[0] if f.role == "cause"]


def test_regression_a_unit_loss_scale_is_no_autocast_to_defer_to() -> None:
    # some log formats print "loss scale: 1.0" for every run: a disabled scaler
    for scale in (None, [1.0] * 12):
        top = _constructed(scale)[0]
        assert (top.name, top.confidence) == ("unnormalized-inputs", "medium")
    # a working scaler means float16 autocast: its range is the nearer cause
    nf402 = next(f for f in _constructed([65536.0] * 6 + [32768.0] * 6)
                 if f.name == "unnormalized-inputs")
    assert nf402.confidence == "low"


def test_parameters_on_one_log_line_have_no_order_to_read() -> None:
    # a text line holding every parameter's norm: which is first is not written down
    assert "unnormalized-inputs" not in [f.name for f in _constructed(None, one_line=True)]
