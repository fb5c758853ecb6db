"""PyTorch errors about non-finite values, and other fatal errors.

Under ``torch.autograd.set_detect_anomaly(True)`` a failing backward prints a warning
``Error detected in LogBackward0. Traceback of forward call that caused the error:``
followed by the forward frames, then raises ``RuntimeError: Function 'LogBackward0'
returned nan values in its 0th output.`` The event keeps the forward frames that are
the user's own (not inside torch or site-packages): that is where the NaN was made.

``clip_grad_norm_(..., error_if_nonfinite=True)`` raises ``The total norm of order
2.0 for gradients from `parameters` is non-finite``. Any other ``SomethingError: ...``
at the start of a line becomes an ``error`` event; one whose message says the loss is
non-finite (a script's own check, ``FloatingPointError: loss is nan at step 5``) is also a
``nonfinite`` event for ``loss``, at the step it names.
"""

from __future__ import annotations

import math
import re
from typing import Any

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import to_float, to_step
from analyzer.ingest.logformats.stopping import LOSS_IS, STEP_NAMED

_DETECTED = re.compile(r"Error detected in (\w++)\. Traceback of forward call")
_FRAME = re.compile(r'\s*+File "([^"]++)", line (\d{1,15}+)')
_RETURNED = re.compile(r"Function '(\w++)' returned (nan|inf) values in its (\d{1,15}+)\w* output")
_CLIP = re.compile(r"The total norm of order \S++ for gradients from `parameters` is non-finite")
_ERROR = re.compile(r"(?:\w++\.)*+(\w*?(?:Error|Exception)): ?+(.*+)")
_LIBRARY = ("site-packages", "dist-packages", "/torch/", "\\torch\\", "<frozen", "/lib/python")


Report = tuple[str, str, dict[str, Any], int | None]
"""A non-finite value an error message reports: tag, kind, detail, and the step it names."""


def nonfinite_report(text: str) -> Report | None:
    """What an error message says was non-finite: autograd's anomaly error,
    ``clip_grad_norm_``'s, or a script's own ``loss is nan at step 5`` (``raise
    FloatingPointError(f"loss is {loss} at step {step}")``); None when it says nothing of
    the kind."""
    m = _RETURNED.search(text)
    if m is not None:
        function = m.group(1)
        return f"autograd:{function}", m.group(2), {"function": function,
                                                    "output": int(m.group(3))}, None
    if _CLIP.search(text) is not None:
        return "grad_norm", "nan-or-inf", {}, None
    loss = LOSS_IS.search(text)
    value = None if loss is None else to_float(loss.group(1))
    if value is None or math.isfinite(value):
        return None
    kind = "nan" if math.isnan(value) else ("+inf" if value > 0 else "-inf")
    step = STEP_NAMED.search(text)
    return "loss", kind, {}, to_step(step.group(1)) if step is not None else None


def error_type(text: str) -> str | None:
    """The exception type a ``SomethingError: message`` line starts with, or None."""
    m = _ERROR.match(text)
    return m.group(1) if m is not None and text[:1].isalpha() else None


class AnomalyParser:
    framework = "pytorch"
    repeats = False  # its error pattern would take lines meant for earlier parsers
    triggers: tuple[str, ...] = (
        "Error",
        'File "',
        "Exception",
        "returned nan",
        "returned inf",
        "Traceback",
        "Triggered internally",
    )

    def __init__(self) -> None:
        self.function: str | None = None
        self.frames: list[str] = []
        self.collecting = False

    def parse(self, text: str, ctx: Context) -> bool:
        m = _DETECTED.search(text)
        if m is not None:
            self.function, self.frames, self.collecting = m.group(1), [], True
            return True
        frame = _FRAME.match(text)
        if frame is not None:
            if self.collecting:
                path = frame.group(1)
                if not any(lib in path for lib in _LIBRARY):
                    self.frames.append(f"{path}:{frame.group(2)}")
            return True
        if "Traceback (most recent call last)" in text or "Triggered internally" in text:
            self.collecting = False
            return True
        m = _RETURNED.search(text)
        if m is not None:
            function = m.group(1)
            frames = self.frames if function == self.function else []
            tag, kind, extra, _ = nonfinite_report(text) or ("", "", {}, None)
            ctx.nonfinite(tag, kind, None, text, **extra, user_frames=list(frames))
            ctx.votes["pytorch"] += 1
            self.collecting = False
            return True
        if _CLIP.search(text) is not None:
            ctx.nonfinite("grad_norm", "nan-or-inf", None, text)
            ctx.votes["pytorch"] += 1
            return True
        m = _ERROR.match(text)
        if m is not None and text[:1].isalpha():
            ctx.event("error", None, text, {"type": m.group(1)})
            report = nonfinite_report(text)
            if report is not None:  # the script's own check raised on a non-finite loss
                tag, kind, extra, step = report
                ctx.nonfinite(tag, kind, step, text, global_step=True, **extra)
                ctx.votes["pytorch"] += 1
            return True
        return False
