"""Masks: a softmax over a row whose every entry was masked to -inf."""

from __future__ import annotations

from typing import Any

from analyzer.model import Evidence, Finding
from analyzer.rules import evidence_sudden
from analyzer.rules.base import Rule, rule
from analyzer.rules.evidence import RunEvidence
from analyzer.wording import step_words

_MASK_OPS = {"masked_fill", "masked_fill_", "where", "full", "full_like", "new_full", "fill",
             "fill_", "masked_scatter", "triu", "tril"}
"""Ops that write a mask's -inf: the first non-finite value of an attention step."""
_SOFTMAX_OPS = {"_softmax", "softmax", "_safe_softmax"}
_MATMUL_BACKWARD = ("BmmBackward", "MmBackward", "MatmulBackward", "BaddbmmBackward")
"""A matmul after the softmax: its gradient for the second operand (output 1, the values)
is the attention weights times a finite gradient, NaN when a weight row is."""


def _base(name: str) -> str:
    return name.split("::")[-1].split(".")[0]


def _replayed(ev: RunEvidence) -> tuple[list[Evidence], bool] | None:
    """The replay's first non-finite op read as a mask (or a softmax fed one): evidence,
    and whether the op itself shows a NaN made from the -inf entries."""
    replay = ev.replay
    op: Any = replay.op if replay is not None else None
    if op is None or op.phase != "forward" or not op.outputs:
        return None
    names = {_base(n) for n in op.names}
    out = op.outputs[0]
    if names & _MASK_OPS and out.neginf and not out.nan and not out.posinf:
        what = (f"{op.op} wrote -inf into {out.neginf} of {out.numel} entries: the mask of a "
                "softmax, the first non-finite value of the step; a row masked entirely "
                "turns NaN in the softmax after it")
        made_nan = False
    elif names & _SOFTMAX_OPS and out.nan and any(s.neginf for s in op.inputs):
        what = (f"{op.op} turned an input with -inf entries into NaN: a softmax row whose "
                "every entry was -inf")
        made_nan = True
    else:
        return None
    where = f" in {op.module}" if op.module else ""
    evidence = [Evidence(f"replay of step {replay.step}: forward op {op.op}{where}: {what}",
                         step=replay.step, subject=op.module or op.op, tensor=op.parameter)]
    if op.source_line:
        evidence.append(Evidence(f"source: {op.source_line.strip()}"))
    evidence.append(Evidence(f"differential replay: {replay.verdict.summary}",
                             step=replay.step))
    return evidence, made_nan


def _anomaly(ev: RunEvidence) -> list[Evidence]:
    """Autograd anomaly messages from the backward of the matmul after a softmax whose
    weights held NaN (output 1), or of the softmax itself."""
    out = []
    for e in ev.events("nonfinite"):
        fn = str(e.detail.get("function", ""))
        softmax = fn.startswith(("SoftmaxBackward", "LogSoftmaxBackward"))
        if fn.startswith("LogSoftmaxBackward") and not ev.anatomy.has("attention"):
            continue  # any NaN logit on an ignored position does it: attention must be seen
        if not softmax and not (fn.startswith(_MATMUL_BACKWARD) and e.detail.get("output") == 1):
            continue
        frames = e.detail.get("user_frames") or []
        where = f"; the forward call was at {frames[-1]}" if isinstance(frames, list) and \
            frames else ""
        when = f" {step_words(e.step, form='at')}" if e.step is not None else ""
        what = ("a softmax's backward, whose saved output held a NaN row the loss "
                "ignored" if softmax else
                "the gradient of the matmul's second operand (the values), which is the "
                "attention weights times a finite gradient: a weight row was NaN")
        out.append(Evidence(f"autograd anomaly{when}: {fn} returned non-finite values, "
                            f"{what}{where}", location=e.location, step=e.step, subject=fn))
    return out


def _attention_possible(ev: RunEvidence) -> Evidence | None:
    parts = ev.anatomy.of("attention")
    if parts:
        return Evidence(f"the model has attention: {parts[0].brief()}", subject=parts[0].name)
    if not evidence_sudden.names_known(ev):
        return Evidence("the run does not name its modules: attention is possible, not seen")
    return None


@rule("NF106", "softmax-all-masked", "softmax over a row whose every entry is masked to -inf",
      needs=("replay", "anomaly_log", "loss"))
def softmax_all_masked(r: Rule, ev: RunEvidence) -> list[Finding]:
    """
    ## What it detects
    An attention (or any masked softmax) where one query's keys are all masked: a left- or
    right-padded sequence that is padding only, a causal mask combined with a padding mask
    that removes the only visible key, an empty set of candidates.

    ## Why it produces NaN/Inf
    `softmax(x.masked_fill(mask, -inf))` over a row that is -inf everywhere computes
    exp(-inf - (-inf)) = exp(NaN): the row is NaN. When the loss reads that position the loss
    is NaN at once; when it ignores it (`ignore_index` on padding), the loss stays finite but
    softmax's backward multiplies the NaN row into the gradient, the gradients are NaN under
    a finite loss and the update writes NaN into every weight. Under
    `torch.autograd.set_detect_anomaly(True)` torch names the node after the softmax:
    `Function 'BmmBackward0' returned nan values in its 1th output` (the gradient of the
    values, which is the attention weights times the incoming gradient).
    `torch.nn.functional.scaled_dot_product_attention` on CPU returns 0 for a fully masked
    row in torch 2.13, with a finite gradient: the fault belongs to hand-written attention
    (and to kernels without that guard).

    ## Evidence
    A capture's replay whose first non-finite op is a softmax turning a mask's -inf into NaN
    (high: the replayer keeps the mask, `masked_fill` writing -inf, as context rather than
    as the fault), or, where a mask it does not recognise is named as the first non-finite
    op, that mask (medium: the replay then does not show that a whole row was masked).
    Without a capture: an autograd anomaly naming `SoftmaxBackward0`, or
    `BmmBackward0`/`MmBackward0` returning NaN in output 1, in a model that has attention or
    does not name its modules (medium); `LogSoftmaxBackward0`, which a language model's
    cross-entropy names when the NaN row reaches its head on an ignored position, only in a
    model whose attention the run names. Else, from the curves alone (low): a NaN gradient
    under a finite loss, or a NaN loss, at once out of a steady run; tied with the other
    causes that leave the same curve (sqrt-at-zero-backward; nan-in-batch,
    division-by-zero, log-of-zero, zero-variance-normalisation) when the run names an
    attention module, ranked below them when it names no module at all, and ruled out when
    it names its modules and none is attention.

    ## Fix
    Never let a row be masked entirely, or guard it:
    ```python
    scores = scores.masked_fill(mask, float("-inf"))      # mask: True = masked
    empty = mask.all(dim=-1, keepdim=True)
    attn = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    # or: a large negative value instead of -inf in the mask (torch.finfo(dtype).min)
    # or: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=~mask)
    ```

    ## Known false positives
    A model whose NaN came from elsewhere and reached the attention weights (a NaN batch, an
    overflow upstream) gives the same anomaly message; from the curves alone any sudden NaN
    in an attention model fits, which is why that finding is low and tied. A mask written
    as `x + m * -inf` with a 0/1 float mask makes NaN itself (0 · -inf) and is read as that
    fault, not as a masked softmax.
    """
    if not ev.failed:
        return []
    replayed = _replayed(ev)
    if replayed is not None:
        evidence, made_nan = replayed
        return [r.finding("high" if made_nan else "medium", evidence, 0.9 if made_nan else 0.7)]
    found = _anomaly(ev)
    if found:
        possible = _attention_possible(ev)
        if possible is None:
            return []
        return [r.finding("medium", [*found, possible], 0.6)]
    return evidence_sudden.findings(r, ev)


RULES = (softmax_all_masked,)
