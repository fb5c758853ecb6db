"""The default replay runs only the passes its result needs: the same result as every pass.

``passes="auto"`` starts with one plain pass that watches the module outputs; a step that
stays finite and was not expected to fail stops there. Everything but the list of passes
must be what ``passes="all"`` (the instrumented pass, two repeats, float64) gives, and the
passes it did run must be the same passes, bit for bit.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from analyzer.model.replays import ReplayResult
from analyzer.replayer import replay_step
from analyzer.replayer.passes import run_step
from analyzer.replayer.state import (
    StepConfig,
    TrainState,
    _copied,
    clone_state,
    copy_module,
    nonfinite_state,
)
from analyzer.replayer.stats import is_finite
from analyzer.replayer.step import replay_call
from analyzer.replayer.steps import StepBatch, StepCall
from analyzer.scenarios import models


def _same_but_passes(auto: ReplayResult, every: ReplayResult) -> None:
    # compared as JSON-ready data, in which a NaN loss equals itself
    mine, theirs = auto.to_dict(), every.to_dict()
    ran, all_passes = mine.pop("passes"), theirs.pop("passes")
    assert mine == theirs
    by_label = {p["label"]: p for p in all_passes}
    # A default replay compares no pass with another bit for bit: no fingerprints.
    assert ran and all(p["fingerprint"] is None for p in ran)
    assert all(by_label[p["label"]] == {**p, "fingerprint": by_label[p["label"]]["fingerprint"]}
               for p in ran)


def _ce(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


class _Masked(nn.Module):
    """A mask's -inf inside the module: the output and gradients stay finite."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.fc(x).masked_fill(torch.eye(6, dtype=torch.bool), float("-inf"))
        return torch.softmax(scores, dim=-1)


Case = Callable[[], tuple[nn.Module, Any, Any, Any]]

HEALTHY: dict[str, Case] = {
    "mlp": lambda: (models.mlp(in_features=8, hidden=16, out_features=3, depth=2, seed=0),
                    torch.randn(5, 8), torch.randint(0, 3, (5,)), _ce),
    "cnn": lambda: (models.small_cnn(channels=1, classes=3, width=4, size=8, seed=0),
                    torch.randn(2, 1, 8, 8), torch.randint(0, 3, (2,)), _ce),
    "rnn": lambda: (models.rnn_classifier(in_features=3, hidden=8, classes=2, seed=0),
                    torch.randn(2, 5, 3), torch.randint(0, 2, (2,)), _ce),
    "dropout, loss module": lambda: (
        nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1)),
        torch.randn(6, 4), torch.randn(6, 1), nn.MSELoss()),
    "masked softmax": lambda: (_Masked(), torch.randn(6, 6), torch.randn(6, 6), nn.MSELoss()),
}


@pytest.mark.parametrize("name", list(HEALTHY))
def test_a_finite_step_is_one_pass_with_what_every_pass_would_say(name: str) -> None:
    torch.manual_seed(0)
    model, x, y, loss = HEALTHY[name]()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    auto = replay_step(model, x, y, loss, optimizer, expected=False)
    every = replay_step(model, x, y, loss, optimizer, expected=False, passes="all")
    assert every.verdict.kind == "finite"
    assert [p.label for p in auto.passes] == ["as-run #1"]
    _same_but_passes(auto, every)


def test_a_finite_step_under_autocast_with_a_scaler_is_one_pass() -> None:
    torch.manual_seed(0)
    model = models.mlp(in_features=8, hidden=16, out_features=3, depth=2, seed=0)
    x, y = torch.randn(5, 8), torch.randint(0, 3, (5,))
    args: dict[str, Any] = {"scaler": torch.amp.GradScaler("cpu"), "expected": False,
                            "autocast_dtype": torch.bfloat16}
    auto = replay_step(model, x, y, _ce, torch.optim.SGD(model.parameters(), lr=0.1), **args)
    every = replay_step(model, x, y, _ce, torch.optim.SGD(model.parameters(), lr=0.1),
                        passes="all", **args)
    assert [p.label for p in auto.passes] == ["as-run #1"]
    _same_but_passes(auto, every)


def test_accumulated_micro_batches_count_the_frames_of_the_watched_one() -> None:
    torch.manual_seed(0)
    model = models.mlp(in_features=8, hidden=16, out_features=3, depth=2, seed=0)
    micro = tuple({"inputs": torch.randn(4, 8), "targets": torch.randint(0, 3, (4,))}
                  for _ in range(3))
    call = StepCall("loss_fn", _ce)

    def run(passes: str) -> ReplayResult:
        return replay_call(model, StepBatch(micro), call,
                           [torch.optim.Adam(model.parameters(), lr=1e-3)], expected=False,
                           passes=passes)

    auto, every = run("auto"), run("all")
    assert auto.forward.frames == every.forward.frames > 0
    _same_but_passes(auto, every)


FAILING: dict[str, Case] = {
    "log of 0 in the loss": lambda: (
        models.mlp(in_features=8, hidden=16, out_features=3, depth=2, seed=0),
        torch.randn(5, 8), torch.randint(0, 3, (5,)),
        lambda out, y: _ce(out, y) + torch.log(out - out).mean()),
    "overflow in a layer": lambda: (
        nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)),
        torch.full((3, 4), 3e38), torch.randn(3, 1), nn.MSELoss()),
    "a NaN in the batch": lambda: (
        nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)),
        torch.tensor([[1.0, float("nan"), 0.0, 2.0]]), torch.randn(1, 1), nn.MSELoss()),
}


@pytest.mark.parametrize("name", list(FAILING))
def test_a_failing_step_says_what_every_pass_would_say(name: str) -> None:
    torch.manual_seed(0)
    model, x, y, loss = FAILING[name]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    auto = replay_step(model, x, y, loss, optimizer)
    every = replay_step(model, x, y, loss, optimizer, passes="all")
    assert every.phase is not None
    assert "as-run #2" not in {p.label for p in auto.passes}
    _same_but_passes(auto, every)
    # the float64 pass runs only where the verdict rests on it
    assert ("float64 (cpu)" in {p.label for p in auto.passes}) == (
        every.verdict.kind in ("math-fault", "range-overflow", "undecided"))


def _sqrt_at_zero(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(out - out).sum() + F.mse_loss(out, y)  # sqrt'(0) is inf


@pytest.mark.parametrize("name", ["sqrt at 0 in backward", *FAILING])
def test_anomaly_stacks_without_source_text_name_the_same_lines(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The instrumented pass writes anomaly mode's stacks without reading source lines: the
    # result must be the one torch's own stacks give.
    import contextlib

    from analyzer.replayer import passes

    def case() -> tuple[nn.Module, Any, Any, Any]:
        torch.manual_seed(0)
        if name in FAILING:
            return FAILING[name]()
        return (nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)),
                torch.randn(3, 4), torch.randn(3, 1), _sqrt_at_zero)

    def run() -> ReplayResult:
        model, x, y, loss = case()
        return replay_step(model, x, y, loss, torch.optim.SGD(model.parameters(), lr=0.1))

    bare = run()
    monkeypatch.setattr(passes, "bare_anomaly_stacks", contextlib.nullcontext)
    assert bare.to_dict() == run().to_dict()
    if name not in FAILING:
        first = bare.backward.first_param
        assert bare.phase == "backward" and first is not None
        assert bare.backward.origin is not None and bare.backward.origin.source_line == (
            "return torch.sqrt(out - out).sum() + F.mse_loss(out, y)  # sqrt'(0) is inf")


class _DoublesInPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h.add_(h.view_as(h))  # reads, through another view, the memory it writes


def test_an_in_place_op_reading_its_own_memory_is_judged_on_its_inputs_before_it_ran() -> None:
    # An in-place op's inputs are judged after it ran only when no input it reads shares
    # memory with what it writes: here the read view would already hold the op's inf.
    torch.manual_seed(0)
    model = _DoublesInPlace()
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.bias.fill_(3e38)  # finite; twice it is not
    result = replay_step(model, torch.randn(2, 4), torch.randn(2, 4), nn.MSELoss(),
                         torch.optim.SGD(model.parameters(), lr=0.1))
    op = result.forward_op
    assert op is not None and op.op == "add_.Tensor" and op.inputs_finite, op


def test_forensics_replay_takes_passes(capsys: pytest.CaptureFixture[str]) -> None:
    import json
    from pathlib import Path

    from analyzer.cli import main

    run = Path(__file__).resolve().parent.parent / "sample_runs" / "division_by_zero"
    if not (run / "capture").is_dir():
        pytest.skip("sample_runs/division_by_zero has no capture")
    labels = {}
    for passes in ("auto", "all"):
        assert main(["replay", str(run), "--passes", passes, "--json", "-"]) == 1
        labels[passes] = [p["label"] for p in json.loads(capsys.readouterr().out)["passes"]]
    assert labels == {"auto": ["as-run #1", "float64 (cpu)"],
                      "all": ["as-run #1", "as-run #2", "float64 (cpu)"]}


def test_an_unknown_passes_value_is_a_usage_error() -> None:
    from analyzer.errors import UsageError

    model = nn.Linear(2, 1)
    with pytest.raises(UsageError, match="--passes 'some'"):
        replay_step(model, torch.randn(3, 2), torch.randn(3, 1), nn.MSELoss(),
                    torch.optim.SGD(model.parameters(), lr=0.1), passes="some")


def test_the_op_traces_own_walk_of_arguments_is_pytrees() -> None:
    # stats.tensors_in and ops._with_copies walk plain tuples, lists and dicts themselves
    # and hand anything else to pytree: the same tensors, in the same order, either way.
    import collections

    from torch.utils._pytree import tree_leaves, tree_map

    from analyzer.replayer.ops import _clone_if, _with_copies
    from analyzer.replayer.stats import tensors_in

    a, b, c, d = (torch.randn(2) for _ in range(4))
    pair = collections.namedtuple("pair", "x y")
    nests: list[Any] = [
        ((a, [b, {"z": c, "y": None}]), {"out": d, "alpha": 2.0}),
        ([a, (b,)], {}), (pair(a, b), collections.OrderedDict(k=c, j=d)),
        ((torch.Size([2, 3]), torch.float32, torch.device("cpu"), "mean", True, 3), {"w": a}),
    ]
    ids = {id(b), id(d)}
    for nest in nests:
        leaves = [t for t in tree_leaves(nest) if isinstance(t, torch.Tensor)]
        assert [id(t) for t in tensors_in(nest)] == [id(t) for t in leaves]
        mine, theirs = _with_copies(nest, ids), tree_map(lambda v: _clone_if(v, ids), nest)
        assert type(mine) is type(theirs)
        kept = [t for t in tree_leaves(mine) if isinstance(t, torch.Tensor)]
        want = [t for t in tree_leaves(theirs) if isinstance(t, torch.Tensor)]
        assert all(torch.equal(x, y) for x, y in zip(kept, want, strict=True))
        assert all((x is o) == (id(o) not in ids) for x, o in zip(kept, leaves, strict=True))
        assert [type(v) for v in tree_leaves(mine)] == [type(v) for v in tree_leaves(theirs)]


def test_torch_gets_its_own_anomaly_stacks_back_after_nested_replays() -> None:
    import torch.fx.traceback as fx_traceback

    from analyzer.replayer.ops import bare_anomaly_stacks

    own = fx_traceback.format_stack
    with bare_anomaly_stacks():
        with bare_anomaly_stacks():
            assert fx_traceback.format_stack is not own
        assert fx_traceback.format_stack is not own  # the outer replay still runs
    assert fx_traceback.format_stack is own
    model, x, y, loss = FAILING["log of 0 in the loss"]()
    replay_step(model, x, y, loss, torch.optim.SGD(model.parameters(), lr=0.1))
    assert fx_traceback.format_stack is own


def test_fingerprint_tells_passes_apart_by_one_bit_and_by_where_tensors_end() -> None:
    from analyzer.replayer import passes

    def fingerprint(*tensors: torch.Tensor) -> str:
        parts: list[int] = []
        passes._digest(parts, list(tensors))
        return passes._fingerprint(parts)

    a = torch.linspace(-3, 3, 10_000)
    flipped = a.clone()
    flipped.view(torch.int32)[1234] ^= 1  # the last bit of one value
    assert fingerprint(a) == fingerprint(a.clone())
    assert fingerprint(a) != fingerprint(flipped)
    assert fingerprint(a[:10], a[10:]) != fingerprint(a[:11], a[11:])  # same bytes, cut elsewhere
    assert len(fingerprint(a)) == 16 and int(fingerprint(a), 16) >= 0
    # a strided view is fingerprinted by its values, as a contiguous copy of them
    assert fingerprint(a[::2]) == fingerprint(a[::2].contiguous())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_finiteness_is_told_apart_whatever_the_sum_does(dtype: torch.dtype) -> None:
    # A finite sum settles it; a sum that overflows on finite values must not read as Inf,
    # and +Inf beside -Inf (a NaN sum) or one NaN must read as non-finite.
    big = torch.finfo(dtype).max
    assert is_finite(torch.full((64,), big, dtype=dtype))
    assert is_finite(torch.tensor([big, -big, big], dtype=dtype))
    for bad in (math.inf, -math.inf, math.nan):
        x = torch.ones(1000, dtype=dtype)
        x[517] = bad
        assert not is_finite(x)
    pair = torch.zeros(8, dtype=dtype)
    pair[2], pair[5] = math.inf, -math.inf
    assert not is_finite(pair)
    assert not is_finite(torch.tensor([1 + 0j, complex(0, math.inf)]))
    assert is_finite(torch.arange(5))  # integers hold no NaN


def test_a_pass_copy_of_the_optimizer_shares_nothing_with_the_original() -> None:
    # The optimizer state is copied tensor by tensor: a pass that updates its moments
    # must leave the original's alone, and a tensor held twice stays one tensor.
    model = models.mlp(in_features=4, hidden=8, out_features=2, depth=2, seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    F.cross_entropy(model(torch.randn(5, 4)), torch.tensor([0, 1, 0, 1, 1])).backward()
    opt.step()
    state = opt.state_dict()
    shared = next(iter(state["state"].values()))["exp_avg"]
    state["extra"] = [shared, shared]
    copied = _copied(state, {})
    assert copied["extra"][0] is copied["extra"][1]
    assert copied["extra"][0] is not shared and torch.equal(copied["extra"][0], shared)
    before = {k: {n: v.clone() for n, v in s.items()} for k, s in opt.state_dict()["state"].items()}
    pass_state = clone_state(TrainState(model, opt), StepConfig())
    run_step(pass_state, StepBatch.pair(torch.randn(5, 4), torch.tensor([1, 1, 0, 0, 1])),
             StepCall("loss_fn", _ce), StepConfig())
    for key, slots in opt.state_dict()["state"].items():
        for name, value in slots.items():
            assert torch.equal(value, before[key][name])
    assert all(p is not q for p, q in zip(model.parameters(), pass_state.model.parameters(),
                                          strict=True))


class _FlatPair(nn.Module):
    """A model of two parameters."""

    def __init__(self) -> None:
        super().__init__()
        flat = torch.arange(8.0)
        self.a = nn.Parameter(flat[:4])
        self.b = nn.Parameter(flat[4:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a.sum() + self.b.mean()


def _same_storage(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


def test_a_pass_copy_keeps_views_of_one_buffer_views_of_one_copy() -> None:
    # Optimizer state viewing one buffer is deep-copied as it stands: a clone of each
    # apart would let the pass update one copy and read another. (Parameters are cloned
    # one by one, as Parameter.__deepcopy__ itself clones them.)
    model = _FlatPair()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(3)).sum().backward()
    opt.step()
    flat = torch.zeros(8)
    opt.state[model.a]["momentum_buffer"] = flat[:4]
    opt.state[model.b]["momentum_buffer"] = flat[4:]
    copy = clone_state(TrainState(model, opt), StepConfig())
    a, b = copy.model.a, copy.model.b
    assert not _same_storage(a, model.a)
    buffers = [copy.optimizer.state[p]["momentum_buffer"] for p in (a, b)]
    assert _same_storage(*buffers) and not _same_storage(buffers[0], flat)


def _form(value: Any, seen: dict[int, int], originals: set[int]) -> Any:
    """A comparable picture of ``value`` and everything it holds: which objects are one
    object (by order of first sight), types, values; and asserts that no tensor of a copy
    shares memory with the original (``originals``: the original's storages)."""
    if isinstance(value, (int, float, str, bytes, type(None), torch.dtype)):
        return value
    if id(value) in seen:
        return ("same", seen[id(value)])
    seen[id(value)] = len(seen)
    if isinstance(value, torch.Tensor):
        if originals and value.numel():
            assert value.untyped_storage().data_ptr() not in originals
        return (type(value).__name__, value.dtype, tuple(value.shape), value.requires_grad,
                value.detach().flatten().tolist())
    if isinstance(value, nn.Module):
        return (type(value).__name__, sorted(
            (k, _form(v, seen, originals)) for k, v in vars(value).items()))
    if isinstance(value, dict):
        return (type(value).__name__, [(k, _form(v, seen, originals)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_form(v, seen, originals) for v in value])
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, sorted(map(repr, value)))
    if isinstance(value, functools.partial):
        return ("partial", value.func.__qualname__, _form(value.args, seen, originals))
    if callable(value):
        return ("callable", getattr(value, "__qualname__", type(value).__name__))
    return (type(value).__name__, repr(value))


class _Tied(nn.Module):
    """Tied weights, a submodule held twice, a cycle back to the parent, a list of
    tensors and a hook: what a copy must keep as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.embed.weight
        self.block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.GELU())
        self.again = self.block
        self.norm = nn.BatchNorm1d(4)
        self.kept = [torch.ones(2), {"scale": torch.tensor(3.0)}]
        object.__setattr__(self.block, "owner", self)  # not a submodule: a plain cycle
        self.register_forward_hook(functools.partial(_noop_hook, tag="after"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.again(self.embed(x))))


def _noop_hook(module: nn.Module, args: Any, out: Any, tag: str = "") -> None:
    return None


class _OwnCopy(nn.Linear):
    """A module whose class copies itself its own way."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _OwnCopy:
        made = _OwnCopy(self.in_features, self.out_features)
        made.load_state_dict(self.state_dict())
        made.copied_by_own_method = True
        return made


@pytest.mark.parametrize("build", [
    lambda: models.mlp(in_features=4, hidden=8, out_features=2, depth=3, seed=0),
    lambda: models.small_cnn(channels=1, classes=3, width=4, size=8, seed=0),
    lambda: nn.LSTM(3, 5, num_layers=2),  # RNNBase has its own __setstate__: deepcopy's
    lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True),
    _Tied,
    lambda: nn.Sequential(_OwnCopy(2, 3), nn.Tanh()),
], ids=["mlp", "cnn", "lstm", "transformer", "tied", "own-deepcopy"])
def test_copy_module_makes_what_deepcopy_makes(build: Callable[[], nn.Module]) -> None:
    torch.manual_seed(0)
    model = build()
    originals = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    fast, deep = copy_module(model, {}), copy.deepcopy(model)
    assert _form(fast, {}, originals) == _form(deep, {}, originals)
    if isinstance(model, nn.Sequential) and isinstance(model[0], _OwnCopy):
        assert fast[0].copied_by_own_method
        return
    assert _form(fast, {}, set()) == _form(model, {}, set())
    if isinstance(model, _Tied):
        assert fast.head.weight is fast.embed.weight and fast.again is fast.block
        assert fast.block.owner is fast and fast.kept[0] is not model.kept[0]
        assert len(fast._forward_hooks) == 1


def _adam_state(model: nn.Module) -> torch.optim.Adam:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    F.cross_entropy(model(torch.randn(5, 4)), torch.tensor([0, 1, 0, 1, 1])).backward()
    opt.step()
    return opt


def test_a_step_that_starts_from_a_non_finite_moment_is_told_so() -> None:
    # exp_avg_sq = inf makes the update 0: the pass stays finite throughout, so only the
    # test of the starting state (made as the state is copied) can see it.
    model = models.mlp(in_features=4, hidden=8, out_features=2, depth=2, seed=0)
    opt = _adam_state(model)
    first = next(iter(model.parameters()))
    opt.state[first]["exp_avg_sq"][0, 0] = math.inf
    result = replay_step(model, torch.randn(5, 4), torch.tensor([1, 0, 1, 0, 1]), _ce, opt,
                         expected=False)
    assert result.verdict.kind == "bad-input"
    assert "optimizer state exp_avg_sq of" in result.verdict.summary


def test_the_starting_state_is_tested_again_once_changed_in_place() -> None:
    model = models.mlp(in_features=4, hidden=8, out_features=2, depth=2, seed=0)
    state = clone_state(TrainState(model, _adam_state(model)), StepConfig(), check_finite=True)
    assert nonfinite_state(state) == [] and state.checked
    name, param = next(iter(state.model.named_parameters()))
    with torch.no_grad():
        param[0] = math.nan
    moment = state.optimizer.state[param]["exp_avg"]
    moment[0] = math.inf
    assert nonfinite_state(state) == [name, f"optimizer state exp_avg of {name}"]


class _Distilled(nn.Module):
    """A student beside a frozen teacher run under inference mode: the teacher's outputs
    keep no version counter."""

    def __init__(self) -> None:
        super().__init__()
        self.teacher = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.student = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.teacher.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            target = self.teacher(x)
        return self.student(x) - target.clone()


def test_a_default_replay_reads_module_outputs_made_under_inference_mode() -> None:
    torch.manual_seed(0)
    model = _Distilled()
    opt = torch.optim.SGD(model.student.parameters(), lr=0.1)
    result = replay_step(model, torch.randn(3, 4), None, lambda out, _: out.pow(2).mean(), opt,
                         expected=False)
    assert result.verdict.kind == "finite", result.verdict
    assert [p.error for p in result.passes] == [None]
