"""tensorboardX's warning about a non-finite value handed to its writer.

Every ``SummaryWriter.add_*`` call of tensorboardX turns its value into a numpy array
through ``x2num.make_np``, whose ``check_nan`` logs ``NaN or Inf found in input tensor.``
at warning level (logger ``tensorboardX.x2num``) when the array's sum is NaN or Inf. The
value is still written. With logging unconfigured Python prints the bare message; a
configured handler adds its header (``WARNING:tensorboardX.x2num:NaN or Inf ...``).

The message names neither the tag nor the step, and cannot tell NaN from Inf: it is a
``nonfinite`` event of tag :data:`TAG` and kind ``nan-or-inf``, after the last step the
log printed, with ``tag_named=False``; the event file the writer wrote holds the value
itself. A warning at the same step as the one before it (several tags written at one
step) adds nothing and is not repeated.
"""

from __future__ import annotations

from analyzer.ingest.logformats.context import Context

MESSAGE = "NaN or Inf found in input tensor"
TAG = "tensorboardX"
"""The event's tag: the writer that warned, as the message names no tag of its own."""


class TensorboardXParser:
    framework = "tensorboardX"
    repeats = False  # one-off warnings between other formats' lines
    triggers: tuple[str, ...] = (MESSAGE,)

    def __init__(self) -> None:
        self.warned: tuple[int | None, int | None] | None = None
        """The last step and rank a warning was reported after."""

    def parse(self, text: str, ctx: Context) -> bool:
        if MESSAGE not in text:
            return False
        at = (ctx.last_step, ctx.rank)
        if at != self.warned:
            self.warned = at
            ctx.nonfinite(TAG, "nan-or-inf", None, text, tag_named=False, writer="tensorboardX")
            ctx.note(
                "tbx-nan",
                f"{ctx.source}:{ctx.line}: tensorboardX warned 'NaN or Inf found in input "
                "tensor.': a value handed to its SummaryWriter was non-finite. The warning "
                "names no tag and no step; the event file holds the value itself.",
            )
        return True
