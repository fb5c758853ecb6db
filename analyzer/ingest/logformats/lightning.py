"""PyTorch Lightning progress bars, tqdm and rich flavours, and its callbacks' messages.

``Epoch 3:  45%|████▌     | 450/1000 [00:12<00:15, 36.50it/s, v_num=0, train_loss=nan.0]``
``Epoch 3/9  ━━━━━━━━━━ 450/1000 0:00:12 • 0:00:15 36.50it/s v_num: 0 train_loss: nan``

The bar counts batches within the epoch, from 1: ``TQDMProgressBar`` sets it to
``batch_idx + 1`` after each batch, and epochs from 0. The step is ``epoch * batches +
batch - 1`` (:data:`BATCH`, the batches done before the one just finished), the
``global_step`` Lightning's loggers write a ``training_step``'s values at when every batch
steps the optimizer: a log read alone is on the run's global step. With gradient
accumulation the two differ by its factor, and the values (or the run's metadata) decide.
The total is the epoch's length in batches, and the log's reading of it
(:meth:`Context.epoch_length`; Lightning 2's bar counts training batches only, where 1.x
added the validation batches to it). When the total is unknown (shown as ``?``) the step
is the batch within its epoch alone
(:data:`IN_EPOCH`, from 1), which only matching values can place.

A bar at count 0 (``Epoch 1:   0%| 0/8 [..., train_loss=1.36e+11]``) has finished no
batch of its epoch: TQDM's ``reset`` redraws it at each epoch start, first still under the
previous epoch's description, and its postfix repeats the last step's values. It is no
step of its own and gives no point. Each later count is drawn twice, by ``_update_n``'s
refresh (the previous step's values) and after ``set_postfix`` (this step's): both are at
the count's step, and the last one drawn is what the step's values are.

The tqdm bar prints its postfix through ``Tqdm.format_num``, which pads a float's text
to five characters with a point and zeros so that the bar does not flicker: a NaN loss
shows as ``nan.0``, an infinite one as ``inf.0`` or ``-inf.``; those are read as the
values they pad.

``RichProgressBar`` lays its columns out to the console's width (80 when the output is
a file) and wraps the metrics column onto the next lines, indented under it: a line of
blanks and ``name: value`` pairs right after a rich bar belongs to that bar's step. When
the output is not a terminal, rich draws the bar once, when it stops (the end of
``fit`` or an exception), so the only state in the file is the last one.

``ModelCheckpoint(verbose=True)`` prints ``Epoch 0, global step 50: 'val_loss' reached
0.12 (best 0.12), saving model to '.../epoch=0-step=50.ckpt' as top 2``, often glued to
the bar with no separator: a ``checkpoint_save`` event whose ``global_step`` is the
trainer's (``last_logged_step`` one below it, the step its loggers wrote the last
batch's values at), after the bar record before it.
"""

from __future__ import annotations

import re

import numpy as np

from analyzer.ingest.logformats.base import colon_pairs, equals_pairs
from analyzer.ingest.logformats.context import Context
from analyzer.model import StepAxis

_HEAD = re.compile(r"(?<![\w])Epoch (\d{1,15}+)(?:/\d++)?+:?+ ")
_COUNT = re.compile(r"(?<![\d/])(\d{1,15}+)/(\d{1,15}+|\?)(?![\d/])")
_SKIP = frozenset({"v_num"})
_PADDED = re.compile(r"(?<![\w.])(-?+(?:nan|inf))\.0*+(?![\w.])")
"""``Tqdm.format_num``'s padding of a non-finite float: ``nan.0``, ``inf.0``, ``-inf.``."""
_SAVE = re.compile(
    r"Epoch (\d{1,15}+), global step (\d{1,15}+): (?:'[^'\n]{1,200}+' reached [^\s)]{1,40}+ "
    r"\(best [^\s)]{1,40}+\), )?+saving model to "
)
"""``ModelCheckpoint``'s verbose save message (monitored or not)."""
_NOT_TOP = re.compile(r"Epoch \d{1,15}+, global step \d{1,15}+: '[^'\n]{1,200}+' was not in top ")
RICH_WRAP = " " * 24
"""The indent of a rich bar's wrapped metrics: under its description, bar, count, time
and speed columns, which take some 60 characters."""
BATCH = StepAxis("counter", base=0, counts_skipped=True, label="batch")
"""``epoch * batches + batch - 1``: the batches finished before the bar's last one, over
the epochs, from 0 (Lightning's ``global_step`` without gradient accumulation)."""
IN_EPOCH = StepAxis("epoch", base=1, counts_skipped=True, label="batch")
"""The bar's batch within an epoch whose length is unknown."""


def last_frames(steps: np.ndarray) -> np.ndarray:
    """Which points of a bar's series to keep: the last of each run of frames drawn at one
    count (``_update_n``'s refresh shows the previous step's values, ``set_postfix``'s frame
    after it this step's)."""
    keep = np.ones(steps.shape, dtype=bool)
    keep[:-1] = steps[1:] != steps[:-1]
    return keep


class LightningParser:
    framework = "lightning"
    repeats = True
    triggers: tuple[str, ...] = ("Epoch ", RICH_WRAP)

    def __init__(self) -> None:
        self.seen_v_num = False
        self.totals: set[int] = set()
        """The bar totals met: each an epoch's batches (see :meth:`Context.epoch_length`)."""
        self.rich: tuple[int | None, int, str] | None = None
        """The step of the last rich bar (None at count 0: its metrics are no step's),
        the line it (or its last wrapped line) is on, and a metric name its line ended
        with, whose value wrapped onto the next."""

    def parse(self, text: str, ctx: Context) -> bool:
        if "global step" not in text:  # a bar: the common case, kept short
            if text[0] == " " and text.startswith(RICH_WRAP) and self._wrapped(text, ctx):
                return True
            return self._bar(text, ctx)
        save = _SAVE.search(text)
        before = text if save is None else text[: save.start()]  # what it was printed onto
        took = False
        if before:
            took = before.startswith(RICH_WRAP) and self._wrapped(before, ctx)
            took = took or self._bar(before, ctx)
        if save is not None:
            self._saved(save, text[save.start() :], ctx)
            return True
        if not took and _NOT_TOP.search(text) is not None:
            ctx.votes["lightning"] += 1
            return True
        return took

    def _bar(self, text: str, ctx: Context) -> bool:
        head = _HEAD.search(text)
        if head is None:
            return False
        count = _COUNT.search(text, head.end())
        if count is None:
            return False
        rich = "%|" not in text
        if rich and "━" not in text:
            return False
        epoch = int(head.group(1))
        batch = int(count.group(1))
        total = count.group(2)
        rest = text[count.end() :]
        if "v_num" in rest:
            self.seen_v_num = True
        if batch == 0:  # an epoch's start: the values shown are an earlier step's
            if rich:
                self.rich = (None, ctx.line, "")
            ctx.votes["lightning" if self.seen_v_num else "tqdm"] += 1
            return True
        if total != "?":
            length = int(total)
            step = epoch * length + batch - 1
            if length not in self.totals:
                self.totals.add(length)
                ctx.epoch_length(length, "batch", f"its progress bar's total ({length} batches "
                                                  "per epoch)")
            if ctx.axis != IN_EPOCH:
                ctx.axis = BATCH
        else:
            step = batch
            ctx.axis = IN_EPOCH  # one bar of unknown length makes the file's numbers unplaced
        if "=" in rest:
            if "an." in rest or "nf." in rest:
                rest = _PADDED.sub(r"\1", rest)
            pairs = equals_pairs(rest, _SKIP)
        else:
            pairs = colon_pairs(rest, _SKIP)
        ctx.points_at(step, pairs)
        if rich:
            words = rest.split()
            dangling = words[-1][:-1] if words and words[-1].endswith(":") else ""
            self.rich = (step, ctx.line, dangling)
        ctx.votes["lightning" if self.seen_v_num else "tqdm"] += 1
        return True

    def _wrapped(self, text: str, ctx: Context) -> bool:
        """A rich bar's metrics wrapped onto the line after it."""
        rich = self.rich
        if rich is None or ctx.line - rich[1] != 1:
            return False
        step, _, dangling = rich
        body = f"{dangling}: {text}" if dangling else text
        words = body.split()
        pairs = colon_pairs(body, _SKIP)
        named = sum(1 for w in words if w.endswith(":"))
        ends_named = bool(words) and words[-1].endswith(":")
        # Only name: value pairs: anything else is not the bar's metrics column.
        if not words or 2 * named != len(words) + ends_named or not (pairs or ends_named):
            self.rich = None
            return False
        if step is not None:
            ctx.points_at(step, pairs)
        self.rich = (step, ctx.line, words[-1][:-1] if ends_named else "")
        ctx.votes["lightning"] += 1
        return True

    def _saved(self, save: re.Match[str], text: str, ctx: Context) -> None:
        step = int(save.group(2))
        detail = {"global_step": step, "last_logged_step": step - 1,
                  "epoch": int(save.group(1))}
        ctx.event("checkpoint_save", None, text, detail)
        self.seen_v_num = True  # ModelCheckpoint is Lightning's own, not a bare tqdm bar
        ctx.votes["lightning"] += 1
