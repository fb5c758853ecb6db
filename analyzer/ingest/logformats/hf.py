"""Hugging Face Trainer: the dict it prints at every logging step.

``{'loss': 2.31, 'grad_norm': 1.7, 'learning_rate': 4.9e-05, 'epoch': 0.12}``

The lines carry no step. The tqdm bar drawn just before (``| 50/1000 [``, often in
the same physical line, separated by carriage returns) gives it. Without a bar (the
``PrinterCallback`` of ``disable_tqdm=True``, which prints ``state.epoch`` unrounded) the
record's ``epoch`` places it when the log's training header gave the steps per epoch
(``Num update steps per epoch = N``; in older releases ``Num examples`` over ``Total train
batch size``, where the epochs printed agree; else ``Total optimization steps = S`` over
``Num Epochs = E`` when E divides S: see :meth:`HuggingFaceParser.steps_per_epoch`; it is
the log's reading of the epoch's length, in optimizer steps) and the epoch is printed
finely enough to name one step:
``epoch * N`` is the Trainer's ``global_step`` (:data:`EPOCH_STEPS`). Otherwise the
order of the training records stands in for it (:data:`RECORD`): an evaluation's dict
(``eval_`` keys) and the summary ``train()`` ends with are logged at the step of the
training record before them, and take its number, so that the records keep one stride.
With ``logging_nan_inf_filter`` (on by default) the Trainer replaces a NaN/Inf loss by
the running average before logging it, so a finite ``loss`` next to a non-finite
``grad_norm`` is the signature of a hidden NaN.
"""

from __future__ import annotations

import re

from analyzer.ingest.logformats import fast
from analyzer.ingest.logformats.context import Context, is_finite
from analyzer.ingest.logformats.numbers import number_value, wrapped_value
from analyzer.ingest.logformats.store import Row
from analyzer.model import StepAxis

RENAME = {"learning_rate": "lr"}
SKIP = frozenset({"epoch", "step", "total_flos"})
RECORD = StepAxis("record", base=1, label="record")
"""The numbering of the Trainer's dict lines without a progress bar: their order."""
EPOCH_STEPS = StepAxis("global", label="epoch x steps per epoch")
"""The dict lines placed by their ``epoch`` times the run's steps per epoch."""
_HEADER = (("Num update steps per epoch = ", "per_epoch"), ("Num Epochs = ", "epochs"),
           ("Total optimization steps = ", "max_steps"), ("Num examples = ", "examples"),
           ("Total train batch size (w. parallel, distributed & accumulation) = ", "batch"))
"""The training header's lines (``logger.info`` in ``_inner_training_loop``) that give the
steps per epoch. ``Total optimization steps`` is its last line."""
_NO_LENGTH = 2**63 - 1
"""``Num Epochs`` of a data set without a length (``sys.maxsize``): its epoch is then
``max_steps`` by convention, not a pass over the data."""


SAVING = "Saving model checkpoint to "
_SAVED = re.compile(r"Saving model checkpoint to \S*?checkpoint-(\d{1,15}+)/?\s*$")
"""The Trainer's save message: its folder is ``checkpoint-{state.global_step}``."""


def _saved(text: str, ctx: Context) -> bool:
    """A save of the Trainer's ``checkpoint-N`` folder: an event whose global step is N,
    placed after the record before it, from which the align stage can number the records
    (``checkpoint_save``)."""
    m = _SAVED.search(text)
    if m is None:
        return False
    ctx.votes["transformers"] += 1
    ctx.event("checkpoint_save", None, text, {"global_step": int(m[1])})
    return True


class HuggingFaceParser:
    framework = "transformers"
    repeats = True
    triggers: tuple[str, ...] = ("{'", "it/s]", "s/it]", SAVING, *(key for key, _ in _HEADER))

    def __init__(self) -> None:
        self.bar_step: int | None = None
        self.records = 0
        self.trained = False
        """Whether a training step's record was read (evaluations then take its number)."""
        self.header: dict[str, int] = {}
        self.from_examples = False
        """Whether the steps per epoch came from the examples over the total batch size."""
        self.by_epoch: bool | None = None
        """Whether the records are placed by their epoch; decided at the first record
        without a bar, and kept, so that one file holds one numbering."""
        self.shape: _Shape | None = None
        self.learn = fast.ENABLED
        self.bars: dict[bytes, slice] = {}
        """Per layout of a bare bar redraw: where its count is."""

    def parse(self, text: str, ctx: Context) -> bool:
        key = fast.record_key(text, ctx) if self.learn else None
        if key is not None:
            count = self.bars.get(key)
            if count is not None:
                # A bare bar of a layout read before: every test below gave the same
                # answers on it (they look at its characters but the digits, and at
                # where the digits are), and its count is at the same place.
                self.bar_step = int(text[count])
                return True
        shape = self.shape
        if shape is not None and self.bar_step is not None and text.startswith("{'"):
            row = shape.match(text, 0, ctx)
            if row is not None:
                # A record that is one dict of the learned shape, after a bar.
                block = shape.block
                if ctx.rank != block.rank:
                    block = ctx.store.block(block.tags, ctx.rank, 0)
                self.records += 1
                ctx.votes["transformers"] += 1
                ctx.store.add(block, self.bar_step, ctx.line, row)
                ctx.last_step = self.bar_step
                return True
        if "{'" not in text and self._header(text, ctx):
            return True
        if "{'" not in text and SAVING in text:
            return _saved(text, ctx)
        found = False
        pos = 0
        while (start := text.find("{'", pos)) >= 0:
            end = text.find("}", start)
            if end < 0:
                break
            if text.find("{", start + 1, end) >= 0:
                pos = start + 1  # not a flat dict; look for one further on
                continue
            self._bar(text, pos, start)
            pos = end + 1
            found = self._record(text[start:pos], text, ctx) or found
        if not found:
            count = self._bar(text, pos, len(text))
            # A bare bar redraw is this parser's too; a bar with something glued
            # after it is left to the parser of that something.
            bare = self.bar_step is not None and "%|" in text[:8] and text.endswith(
                ("it/s]", "s/it]")
            )
            if (
                bare and count is not None and key is not None and len(self.bars) < fast.TEMPLATES
                and " = " not in text and "{'" not in text
            ):
                # No dict and no header: the tests above came to the bar alone.
                self.bars[key] = count
            return bare
        return found

    def _header(self, text: str, ctx: Context) -> bool:
        if " = " not in text:  # in every key: a bar redraw need not be searched for each
            return False
        for key, name in _HEADER:
            at = text.find(key)
            if at < 0:
                continue
            raw = text[at + len(key):].strip().replace(",", "")
            whole, _, fraction = raw.partition(".")
            if whole.isdecimal() and len(whole) <= 19 and fraction.strip("0") == "":
                if name in ("examples", "batch") and "max_steps" in self.header:
                    return True  # an evaluation's header, after the training's
                self.header[name] = int(whole)
                if name == "max_steps":
                    self._length(ctx)
                return True
        return False

    def _length(self, ctx: Context) -> None:
        """The header's steps per epoch, as the log's reading of the epoch's length."""
        per_epoch = self.steps_per_epoch()
        if per_epoch is None:
            return
        if "per_epoch" in self.header:
            how = f"its 'Num update steps per epoch = {per_epoch}'"
        elif self.from_examples:
            how = (f"its 'Num examples = {self.header['examples']}' over 'Total train batch "
                   f"size = {self.header['batch']}', with 'Num Epochs = "
                   f"{self.header.get('epochs')}' of 'Total optimization steps = "
                   f"{self.header.get('max_steps')}'")
        else:
            how = (f"its 'Total optimization steps = {self.header.get('max_steps')}' over "
                   f"'Num Epochs = {self.header.get('epochs')}'")
        ctx.epoch_length(per_epoch, "optimizer_step", how)

    def steps_per_epoch(self) -> int | None:
        """The run's optimizer steps per epoch, from the training header: printed (since
        transformers 4.4x), else the examples over the total batch size (which holds the
        accumulation and the ranks), rounded up as the loader's last short batch is, where
        the epochs printed agree with it (``ceil(max_steps / per_epoch)``); else the steps
        over the epochs, where they divide."""
        epochs, total = self.header.get("epochs"), self.header.get("max_steps")
        if epochs is not None and epochs >= _NO_LENGTH:
            return None  # a data set without a length: no epochs to speak of
        printed = self.header.get("per_epoch")
        if printed:
            return printed
        examples, batch = self.header.get("examples"), self.header.get("batch")
        if examples and batch and epochs and total:
            # a max_steps run prints the epochs it will start: S over E is then no length
            for per_epoch in (-(-examples // batch), examples // batch):  # drop_last: floor
                if per_epoch and -(-total // per_epoch) == epochs:
                    self.from_examples = True
                    return per_epoch
        self.from_examples = False
        if epochs and total and not total % epochs:
            return total // epochs  # E not dividing S: max_steps was set, not epochs
        return None

    def _epoch_step(self, raw: str | None) -> int | None:
        """The global step ``epoch * steps per epoch`` names, when the epoch printed has
        the digits to name one step."""
        per_epoch = self.steps_per_epoch()
        if raw is None or per_epoch is None:
            return None
        epoch = number_value(raw)
        if epoch is None or not is_finite(epoch) or epoch < 0:
            return None
        mantissa, _, exponent = raw.strip().lower().partition("e")
        decimals = len(mantissa.partition(".")[2]) - (int(exponent) if exponent.lstrip(
            "+-").isdecimal() else 0)
        # The tqdm callback prints round(epoch, 2), PrinterCallback the float's repr: two
        # decimals or fewer may be a rounding, more are the epoch itself.
        unit = 10.0**-decimals if decimals > 2 else 0.01
        step = epoch * per_epoch
        if unit * per_epoch >= 1 or abs(step - round(step)) > unit * per_epoch / 2 + 1e-6:
            return None  # the rounding spans more than one step, or no step is named
        return round(step)

    def _bar(self, text: str, start: int, end: int) -> slice | None:
        # The last "| n/total [" before `end`: tqdm's count, read with str methods
        # because this runs on every bar redraw. Where the count was, when one was read.
        bracket = text.rfind(" [", start, end)
        if bracket < 0:
            return None
        pipe = text.rfind("|", start, bracket)
        if pipe < 0:
            return None
        field = text[pipe + 1 : bracket]
        done, slash, total = field.strip().partition("/")
        if slash and done.isdecimal() and total.isdecimal() and len(done) <= 15:
            self.bar_step = int(done)
            first = pipe + 1 + len(field) - len(field.lstrip())
            return slice(first, first + len(done))
        return None

    def _record(self, body: str, text: str, ctx: Context) -> bool:
        values: dict[str, float] = {}
        plain = False
        epoch: str | None = None
        for item in body[2:-1].split(", '"):
            key, sep, raw = item.partition("': ")
            if not sep or key in SKIP:
                if key == "epoch":
                    plain, epoch = True, raw
                continue
            value = number_value(raw)
            if value is None:
                value = number_value(raw.strip().strip("'"))  # releases that quote numbers
            if value is None:
                # numpy 2 prints np.float64(0.85); some releases log grad_norm as a tensor.
                value = wrapped_value(raw)
            else:
                plain = True
            if value is not None:
                values[RENAME.get(key, key)] = value
        if not values or not plain:
            # A dict of tensors only is a loss dict printed by the script (DETR's, after
            # its stop message), not the Trainer's log, which always holds plain numbers.
            return False
        # Beside a training record already read, an evaluation takes its number; a log of
        # evaluations alone numbers them in order.
        if not (self.trained and _beside_training(values)):
            self.records += 1
            self.trained = self.trained or not _beside_training(values)
        ctx.votes["transformers"] += 1
        if self.bar_step is not None:
            step = self.bar_step
        elif self.by_epoch is not False and (placed := self._epoch_step(epoch)) is not None:
            step = placed
            if self.by_epoch is None:
                self.by_epoch = True
                ctx.axis = EPOCH_STEPS
                ctx.note("hf-epoch", self._epoch_note())
        elif self.by_epoch:
            own = ctx.own_last_step
            step = own if own is not None else 0
        else:
            self.by_epoch = False
            # An evaluation or the end-of-training summary is logged at the step of the
            # training record before it: it takes that record's number, not one of its own.
            step = self.records
            ctx.axis = RECORD
            ctx.note(
                "hf-order",
                "Hugging Face Trainer lines carry no step and no progress bar was found: "
                "the record's position (1, 2, ...) is their number, placed on the run's "
                "steps by matching values with its event files where it can be.",
            )
        ctx.points_at(step, list(values.items()))
        if self.learn and len(body) == len(text) <= fast.LEARN_CHARS:
            self.shape = _learn(body, values, ctx)
        grad = values.get("grad_norm")
        loss = values.get("loss")
        if grad is not None and loss is not None and not is_finite(grad) and is_finite(loss):
            ctx.note(
                "hf-nan-filter",
                f"{ctx.source}:{ctx.line}: grad_norm is {grad} while loss is finite "
                f"({loss}). The Trainer's default logging_nan_inf_filter=True logs a "
                "NaN/Inf loss as the running average (or 0.0), so here grad_norm is the "
                "honest signal; rerun with logging_nan_inf_filter=False to see the loss.",
            )
        return True


    def _epoch_note(self) -> str:
        per_epoch = self.steps_per_epoch()
        if "per_epoch" in self.header:
            source = "its 'Num update steps per epoch'"
        elif self.from_examples:
            source = (f"its 'Num examples = {self.header.get('examples')}' over 'Total train "
                      f"batch size = {self.header.get('batch')}'")
        else:
            source = (f"its 'Total optimization steps = {self.header.get('max_steps')}' over "
                      f"'Num Epochs = {self.header.get('epochs')}'")
        return ("Hugging Face Trainer lines carry no step and no progress bar was found: "
                f"each is placed at its epoch x {per_epoch} steps per epoch (from {source}), "
                "the Trainer's global_step.")


_BESIDE = ("eval_", "test_", "predict_")
_SUMMARY = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second",
                      "train_loss"})


def _beside_training(values: dict[str, float]) -> bool:
    """Whether a dict is not a training step's log: an evaluation's metrics (``eval_``
    keys, ``evaluate`` logging them at the current global step, right after that step's
    training log) or the summary ``train()`` logs at its end (``train_runtime``, ...)."""
    return all(k.startswith(_BESIDE) or k in _SUMMARY or k == "total_flos" for k in values)


_Shape = fast.Shape
_SIMPLE_KEY = re.compile(r"\w++")


def _learn(body: str, values: dict[str, float], ctx: Context) -> _Shape | None:
    """The shape of a record that is exactly one dict: its keys in order, each kept value
    a finite decimal. Keys are plain words, so no later line of the shape can split
    differently under ``_record``."""
    parts: list[str] = []
    tags: list[str] = []
    keys: list[str] = []
    for item in body[2:-1].split(", '"):
        key, _, raw = item.partition("': ")
        if _SIMPLE_KEY.fullmatch(key) is None:
            return None
        keys.append(key)
        if key in SKIP:
            parts.append(re.escape(key) + r"': [^,{}':]*+")
            continue
        tag = RENAME.get(key, key)
        if tag in tags or re.fullmatch(fast.DECIMAL, raw) is None:
            return None
        tags.append(tag)
        parts.append(re.escape(key) + "': (" + fast.DECIMAL + ")")
    if not tags or tags != list(values):
        return None
    block = ctx.store.block(tuple(tags), ctx.rank, 0)
    pattern = r"\{'" + ", '".join(parts) + r"\}"
    return fast.Shape("", pattern, block, _no_step, " ".join(keys))


def _no_step(row: Row) -> int:
    return 0  # the step is the bar's, not the record's
