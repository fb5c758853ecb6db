"""PyTorch errors about non-finite values, and other fatal errors.

Under ``torch.autograd.set_detect_anomaly(True)`` a failing backward prints a warning
``Error detected in LogBackward0. Traceback of forward call that caused the error:``
followed by the forward frames, then raises ``RuntimeError: Function 'LogBackward0'
returned nan values in its 0th output.`` The event keeps the forward frames that are
the user's own (not inside torch or site-packages): that is where the NaN was made.

``clip_grad_norm_(..., error_if_nonfinite=True)`` raises ``The total norm of order
2.0 for gradients from `parameters` is non-finite``. Any other ``SomethingError: ...``
at the start of a line becomes an ``error`` event.
"""

from __future__ import annotations

import re
from typing import Any

from analyzer.ingest.logformats.context import Context

_DETECTED = re.compile(r"Error detected in (\w++)\. Traceback of forward call")
_FRAME = re.compile(r'\s*+File "([^"]++)", line (\d{1,15}+)')
_RETURNED = re.compile(r"Function '(\w++)' returned (nan|inf) values in its (\d{1,15}+)\w* output")
_CLIP = re.compile(r"The total norm of order \S++ for gradients from `parameters` is non-finite")
_ERROR = re.compile(r"(?:\w++\.)*+(\w*?(?:Error|Exception)): ?+(.*+)")
_LIBRARY = ("site-packages", "dist-packages", "/torch/", "\\torch\\", "<frozen", "/lib/python")


def nonfinite_report(text: str) -> tuple[str, str, dict[str, Any]] | None:
    """The tag, kind and detail of an error message that reports a non-finite value
    (autograd's anomaly error, ``clip_grad_norm_``'s), or None."""
    m = _RETURNED.search(text)
    if m is not None:
        function = m.group(1)
        return f"autograd:{function}", m.group(2), {"function": function,
                                                    "output": int(m.group(3))}
    if _CLIP.search(text) is not None:
        return "grad_norm", "nan-or-inf", {}
    return None


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
            tag, kind, extra = nonfinite_report(text) or ("", "", {})
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
            return True
        return False
