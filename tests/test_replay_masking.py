"""A mask's -inf is written on purpose: the replay names the op that turns it into NaN.

Real tiny attention models (``nn.MultiheadAttention`` with a key padding mask, a causal
mask kept as a buffer of 0 and -inf with ``torch.where`` for padding, a float mask passed
in with the batch) train under the real flight recorder until a padded row sees no key;
each capture is then replayed from its folder. The models' factories live in a module
written to tmp_path and imported only through ``import_paths``.
"""

from __future__ import annotations

import hashlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import analyzer
from analyzer.capture import FlightRecorder
from analyzer.replayer import replay, replay_step
from analyzer.report.replay import format_replay
from analyzer.scenarios import losses

VOCAB, DIM, LENGTH, BATCH = 8, 8, 6, 4

MODELS = '''
import torch
from torch import nn


class PaddedMha(nn.Module):
    """Embeddings through nn.MultiheadAttention whose key padding mask is token 0."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.embed(tokens)
        out, _ = self.attn(h, h, h, key_padding_mask=tokens == 0)
        return self.head(h + out)


class BufferedCausal(nn.Module):
    """Causal attention written out: the causal mask a buffer of 0 and -inf, padding keys
    removed with torch.where(pad, -inf, scores)."""

    def __init__(self, vocab, dim, length):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("causal", torch.full((length, length), float("-inf")).triu(1))

    def forward(self, tokens):
        h = self.embed(tokens)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) + self.causal
        scores = torch.where((tokens == 0).unsqueeze(1), float("-inf"), scores)
        return self.head(h + torch.softmax(scores, dim=-1) @ v)


class CallerMasked(nn.Module):
    """Attention whose additive float mask (0 and -inf) comes in with the batch."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens, mask):
        h = self.embed(tokens)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) + mask
        return self.head(h + torch.softmax(scores, dim=-1) @ v)


def padded_mha(vocab=8, dim=8, seed=0):
    torch.manual_seed(seed)
    return PaddedMha(vocab, dim)


def buffered_causal(vocab=8, dim=8, length=6, seed=0):
    torch.manual_seed(seed)
    return BufferedCausal(vocab, dim, length)


def caller_masked(vocab=8, dim=8, seed=0):
    torch.manual_seed(seed)
    return CallerMasked(vocab, dim)
'''


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("code")
    (folder / "masknets.py").write_text(textwrap.dedent(MODELS), encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("masknets", None)


def _batch(step: int, fail_at: int, padding: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    tokens = torch.randint(1, VOCAB, (BATCH, LENGTH), generator=gen)
    if step == fail_at:
        if padding == "all":
            tokens[0] = 0  # a sequence of padding only: none of its queries sees a key
        else:
            tokens[0, :2] = 0  # left padding: the first query sees only padding
    targets = tokens.roll(-1, dims=1)
    targets[tokens == 0] = -1  # the loss ignores padded positions
    return tokens, targets


def _additive(tokens: torch.Tensor) -> torch.Tensor:
    """A float mask of 0 and -inf: causal, and no padding key."""
    causal = torch.ones(LENGTH, LENGTH, dtype=torch.bool).triu(1)
    masked = causal | (tokens == 0).unsqueeze(1)
    return torch.zeros(masked.shape).masked_fill(masked, float("-inf"))


def _train(run: Path, factory: str, kwargs: dict[str, Any], padding: str,
           with_mask: bool = False, fail_at: int = 3) -> Path:
    import masknets  # type: ignore[import-not-found]

    model = getattr(masknets, factory)(**kwargs)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = losses.lm_cross_entropy()
    rec = FlightRecorder(run, model, opt, model_factory=f"masknets:{factory}",
                         model_kwargs=kwargs,
                         loss_factory="analyzer.scenarios.losses:lm_cross_entropy", seed=0,
                         check_grads=True, check_params=True)
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run))
    for step in range(8):
        tokens, targets = _batch(step, fail_at, padding)
        inputs: Any = (tokens, _additive(tokens)) if with_mask else tokens
        with rec.step(step, inputs, targets) as r:
            opt.zero_grad(set_to_none=True)
            out = model(*inputs) if with_mask else model(inputs)
            loss = loss_fn(out, targets)
            r.loss(loss)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            writer.add_scalar("train/loss", loss.item(), step)
            writer.add_scalar("train/grad_norm", float(norm), step)
            opt.step()
        if rec.captured:
            break
    writer.close()
    assert rec.captured, rec.errors
    return run


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(folder)): (p.stat().st_size,
                                         hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def mha_run(code: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("runs") / "mha", "padded_mha",
                  {"vocab": VOCAB, "dim": DIM}, "all")


def _assert_masked_softmax(result: Any) -> None:
    report = format_replay(result)
    op = result.op
    assert op is not None, report
    assert op.op.startswith("_softmax"), report
    assert op.inputs_finite and op.float64_finite is False, report
    assert op.outputs[0].nan and op.inputs[0].neginf and not op.inputs[0].nan, report
    assert op.mask is not None and op.mask.outputs[0].neginf, report
    assert result.verdict.kind == "math-fault", report
    assert "mask" in result.verdict.hypothesis, report
    assert "mask    aten." in report


def test_regression_a_fully_masked_softmax_replay_names_the_softmax_not_the_mask(
        mha_run: Path, code: Path) -> None:
    # nn.MultiheadAttention turns a boolean key padding mask into -inf with masked_fill_;
    # a sequence of padding only gives a row of -inf that the softmax turns into NaN
    result = replay(str(mha_run), import_paths=[str(code)])
    _assert_masked_softmax(result)
    assert result.op is not None and result.op.mask is not None
    assert result.op.mask.op.startswith("masked_fill")
    assert result.phase == "forward" and result.layer == "attn"


def test_regression_a_nan_row_the_loss_ignores_is_no_disagreement_between_passes(
        code: Path, tmp_path: Path) -> None:
    # the NaN row is padding that cross-entropy ignores: the loss is finite, the gradients
    # are NaN; the instrumented pass must judge the forward as the plain passes do (by the
    # loss), not by its module outputs, or the step reads as one that does not reproduce
    run = _train(tmp_path / "causal", "buffered_causal",
                 {"vocab": VOCAB, "dim": DIM, "length": LENGTH}, "left")
    result = replay(str(run), import_paths=[str(code)])
    own = [p for p in result.passes if p.label.startswith("as-run")]
    assert result.forward.loss is not None and all(p.phase == "backward" for p in own)
    assert result.verdict.kind != "not-reproducible", format_replay(result)
    _assert_masked_softmax(result)


def test_regression_a_causal_mask_buffer_is_a_mask_not_a_fault(
        code: Path, tmp_path: Path) -> None:
    # the buffer of 0 and -inf is read by the add of the scores: the first op that sees
    # -inf without a fill value of its own; it is still the mask, not a non-finite constant
    run = _train(tmp_path / "causal", "buffered_causal",
                 {"vocab": VOCAB, "dim": DIM, "length": LENGTH}, "left")
    result = replay(str(run), import_paths=[str(code)])
    assert result.op is not None and result.op.op.startswith("_softmax"), format_replay(result)
    assert result.op.mask is not None and result.op.mask.op.startswith("add")


def test_regression_a_float_attention_mask_in_the_batch_is_no_bad_input(
        code: Path, tmp_path: Path) -> None:
    # an additive mask of 0 and -inf passed in with the tokens is a mask, not a bad sample
    run = _train(tmp_path / "caller", "caller_masked", {"vocab": VOCAB, "dim": DIM}, "left",
                 with_mask=True)
    result = replay(str(run), import_paths=[str(code)])
    assert result.verdict.kind != "bad-input", format_replay(result)
    assert not result.forward.bad_inputs
    _assert_masked_softmax(result)


def test_regression_nondeterminism_does_not_fire_on_a_masked_softmax(
        mha_run: Path, code: Path) -> None:
    before = _snapshot(mha_run)
    result = analyzer.analyze(str(mha_run), replay=True, import_paths=[str(code)]).results[0]
    assert _snapshot(mha_run) == before
    names = {f.name for f in result.findings}
    assert "nondeterminism-or-hardware" not in names
    top = next(f for f in result.findings if f.is_failure)
    assert (top.name, top.confidence) == ("softmax-all-masked", "high")


def test_a_nan_that_a_mask_times_inf_makes_is_not_a_mask() -> None:
    # x + m * -inf with a 0/1 float mask: 0 * -inf is NaN where the mask is 0, a fault of
    # the masking code, not a -inf written on purpose
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)

    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            m = (x > 0).float()
            return torch.softmax(self.lin(x) + m * float("-inf"), dim=-1)

    net = Masked()
    result = replay_step(net, torch.randn(3, 4), torch.randn(3, 4),
                         torch.nn.functional.mse_loss,
                         torch.optim.SGD(net.parameters(), lr=0.1))
    assert result.op is not None and result.op.mask is None, format_replay(result)
    assert result.op.op.startswith("mul")


def test_a_log_of_zero_is_still_the_producer_after_a_mask() -> None:
    # a -inf made from finite inputs (log(0)) is a fault even in a step that also masks
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scores = self.lin(x).log()  # some entries <= 0: NaN and -inf
            return scores

    net = Net()
    result = replay_step(net, torch.randn(3, 4), torch.randn(3, 4),
                         torch.nn.functional.mse_loss,
                         torch.optim.SGD(net.parameters(), lr=0.1))
    assert result.op is not None and result.op.op.startswith("log")
    assert result.op.mask is None and result.verdict.kind == "math-fault"


def test_regression_exploding_rnn_defers_to_a_captured_nan_batch(tmp_path: Path) -> None:
    # the tuning case lstm_nan_target with its capture: NaN targets make every recurrent
    # gradient NaN at the failure; the first non-finite layer tag is the LSTM's, but the
    # replay says the step started from NaN, so exploding-rnn is no high finding
    from analyzer.scenarios.corpus.failing import RECURRENT
    from analyzer.scenarios.harness import run as train

    case = next(c for c in RECURRENT if c.name == "lstm_nan_target")
    train(case.scenario, str(tmp_path))
    result = analyzer.analyze(str(tmp_path / case.name), replay=True).results[0]
    assert result.replay is not None and result.replay.verdict.kind == "bad-input"
    rnn = [f for f in result.findings if f.name == "exploding-rnn"]
    assert all(f.confidence == "low" for f in rnn), [(f.confidence, f.score) for f in rnn]
    assert all("first non-finite layer tag" not in e.text for f in rnn for e in f.evidence)
    top = next(f for f in result.findings if f.is_failure)
    assert (top.name, top.confidence) == ("nan-in-batch", "high")


def test_a_fault_after_the_mask_is_still_found() -> None:
    # a float16 overflow later in a step that masks with -inf: skipping the mask's -inf
    # hides no later fault, the op that overflowed is named
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(4, 12)
            self.out = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
            scores = (q @ k.transpose(1, 2)).masked_fill(causal, float("-inf"))
            return self.out(torch.softmax(scores, dim=-1) @ v) * 1e5

    net = Net().half()
    result = replay_step(net, torch.randn(2, 3, 4).half(), torch.randn(2, 3, 4).half(),
                         torch.nn.functional.mse_loss,
                         torch.optim.SGD(net.parameters(), lr=0.1))
    report = format_replay(result)
    assert result.op is not None and result.op.op.startswith("mul"), report
    assert result.verdict.kind == "range-overflow", report
