"""Checkpoint and histogram evidence in the precision causes (analyzer/rules/evidence_ckpt.py):
float16 weights, Adam's moments in float16 with an eps that rounds to 0, layers near 65504,
the first non-finite save, and a loss-scale series of 1.0, which is a disabled GradScaler.

Every run is a real tiny training written in tmp_path by torch's SummaryWriter and
torch.save; none is read from outside the test."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch

from analyzer.model import Finding, RunResult
from tests.readonly import analyse_read_only
from tests.test_evidence import mismatches

_analyze = analyse_read_only


def _top(result: RunResult) -> Finding | None:
    top = next((f for f in result.findings if f.role in ("cause", "symptom")), None)
    for e in top.evidence if top is not None else ():
        assert not mismatches(e, None), (e.text, mismatches(e, None))  # the text names its values
    return top


def _half_regression(folder: Path, *, scaler_enabled: bool | None, save: bool = True,
                     lr: float = 0.03, histograms: bool = False) -> None:
    """A float16 MLP regressed with SGD at a rate that makes it diverge: its gradients pass
    65504 and turn +inf in the backward pass at step 28. ``scaler_enabled`` None logs no
    loss scale; False logs a disabled GradScaler's get_scale()."""
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1)).half()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scaler = torch.amp.GradScaler("cpu", enabled=bool(scaler_enabled))
    writer = SummaryWriter(str(folder))
    g = torch.Generator().manual_seed(1)
    for step in range(60):
        x = (4 * torch.randn(64, 16, generator=g)).half()
        y = 3 * torch.randn(64, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        writer.add_scalar("train/loss", loss.item(), step)
        writer.add_scalar("train/grad_norm", norm.item(), step)
        if scaler_enabled is not None:
            writer.add_scalar("train/loss_scale", scaler.get_scale(), step)
        if histograms:
            for name, p in model.named_parameters():
                assert p.grad is not None
                if torch.isfinite(p.grad).all():  # the writer refuses a histogram of inf
                    writer.add_histogram(f"grads/{name}", p.grad.float(), step)
        scaler.step(opt)
        scaler.update()
        if save and step % 10 == 9:
            (folder / "checkpoints").mkdir(exist_ok=True)
            torch.save({"model": model.state_dict(), "global_step": step},
                       folder / "checkpoints" / f"step_{step}.pt")
        if not math.isfinite(loss.item()):
            break
    writer.close()


def test_a_disabled_grad_scaler_reports_a_scale_of_one() -> None:
    # The premise of the change below, from torch itself: get_scale() is 1.0 when disabled.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.amp.GradScaler("cpu", enabled=False).get_scale() == 1.0
        assert torch.amp.GradScaler("cpu").get_scale() == 2.0 ** 16


def test_regression_fp16_overflow_in_the_backward_pass_under_a_unit_loss_scale(
        tmp_path: Path) -> None:
    # The gradients pass 65504 first (the loss is float32); before, only a forward failure
    # counted, and a logged scale of 1.0 blocked the reading as if a scaler were on.
    disabled, unlogged = tmp_path / "disabled", tmp_path / "unlogged"
    _half_regression(disabled, scaler_enabled=False, save=False)
    _half_regression(unlogged, scaler_enabled=None, save=False)
    tops = {folder.name: _top(_analyze(folder)) for folder in (disabled, unlogged)}
    for name, top in tops.items():
        assert top is not None and top.name == "fp16-overflow", name
        assert top.confidence == "medium"
        assert any(e.text.startswith("not seen") for e in top.evidence)
    top = tops["disabled"]
    assert top is not None
    scale = [e for e in top.evidence if e.subject == "train/loss_scale"]
    assert scale and "disabled GradScaler" in scale[0].text and scale[0].value == 1.0


def test_a_loss_scale_that_moves_still_leaves_fp16_overflow_to_the_scaler_rules() -> None:
    import numpy as np

    from analyzer.model import Run, Series
    from analyzer.onset import locate
    from analyzer.rules import evaluate

    rng = np.random.default_rng(0)
    grads = [float(np.float16(0.5 * 1.6 ** i + 0.01 * rng.random())) for i in range(20)]
    losses = [float(np.float16(1.0 + 0.01 * rng.random() + 0.1 * i)) for i in range(20)]

    def series(tag: str, values: list[float]) -> Series:
        n = len(values)
        return Series(tag=tag, steps=np.arange(n, dtype=np.int64), values=np.array(values),
                      wall_times=np.zeros(n), source="events",
                      positions=np.arange(n, dtype=np.int64) * 40)

    common = (series("train/loss", [*losses, math.nan]),
              series("train/grad_norm", [*grads, math.nan]))
    for scale, fires in (([1.0] * 21, True), ([2.0 ** 16] * 10 + [2.0 ** 15] * 11, False)):
        run = Run(path="r", name="r", files=("events",),
                  series=(*common, series("train/loss_scale", scale)))
        result = locate(run)
        names = [f.name for f in result.findings or evaluate(result)[0]]
        assert ("fp16-overflow" in names) is fires, (scale[0], names)


def test_checkpoints_show_float16_weights_and_the_first_non_finite_save(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _half_regression(run, scaler_enabled=False)
    top = _top(_analyze(run))
    assert top is not None and top.name == "fp16-overflow"
    texts = [e.text for e in top.evidence]
    assert any("of the model's floating weights are float16" in t for t in texts), texts
    first = [e for e in top.evidence if "first save with non-finite values" in e.text]
    assert first and first[0].step == 29 and "last finite save is step 19" in first[0].text
    assert first[0].location is not None and first[0].location.file.endswith("step_29.pt")


def _frozen_backbone_adam(folder: Path, dtype: torch.dtype, save: bool = True,
                          saves: tuple[int, ...] = (4, 9), norms: bool = True) -> None:
    """A head trained alone with Adam(eps=1e-8), its backbone unfrozen at step 6. An input
    feature is always 0, so the backbone's weights on it get a gradient of exactly 0; in
    float16 eps rounds to 0 and their update is 0/0, while loss and gradients are finite."""
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1)).to(dtype)
    model[0].requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8)
    writer = SummaryWriter(str(folder))
    g = torch.Generator().manual_seed(1)
    (folder / "checkpoints").mkdir(parents=True)
    for step in range(12):
        if step == 6:
            model[0].requires_grad_(True)
        x = torch.randn(32, 8, generator=g)
        x[:, 0] = 0.0
        y = torch.randn(32, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        opt.step()
        writer.add_scalar("train/loss", loss.item(), step)
        writer.add_scalar("train/grad_norm", norm.item(), step)
        for name, p in model.named_parameters():
            if norms:
                writer.add_scalar(f"weight_norm/{name}", p.detach().float().norm().item(), step)
        if save and step in saves:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "global_step": step}, folder / "checkpoints" / f"step_{step}.pt")
        if not math.isfinite(loss.item()):
            break
    writer.close()


def test_regression_float16_adam_state_in_a_checkpoint_makes_adam_eps_high(
        tmp_path: Path) -> None:
    half, single = tmp_path / "half", tmp_path / "single"
    _frozen_backbone_adam(half, torch.float16)
    _frozen_backbone_adam(single, torch.float32)
    result = _analyze(half)
    top = _top(result)
    assert top is not None and top.name == "adam-eps-too-small", [f.name for f in result.findings]
    assert top.confidence == "high"
    adam = [e for e in top.evidence if e.subject == "optimizer"]
    assert adam and adam[0].value == 1e-8 and "eps = 0" in adam[0].text
    assert adam[0].location is not None and adam[0].location.file.endswith("step_4.pt")
    assert any(e.text.startswith("not seen: the op") for e in top.evidence)
    assert not [f for f in _analyze(single).findings if f.is_failure]


def test_float32_adam_with_zero_second_moments_is_no_half_adam(tmp_path: Path) -> None:
    from analyzer.rules.evidence import RunEvidence
    from analyzer.rules.evidence_ckpt import half_adam, half_weights

    single = tmp_path / "single"
    _frozen_backbone_adam(single, torch.float32)
    ev = RunEvidence(_analyze(single))
    scans = ev.result.run.checkpoints
    assert scans is not None and any(a.v_zero for s in scans.scans for a in s.adam)
    assert half_adam(ev) is None and half_weights(ev) is None  # eps survives in float32


def test_regression_a_save_at_the_failure_shows_the_update_with_only_the_loss_logged(
        tmp_path: Path) -> None:
    # No weight norms: the loss goes NaN at step 7 and the curves alone say forward. The
    # save of step 6 holds NaN weights beside finite Adam moments: the update wrote them.
    run = tmp_path / "half"
    _frozen_backbone_adam(run, torch.float16, saves=(4, 6), norms=False)
    result = _analyze(run)
    top = _top(result)
    assert top is not None and top.name == "adam-eps-too-small", [f.name for f in result.findings]
    assert top.confidence == "high"
    wrote = [e for e in top.evidence if e.subject == "optimizer update"]
    assert wrote and wrote[0].step == 6 and wrote[0].tensor == "0.weight"
    assert not any("went non-finite at step" in e.text for e in top.evidence)


def test_without_its_checkpoints_nothing_shows_the_float16_update(tmp_path: Path) -> None:
    # Seven gradient norms are too few to read float16 from the curves and the loss is
    # float32: the checkpoints are what decided the cause above.
    run = tmp_path / "half"
    _frozen_backbone_adam(run, torch.float16, save=False)
    result = _analyze(run)
    assert result.incident is not None
    assert "adam-eps-too-small" not in [f.name for f in result.findings]


def test_float16_weights_near_65504_in_the_last_finite_save(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from analyzer.rules.evidence import RunEvidence
    from analyzer.rules.evidence_ckpt import near_limit

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    writer = SummaryWriter(str(run))
    for i in range(12):
        writer.add_scalar("train/loss", math.nan if i == 11 else 1.0 + 0.01 * i, i)
    writer.close()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).half()
    with torch.no_grad():
        model[1].weight[0, 0] = 9000.0  # 7.3 times below float16's largest
    torch.save({"model": model.state_dict(), "global_step": 9}, run / "checkpoints" / "s.pt")
    near = near_limit(RunEvidence(_analyze(run)))
    assert [n.layer for n in near] == ["1"] and near[0].abs_max == 9000.0
    assert "9000, 14% of float16's largest" in near[0].evidence().text


def _drifting_activations(folder: Path, *, log_scale: bool = False) -> None:
    """A float16 layer trained on readings whose scale doubles every step, its output's
    histogram and its float16 gradient norm logged: the activations climb to 65504 and the
    forward overflows. ``log_scale`` logs a disabled GradScaler's get_scale()."""
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).half()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scaler = torch.amp.GradScaler("cpu", enabled=False)
    writer = SummaryWriter(str(folder))
    g = torch.Generator().manual_seed(1)
    for step in range(30):
        x = (torch.randn(32, 16, generator=g) * 2.0 ** step).half()
        out = model(x)
        loss = out.float().pow(2).mean().sqrt()
        opt.zero_grad()
        scaler.scale(loss).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        scaler.step(opt)
        scaler.update()
        writer.add_scalar("train/loss", loss.item(), step)
        writer.add_scalar("train/grad_norm", norm.item(), step)
        if log_scale:
            writer.add_scalar("train/loss_scale", scaler.get_scale(), step)
        if torch.isfinite(out).all():  # the writer refuses a histogram of inf
            writer.add_histogram("activations/fc", out.detach().float(), step)
        if not math.isfinite(loss.item()):
            break
    writer.close()


def test_regression_a_unit_loss_scale_does_not_hide_a_forward_fp16_overflow(
        tmp_path: Path) -> None:
    # The forward overflows (loss and gradient norm go at the same step) in a model whose
    # float16 gradient norms show it, and a disabled scaler logged 1.0 throughout: before,
    # that series was taken for a dynamic scaler and the run got no cause.
    run = tmp_path / "run"
    _drifting_activations(run, log_scale=True)
    result = _analyze(run)
    top = _top(result)
    assert top is not None and top.name == "fp16-overflow", [f.name for f in result.findings]
    # a disabled scaler skipped nothing: no warm-up note read from its constant 1.0
    assert "loss-scale-warm-up" not in [f.name for f in result.findings]
    subjects = {e.subject for e in top.evidence}
    assert {"train/loss_scale", "activations/fc"} <= subjects, subjects


def test_activation_histograms_approaching_65504_in_a_float16_model(tmp_path: Path) -> None:
    from analyzer.rules.evidence import RunEvidence
    from analyzer.rules.evidence_ckpt import histogram_peaks

    run = tmp_path / "run"
    _drifting_activations(run)
    ev = RunEvidence(_analyze(run))
    assert ev.onset is not None
    step = ev.onset.step
    peaks = histogram_peaks(ev, "float16", step)
    assert [e.subject for e in peaks] == ["activations/fc"]
    assert peaks[0].step == step - 1 and peaks[0].value is not None
    assert 65504 / 16 <= peaks[0].value < 65504
    assert histogram_peaks(ev, "float16", step - 4) == []  # 16 times smaller 4 steps before
    assert histogram_peaks(ev, "bfloat16", step) == []


def test_gradient_histograms_far_from_65504_are_no_peak(tmp_path: Path) -> None:
    # The regression run's logged gradients stay below 1000 until the backward overflows
    # inside an op: the histograms do not show the overflow coming, and say nothing.
    from analyzer.rules.evidence import RunEvidence
    from analyzer.rules.evidence_ckpt import histogram_peaks

    run = tmp_path / "run"
    _half_regression(run, scaler_enabled=None, save=False, histograms=True)
    ev = RunEvidence(_analyze(run))
    assert ev.result.run.histograms and ev.onset is not None
    assert histogram_peaks(ev, "float16", ev.onset.step) == []


def _autocast_drift(folder: Path, *, log_scale: bool) -> None:
    """float32 weights under CPU autocast to float16 with a GradScaler, on readings whose
    scale drifts up 1.5 times a step: the forward overflows float16 more and more often, the
    scaler halves its scale on every step, and the loss turns NaN at step 19. The scaler's
    state is saved every 5 steps."""
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    writer = SummaryWriter(str(folder))
    g = torch.Generator().manual_seed(1)
    (folder / "checkpoints").mkdir(parents=True)
    for step in range(40):
        x = torch.randn(64, 16, generator=g) * (10.0 * 1.5 ** step)
        y = torch.randn(64, 1, generator=g)
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        if log_scale:
            writer.add_scalar("train/loss_scale", scaler.get_scale(), step)
        scaler.step(opt)
        scaler.update()
        writer.add_scalar("train/loss", loss.item(), step)
        if step % 5 == 4:
            torch.save({"model": model.state_dict(), "scaler": scaler.state_dict(),
                        "global_step": step}, folder / "checkpoints" / f"step_{step}.pt")
        if not math.isfinite(loss.item()):
            break
    writer.close()


def test_regression_a_scale_collapse_read_from_the_saved_scaler_state(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _autocast_drift(run, log_scale=False)
    result = _analyze(run)
    top = _top(result)
    assert top is not None and top.name == "loss-scale-collapse", [f.name for f in result.findings]
    assert top.confidence == "medium"  # four saves are a sparse view of the scale
    saved = [e for e in top.evidence if "saved in the checkpoints" in e.text]
    assert saved and saved[0].value is not None and saved[0].value < 1.0
    assert saved[0].location is not None and saved[0].location.file.endswith("step_19.pt")
    assert "fp16-overflow" not in [f.name for f in result.findings]  # the scaler was on
    assert any(e.text.startswith("not seen: the scale") for e in top.evidence)


def test_float16_weights_with_float32_masters_are_no_half_model(tmp_path: Path) -> None:
    # DeepSpeed's fp16 engine saves float16 module weights and keeps float32 masters in
    # its optimizer partitions: the update runs in float32, not in a .half() model.
    from analyzer.rules.evidence import RunEvidence
    from analyzer.rules.evidence_ckpt import half_weights, weight_dtype

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).half()
    engine, plain = tmp_path / "engine", tmp_path / "plain"
    (engine / "global_step10").mkdir(parents=True)
    plain.mkdir()
    torch.save({"module": model.state_dict(), "global_steps": 10, "ds_version": "0.16.4",
                "ds_config": {"fp16": {"enabled": True}}},
               engine / "global_step10" / "mp_rank_00_model_states.pt")
    torch.save({"model": model.state_dict(), "global_step": 10}, plain / "step_10.pt")
    for folder, half in ((engine, False), (plain, True)):
        ev = RunEvidence(_analyze(folder))
        found = weight_dtype(ev)
        assert found is not None and found.dtype == "float16", folder.name
        assert (half_weights(ev) is not None) is half, folder.name
