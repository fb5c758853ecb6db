"""A NaN out of a steady run (rules.evidence_sudden) and softmax-all-masked (rules.masking).

The curves of a sudden fault do not name its op: the causes the model's make-up allows are
left tied, with what would decide. A real one-layer attention with a hand-written masked
softmax shows the backward signature (NaN gradients under a finite loss) and torch's own
anomaly text for it."""

from __future__ import annotations

import hashlib
import math
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

import analyzer
from analyzer.model import Finding, Run, Series
from analyzer.onset import locate
from analyzer.rules import evaluate
from analyzer.rules.anatomy import Anatomy, Component
from analyzer.rules.evidence import RunEvidence
from analyzer.rules.evidence_sudden import sudden

NAN = float("nan")


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(folder)): (p.stat().st_size,
                                         hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _series(tag: str, values: list[float]) -> Series:
    n = len(values)
    return Series(tag=tag, steps=np.arange(n, dtype=np.int64),
                  values=np.asarray(values, dtype=np.float64), wall_times=np.zeros(n),
                  source="events", positions=np.arange(n, dtype=np.int64) * 40)


def _flat(n: int, seed: int = 0, level: float = 2.4) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(level + 0.05 * rng.standard_normal(n))


def _run(*series: Series) -> Run:
    return Run(path="r", name="r", files=("events",), series=series)


def _causes(found: tuple[Finding, ...] | list[Finding]) -> list[Finding]:
    return [f for f in found if f.role == "cause"]


def _tied(causes: list[Finding]) -> set[str]:
    """The causes that share the top one's confidence and score."""
    return {f.name for f in causes if (f.confidence, f.score) == (causes[0].confidence,
                                                                  causes[0].score)}


def _tagger(*layers: str, lr: list[float] | None = None) -> Run:
    """The shape of a tagger whose loss is a mean over labelled tokens: steady, then NaN
    at step 30 everywhere at once (per-layer norms name the modules)."""
    loss = [*_flat(30), NAN, NAN]
    grad = [*_flat(30, 1, 0.3), NAN, NAN]
    per_layer = [_series(f"grad_norm/{name}", [*_flat(30, 2 + k, 0.1), NAN, NAN])
                 for k, name in enumerate(layers)]
    extra = [_series("train/lr", lr)] if lr is not None else []
    return _run(_series("train/loss", loss), _series("train/grad_norm", grad), *per_layer,
                *extra)


def test_regression_nan_out_of_a_steady_loss_is_undetermined_between_batch_and_division() \
        -> None:
    result = locate(_tagger("embed.weight", "rnn.weight_ih_l0", "head.weight"))
    found, _ = evaluate(result)
    causes = _causes(found)
    assert _tied(causes) == {"division-by-zero", "nan-in-batch", "log-of-zero"}
    a, b = causes[:2]
    assert (a.confidence, a.score) == ("low", 0.5)
    assert (b.rank_note or "").startswith("undetermined between")
    # the model names its modules and has neither a norm nor attention: both ruled out
    assert not {"zero-variance-normalisation", "softmax-all-masked"} & {f.name for f in causes}
    last = a.evidence[-1].text
    assert last.startswith("not seen") and "torch.isfinite(x).all()" in last
    assert any("ruled out: softmax-all-masked" in e.text for e in a.evidence)


def test_nan_out_of_a_steady_loss_in_a_model_with_norm_and_attention_ties_five_causes() \
        -> None:
    result = locate(_tagger("embed.weight", "norm.weight", "qkv.weight", "head.weight"))
    causes = _causes(evaluate(result)[0])
    assert _tied(causes) == {"division-by-zero", "nan-in-batch", "log-of-zero",
                             "zero-variance-normalisation", "softmax-all-masked"}
    masked = next(f for f in causes if f.name == "softmax-all-masked")
    assert any("qkv" in e.text for e in masked.evidence)  # the attention it rests on


def test_causes_needing_an_unseen_module_rank_below_those_needing_none() -> None:
    result = locate(_run(_series("train/loss", [*_flat(30), NAN])))  # loss only
    causes = _causes(evaluate(result)[0])
    scores = {f.name: f.score for f in causes}
    assert scores["nan-in-batch"] == scores["division-by-zero"] == scores["log-of-zero"] == 0.5
    assert scores["softmax-all-masked"] == scores["zero-variance-normalisation"] == 0.4


def test_an_eps_zero_normalisation_decides_a_sudden_nan() -> None:
    ev = RunEvidence(locate(_tagger("norm.weight", "head.weight")))
    ev.__dict__["anatomy"] = Anatomy((Component("normalisation", "norm", "hparams.yaml",
                                                "LayerNorm, eps=0", "LayerNorm", 0.0),))
    s = sudden(ev)
    assert s is not None and s.eps_zero is not None
    from analyzer.rules import BY_NAME

    found = BY_NAME["zero-variance-normalisation"].check(
        BY_NAME["zero-variance-normalisation"], ev)
    assert [(f.confidence, f.score) for f in found] == [("medium", 0.7)]
    ev.__dict__["anatomy"] = Anatomy((Component("normalisation", "norm", "hparams.yaml",
                                                "LayerNorm, eps=1e-05", "LayerNorm",
                                                1e-05),))
    assert sudden(ev) is not None and sudden(ev).eps_zero is None  # type: ignore[union-attr]


def test_no_sudden_reading_after_a_learning_rate_change_or_a_growth() -> None:
    jumped = locate(_tagger("fc1.weight", lr=[1e-3] * 29 + [1e-1] * 3))
    assert sudden(RunEvidence(jumped)) is None
    grown = [*[10.0 ** (k / 4) for k in range(30)], NAN]
    assert sudden(RunEvidence(locate(_run(_series("train/loss", grown))))) is None
    inf = locate(_run(_series("train/loss", [*_flat(30), math.inf])))
    assert sudden(RunEvidence(inf)) is None  # +inf: division-by-zero's own reading


class _Attention(torch.nn.Module):
    """One attention layer with a hand-written masked softmax and a position-wise head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 8)
        self.q_proj = torch.nn.Linear(8, 8)
        self.k_proj = torch.nn.Linear(8, 8)
        self.v_proj = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 11)

    def forward(self, tokens: torch.Tensor, pad: torch.Tensor, head: bool = True
                ) -> torch.Tensor:
        x = self.embed(tokens)
        scores = self.q_proj(x) @ self.k_proj(x).transpose(1, 2)
        scores = scores.masked_fill(pad[:, None, :], float("-inf"))  # padded keys
        mixed = torch.softmax(scores, dim=-1) @ self.v_proj(x)
        return self.head(mixed) if head else mixed  # type: ignore[no-any-return]


def _batch(step: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(1, 11, (4, 6), generator=g)
    pad = torch.zeros(4, 6, dtype=torch.bool)
    pad[:, :2] = True  # left padding
    if step == 12:
        pad[0] = True  # a sequence that is padding only: its rows are masked entirely
    return tokens, pad


def _loss(model: _Attention, tokens: torch.Tensor, pad: torch.Tensor, head: bool
          ) -> torch.Tensor:
    """Next-token cross-entropy, or a regression of the mixed features, both over the
    positions that are not padding."""
    if head:
        target = tokens.masked_fill(pad, -100)
        return torch.nn.functional.cross_entropy(model(tokens, pad).reshape(-1, 11),
                                                 target.reshape(-1), ignore_index=-100)
    out = model(tokens, pad, head=False)
    return (out[~pad] - 1.0).pow(2).mean()  # type: ignore[no-any-return]


def _train(folder: Path, anomaly: bool = False, head: bool = True) -> list[str]:
    """Train until the gradients go non-finite; log loss, grad norm and per-layer norms."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = _Attention()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    writer = SummaryWriter(str(folder))
    lines: list[str] = []
    for step in range(16):
        tokens, pad = _batch(step, g)
        opt.zero_grad()
        try:
            with torch.autograd.set_detect_anomaly(anomaly):
                loss = _loss(model, tokens, pad, head)
                loss.backward()  # type: ignore[no-untyped-call]
        except RuntimeError:
            lines += [f"step {step} loss {loss.item():.4f}", traceback.format_exc()]
            break
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        writer.add_scalar("train/loss", loss.item(), step)
        writer.add_scalar("train/grad_norm", norm.item(), step)
        for name, p in model.named_parameters():
            if p.grad is not None:
                writer.add_scalar(f"grad_norm/{name}", p.grad.norm().item(), step)
        lines.append(f"step {step} loss {loss.item():.4f}")
        if not torch.isfinite(norm):
            break
        opt.step()
    writer.close()
    return lines


def test_regression_fully_masked_row_gives_nan_gradients_under_a_finite_loss(tmp_path: Path) \
        -> None:
    run = tmp_path / "left_padding"
    _train(run)
    before = _snapshot(run)
    result = analyzer.analyze(str(run), replay=False).results[0]
    assert _snapshot(run) == before
    ev = RunEvidence(result)
    assert ev.onset is not None and (ev.onset.step, ev.onset.phase) == (12, "backward")
    causes = _causes(result.findings)
    assert {f.name for f in causes[:2]} == {"sqrt-at-zero-backward", "softmax-all-masked"}
    assert causes[0].score == causes[1].score and causes[0].confidence == "low"


def _anomaly_run(folder: Path, head: bool) -> str:
    """A run folder whose train.log is the console of training under detect_anomaly:
    torch's own warning (with the forward traceback) and error text."""
    folder.mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lines = _train(folder.parent / f"{folder.name}_events", anomaly=True, head=head)
    lines[-1:-1] = [warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                    for w in caught if "Error detected" in str(w.message)]
    text = "\n".join(lines) + "\n"
    (folder / "train.log").write_text(text, encoding="utf-8")
    return text


def test_regression_masked_softmax_read_from_torchs_anomaly_message(tmp_path: Path) -> None:
    # the matmul after the softmax: its gradient for the values is NaN weights times a
    # finite gradient
    run = tmp_path / "mixed"
    text = _anomaly_run(run, head=False)
    assert "Function 'BmmBackward0' returned nan values in its 1th output" in text
    result = analyzer.analyze(str(run), replay=False).results[0]
    top = next(f for f in result.findings if f.is_failure)
    assert (top.name, top.confidence) == ("softmax-all-masked", "medium")
    assert "test_rules_sudden.py" in top.evidence[0].text  # the forward call's frame


def test_log_softmax_anomaly_reads_as_masked_softmax_only_in_an_attention_model(
        tmp_path: Path) -> None:
    # a language model's head: the NaN row reaches log_softmax on a position the loss
    # ignores; its backward is the first to return NaN
    run = tmp_path / "lm"
    text = _anomaly_run(run, head=True)
    assert "Function 'LogSoftmaxBackward0' returned nan values" in text
    alone = analyzer.analyze(str(run), replay=False).results[0]
    assert "softmax-all-masked" not in {f.name for f in alone.findings if f.is_failure}
    with SummaryWriter(str(run)) as writer:  # per-layer norms name the attention
        for step in range(3):
            writer.add_scalar("grad_norm/q_proj.weight", 0.1, step)
    named = analyzer.analyze(str(run), replay=False).results[0]
    top = next(f for f in named.findings if f.is_failure)
    assert (top.name, top.confidence) == ("softmax-all-masked", "medium")


def test_replay_naming_the_mask_reads_as_a_masked_softmax() -> None:
    from dataclasses import replace
    from types import SimpleNamespace

    from analyzer.replayer.stats import stats_of

    scores = torch.randn(1, 3, 3)
    mask = torch.zeros(1, 3, 3, dtype=torch.bool)
    mask[0, 0] = True
    masked = scores.masked_fill(mask, float("-inf"))
    base = locate(_run(_series("train/loss", [*_flat(10), NAN])))

    def replayed(op: str, inputs: object, outputs: object) -> list[tuple[str, str]]:
        fault = SimpleNamespace(phase="forward", forward_op=None, names=(op,), module="attn",
                                inputs=stats_of(inputs), outputs=stats_of(outputs),
                                parameter=None, inputs_finite=True, float64_finite=False,
                                source=None, source_line=None, op=op)
        verdict = SimpleNamespace(kind="math-fault", summary="non-finite in float64 too")
        stand_in = SimpleNamespace(op=fault, step=10, verdict=verdict)
        found, _ = evaluate(replace(base, replay=stand_in))  # type: ignore[arg-type]
        return [(f.name, f.confidence) for f in found if f.role == "cause"]

    assert replayed("aten::masked_fill", scores, masked)[:1] == [("softmax-all-masked",
                                                                   "medium")]
    assert replayed("aten::_softmax", masked, torch.softmax(masked, -1))[:1] == [
        ("softmax-all-masked", "high")]
    assert "softmax-all-masked" not in {n for n, _ in replayed("aten::div", scores,
                                                                scores / 0)}


def test_regression_sample_nan_in_batch_without_capture_is_a_tie_not_no_cause(tmp_path: Path) \
        -> None:
    import shutil

    sample = Path(__file__).resolve().parent.parent / "sample_runs" / "nan_in_batch"
    run = tmp_path / "nan_in_batch"
    shutil.copytree(sample, run, ignore=shutil.ignore_patterns("capture"))
    before = _snapshot(run)
    causes = _causes(analyzer.analyze(str(run), replay=False).results[0].findings)
    assert _snapshot(run) == before
    assert _tied(causes) == {"nan-in-batch", "division-by-zero", "log-of-zero"}
    # fc1/fc2 only: the checkpoints and per-layer tags name no norm and no attention
    assert not {"zero-variance-normalisation", "softmax-all-masked"} & {f.name for f in causes}


def test_regression_replay_of_a_masked_attention_step_reads_as_masked_softmax(
        tmp_path: Path) -> None:
    # a real capture of the tuning case lm_left_padding (a left-padded row that sees no key):
    # the mask's masked_fill (-inf) is written on purpose, so the replayer names the softmax
    # that turns a row of it into NaN (the mask kept beside it), and the step fails in
    # backward as run, the NaN row being padding the loss ignores: a masked softmax (high),
    # not a fault that does not reproduce
    from analyzer.scenarios.corpus.failing import GENERATIVE
    from analyzer.scenarios.harness import run as train

    case = next(c for c in GENERATIVE if c.name == "lm_left_padding")
    outcome = train(case.scenario, str(tmp_path))
    assert outcome.capture is not None
    folder = tmp_path / case.name
    before = _snapshot(folder)
    result = analyzer.analyze(str(folder), replay=True).results[0]
    assert _snapshot(folder) == before
    assert result.replay is not None and result.replay.op is not None
    assert result.replay.op.op.startswith("_softmax")
    assert result.replay.op.mask is not None
    assert result.replay.op.mask.op.startswith("masked_fill")
    assert result.replay.verdict.kind == "math-fault"
    top = next(f for f in result.findings if f.is_failure)
    assert (top.name, top.confidence) == ("softmax-all-masked", "high")
    assert "_softmax" in top.evidence[0].text
    assert "nondeterminism-or-hardware" not in {f.name for f in result.findings}


def test_regression_captured_nan_targets_are_not_tied_with_an_exploding_rnn(
        tmp_path: Path) -> None:
    # the tuning case lstm_nan_target with its capture: the replay finds NaN in the batch's
    # targets; nothing the recurrence did can come before that
    from analyzer.scenarios.corpus.failing import RECURRENT
    from analyzer.scenarios.harness import run as train

    case = next(c for c in RECURRENT if c.name == "lstm_nan_target")
    train(case.scenario, str(tmp_path))
    result = analyzer.analyze(str(tmp_path / case.name), replay=True).results[0]
    causes = _causes(result.findings)
    assert (causes[0].name, causes[0].confidence) == ("nan-in-batch", "high")
    assert all(f.score < causes[0].score for f in causes[1:] if f.confidence == "high")
