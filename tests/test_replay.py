"""Replay of live training steps: each test breaks a small real model in one known way."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from analyzer.errors import ForensicsError
from analyzer.model.replays import ReplayResult
from analyzer.replayer import ReplayError, replay_step
from analyzer.report.replay import format_replay

THIS_FILE = __file__


def _line_of(text: str) -> str:
    """``file:line`` of the line in this file that contains ``text``."""
    with open(THIS_FILE, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if text in line and "_line_of" not in line:
                return f"{THIS_FILE}:{number}"
    raise AssertionError(text)


class SoftmaxThenLog(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.head = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.fc(x), dim=-1)
        return self.head(torch.log(probs))  # log-of-softmax


class Normalise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.sum(dim=-1, keepdim=True)  # divide-by-row-sum


class DivNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.act = nn.ReLU()
        self.norm = Normalise()
        self.out = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.act(self.fc(x))))


class Distance(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 2)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        diff = self.embed(a) - self.embed(b)
        return torch.sqrt(diff.pow(2).sum(dim=-1))  # euclidean-distance


class TwoLayer(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.act = nn.ReLU()
        self.b = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.act(self.a(x)))


def nll(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.nll_loss(outputs, targets)


def mean_loss(outputs: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    return outputs.float().mean()


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_log_of_underflowed_softmax_is_a_math_fault_in_the_module_forward() -> None:
    model = SoftmaxThenLog()
    with torch.no_grad():
        model.fc.weight.mul_(1e4)  # logits far enough apart to underflow even in float64
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    result = replay_step(model, x, y, nll, _sgd(model))
    assert result.phase == "forward"
    assert result.layer == "(model)"
    assert result.op is not None and result.op.op == "log.default"
    assert result.op.source == _line_of("# log-of-softmax")
    assert result.op.inputs[0].absmin == 0.0  # the zero it took the log of
    assert result.op.outputs[0].neginf > 0
    roles = {f.name: f.role for f in result.forward.window}
    assert roles["fc"] == "finite" and roles["(model)"] == "producer"
    assert roles["(loss)"] == "pass-through"
    assert result.verdict.kind == "math-fault"
    assert "log" in result.verdict.hypothesis


def test_division_by_a_zero_row_sum_names_the_normalising_module() -> None:
    model = DivNet()
    with torch.no_grad():
        model.fc.bias.fill_(-100.0)  # ReLU then zeroes whole rows
    x = torch.randn(6, 3)
    result = replay_step(model, x, None, mean_loss, _sgd(model))
    assert result.phase == "forward"
    assert result.layer == "norm"
    assert result.forward.producer is not None and result.forward.producer.type == "Normalise"
    assert result.op is not None and result.op.op == "div.Tensor"
    assert result.op.module == "norm"
    assert result.op.source == _line_of("# divide-by-row-sum")
    assert result.op.inputs[1].absmax == 0.0
    assert result.verdict.kind == "math-fault"
    assert "division by zero" in result.verdict.hypothesis


def test_sqrt_at_zero_fails_in_backward_with_the_forward_line_of_the_node() -> None:
    model = Distance()
    a = torch.randn(5, 3)
    b = a.clone()
    b[2:] += 1.0  # the first two pairs coincide: distance 0
    result = replay_step(model, [a, b], None, mean_loss, _sgd(model))
    assert result.forward.finite
    assert result.phase == "backward"
    origin = result.backward.origin
    assert origin is not None
    assert origin.autograd_node == "SqrtBackward0"
    assert origin.module == "(model)"
    assert origin.source == _line_of("# euclidean-distance")
    assert origin.inputs_finite
    first = result.backward.first_param
    assert first is not None and first.name.startswith("embed.")
    assert first.module == "embed"
    assert set(result.backward.bad_params) == {"embed.weight", "embed.bias"}
    assert result.update.ran is False
    assert result.verdict.kind == "math-fault"


def test_float16_overflow_in_a_half_linear_layer_is_a_range_overflow() -> None:
    model = TwoLayer()
    with torch.no_grad():
        model.a.weight.fill_(100.0)
    model = model.half()
    x = torch.full((4, 8), 100.0, dtype=torch.float16)  # 8 * 100 * 100 > 65504
    result = replay_step(model, x, None, mean_loss, _sgd(model))
    assert result.phase == "forward"
    assert result.layer == "a"
    assert result.op is not None and result.op.op.startswith("addmm")
    assert result.op.module == "a"
    assert result.op.inputs_finite and all(s.dtype == "float16" for s in result.op.inputs)
    assert result.op.outputs[0].posinf > 0
    assert result.dtype == "float16"
    assert result.verdict.kind == "range-overflow"
    f64 = result.passes[-1]
    assert f64.dtype == "float64" and f64.phase is None


def test_adam_eps_that_rounds_to_zero_in_float16_breaks_the_update() -> None:
    model = nn.Linear(4, 1).half()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-10)
    x = torch.full((2, 4), 1e-3, dtype=torch.float16)  # grad^2 underflows in float16
    result = replay_step(model, x, None, mean_loss, optimizer)
    assert result.forward.finite and result.backward.finite
    assert result.phase == "update"
    assert result.update.ran
    bad = {p.name: p for p in result.update.params}
    assert "weight" in bad
    reason = bad["weight"].reason
    assert "eps=1e-10 rounds to 0 in float16" in reason
    assert "exp_avg_sq is 0" in reason
    assert result.op is not None and result.op.phase == "update"
    assert result.op.parameter in bad
    assert result.layer == "(model)"  # a bare Linear: the model itself owns the weight
    # addcdiv divides by exactly 0 whatever the precision; the 0 itself came from
    # float16 underflow, which the whole-step float64 pass shows by staying finite
    assert result.op.float64_finite is False
    assert result.verdict.kind == "math-fault"
    assert "limited range of float16" in result.verdict.summary
    assert result.passes[-1].phase is None


def test_nan_in_the_batch_is_bad_input_seen_first_in_the_layer_reading_it() -> None:
    model = TwoLayer()
    x = torch.randn(4, 8)
    x[1, 3] = float("nan")
    result = replay_step(model, x, None, mean_loss, _sgd(model))
    assert result.phase == "forward"
    assert result.forward.bad_inputs == ("inputs",)
    assert result.forward.producer is None
    assert result.forward.first_nonfinite is not None
    assert result.forward.first_nonfinite.role == "pass-through"
    assert result.layer == "a"  # the first layer that read the bad value
    assert result.op is not None and not result.op.inputs_finite
    assert result.op.op.startswith("addmm") and result.op.float64_finite is None
    assert result.verdict.kind == "bad-input"


class Flaky(nn.Module):
    """Goes NaN on every other call, the way a racy kernel might."""

    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Flaky.calls += 1
        out = self.fc(x)
        return out * float("nan") if Flaky.calls % 2 == 1 else out


def test_a_step_that_fails_only_sometimes_is_not_reproducible() -> None:
    Flaky.calls = 0
    model = Flaky()
    result = replay_step(model, torch.randn(2, 3), None, mean_loss, _sgd(model),
                         passes="all")
    phases = {p.phase for p in result.passes[:2]}
    assert phases == {None, "forward"}
    assert result.verdict.kind == "not-reproducible"
    assert "deterministic" in result.verdict.next_check
    # by default the plain pass and the instrumented pass are the two runs compared
    Flaky.calls = 0
    result = replay_step(model, torch.randn(2, 3), None, mean_loss, _sgd(model))
    assert [p.phase for p in result.passes] == ["forward"]
    assert result.verdict.kind == "not-reproducible"
    assert "instrumented: finite" in result.verdict.summary


def test_a_healthy_step_is_finite_or_unreproduced() -> None:
    model = TwoLayer()
    x = torch.randn(4, 8)
    result = replay_step(model, x, None, mean_loss, _sgd(model), expected=False,
                         passes="all")
    assert result.phase is None and result.verdict.kind == "finite"
    assert result.passes[0].fingerprint == result.passes[1].fingerprint
    # by default a step that stays finite is one plain pass, and the same result otherwise
    light = replay_step(model, x, None, mean_loss, _sgd(model), expected=False)
    assert [p.label for p in light.passes] == ["as-run #1"]
    # the same pass, without the fingerprint that only a comparison of passes needs
    assert light.passes[0].fingerprint is None
    assert light.passes[0] == dataclasses.replace(result.passes[0], fingerprint=None)
    assert dataclasses.replace(light, passes=result.passes) == result
    again = replay_step(model, x, None, mean_loss, _sgd(model))
    assert again.verdict.kind == "not-reproducible"


def test_replay_leaves_the_callers_objects_and_random_state_alone() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(8, 4)
    torch_rng, py_rng = torch.get_rng_state(), random.getstate()
    for passes in ("auto", "all"):
        result = replay_step(model, x, None, mean_loss, optimizer, expected=False,
                             passes=passes)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        assert all(p.grad is None for p in model.parameters())
        assert optimizer.state_dict()["state"] == {}
        assert torch.equal(torch.get_rng_state(), torch_rng) and random.getstate() == py_rng
    # dropout draws the same mask in every pass because the RNG is restored for each
    assert result.passes[0].fingerprint == result.passes[1].fingerprint


def test_passes_do_not_share_optimizer_state_with_the_caller() -> None:
    model = TwoLayer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 8)
    for _ in range(2):  # give it momentum buffers
        optimizer.zero_grad()
        mean_loss(model(x), None).backward()
        optimizer.step()
    buffers = [s["momentum_buffer"].clone() for s in optimizer.state.values()]
    result = replay_step(model, x, None, mean_loss, optimizer, expected=False, passes="all")
    assert all(torch.equal(b, s["momentum_buffer"])
               for b, s in zip(buffers, optimizer.state.values(), strict=True))
    assert result.passes[0].fingerprint == result.passes[1].fingerprint


def test_grad_scaler_and_autocast_are_replayed() -> None:
    model = TwoLayer()
    with torch.no_grad():
        model.a.weight.fill_(1000.0)
    x = torch.full((4, 8), 10.0)  # 8 * 1000 * 10 = 80000: beyond float16 under autocast
    scaler = torch.amp.GradScaler("cpu")
    result = replay_step(model, x, None, mean_loss, _sgd(model), scaler=scaler,
                         autocast_dtype=torch.float16)
    assert result.autocast == "float16"
    assert result.phase == "forward" and result.layer == "a"
    assert result.op is not None and result.op.outputs[0].dtype == "float16"
    assert result.verdict.kind == "range-overflow"


def test_reports_render_and_serialise() -> None:
    model = DivNet()
    with torch.no_grad():
        model.fc.bias.fill_(-100.0)
    result = replay_step(model, torch.randn(6, 3), None, mean_loss, _sgd(model))
    text = format_replay(result)
    assert "verdict: math-fault" in text
    assert "aten.div.Tensor" in text and "module  norm" in text
    assert "divide-by-row-sum" in text  # the source line is quoted
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["layer"] == "norm" and data["op"]["op"] == "div.Tensor"
    assert data["verdict"]["kind"] == "math-fault"
    assert data["forward"]["loss"] == "nan"
    assert isinstance(result, ReplayResult)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none here")
def test_float16_overflow_replays_on_cuda() -> None:
    model = TwoLayer()
    with torch.no_grad():
        model.a.weight.fill_(100.0)
    model = model.half()
    x = torch.full((4, 8), 100.0, dtype=torch.float16)
    result = replay_step(model, x, None, mean_loss, _sgd(model), device="cuda")
    assert result.device == "cuda"
    assert result.phase == "forward" and result.layer == "a"
    assert result.verdict.kind == "range-overflow"
    assert [p.device for p in result.passes] == ["cuda", "cuda", "cpu"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none here")
def test_sqrt_at_zero_backward_on_cuda() -> None:
    model = Distance()
    a = torch.randn(5, 3)
    b = a.clone()
    b[2:] += 1.0
    result = replay_step(model, [a, b], None, mean_loss, _sgd(model), device="cuda")
    assert result.phase == "backward"
    assert result.backward.origin is not None
    assert result.backward.origin.autograd_node == "SqrtBackward0"
    assert result.verdict.kind == "math-fault"


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.reshape(-1, 5))


def test_a_step_that_raises_is_a_clear_error_not_a_traceback() -> None:
    model = Broken()
    with pytest.raises(ReplayError, match="RuntimeError during forward") as err:
        replay_step(model, torch.randn(4, 3), None, mean_loss, _sgd(model))
    assert isinstance(err.value, ForensicsError)


def test_a_dtype_override_replays_a_half_model_in_float64() -> None:
    model = TwoLayer()
    with torch.no_grad():
        model.a.weight.fill_(100.0)
    model = model.half()
    x = torch.full((4, 8), 100.0, dtype=torch.float16)
    result = replay_step(model, x, None, mean_loss, _sgd(model), dtype="float64",
                         passes="all")
    assert result.dtype == "float64" and result.phase is None
    # float16 failed and float64 stays finite: float16's range, not a fault of the machine
    assert result.verdict.kind == "range-overflow"
    assert [p.label for p in result.passes][:2] == ["float64 #1", "float64 #2"]


class _ReusesFreedMemory(nn.Module):
    """Its forward fills memory with NaN, frees it, and takes it back with torch.empty: the
    bytes an uninitialised tensor starts with are whatever was there (dropout's mask is
    drawn into such memory too)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        junk = torch.full((4096,), float("nan"))
        del junk
        buf = torch.empty(4096)
        buf.fill_(1.0)
        return self.fc(x) * buf[:64]  # type: ignore[no-any-return]


def test_regression_uninitialised_memory_is_never_the_op_that_made_a_nan() -> None:
    torch.manual_seed(0)
    model = _ReusesFreedMemory()
    result = replay_step(model, torch.randn(8, 64), torch.randn(8, 64), nn.MSELoss(),
                         torch.optim.SGD(model.parameters(), lr=0.1), expected=False,
                         passes="all")
    assert result.verdict.kind == "finite"
    assert result.forward_op is not None and result.forward_op.op == "full.default"


def test_regression_adamw_replays() -> None:
    """torch's AdamW keeps decoupled_weight_decay among its defaults, which its __init__
    does not take: each pass's copy of the optimizer must not hand it back."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    x = torch.randn(5, 3)
    x[2] = float("nan")
    result = replay_step(model, x, torch.randn(5, 1), nn.MSELoss(),
                         torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1))
    assert result.verdict.kind == "bad-input" and result.phase == "forward"


class _DividesBetweenLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 4, bias=False)
        self.fc2 = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        return self.fc2(h / h.norm(dim=1, keepdim=True))  # type: ignore[no-any-return]


def test_regression_backward_places_an_op_of_the_models_own_code_in_the_model() -> None:
    """The division runs in the model's forward before fc2 is called: its backward node is
    the model's, not fc2's (fc2's walk back from its output used to claim it)."""
    torch.manual_seed(0)
    model = _DividesBetweenLayers()
    x = torch.randn(4, 3)
    x[1] = 0.0
    result = replay_step(model, x, torch.randn(4, 1), nn.MSELoss(),
                         torch.optim.SGD(model.parameters(), lr=0.1))
    assert result.forward_op is not None and result.forward_op.module == "(model)"
    assert result.backward.origin is not None and result.backward.origin.module == "(model)"
