"""Tensor summaries and source locations shared by the replay passes."""

from __future__ import annotations

import linecache
import math
import os
import re
import sys
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from analyzer.model.replays import TensorStat

# Frames from these trees are machinery, not the user's code.
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_REPLAY_DIR = os.path.dirname(__file__) + os.sep
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
_SKIP = (_TORCH_DIR, _REPLAY_DIR, _STDLIB_DIR)

# torch's own wrappers around calls (dispatch, compile guards, decorators) name no useful line
_PLUMBING = tuple(os.path.join(_TORCH_DIR, p) for p in (
    "_dynamo" + os.sep, "_compile.py", "_ops.py", "utils" + os.sep + "_python_dispatch.py",
    "utils" + os.sep + "_contextlib.py", "optim" + os.sep + "optimizer.py",
    "nn" + os.sep + "modules" + os.sep + "module.py"))

_TRACE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


_ATOMS = (type(None), bool, int, float, complex, str, torch.dtype, torch.device,
          torch.layout, torch.memory_format)


def _collect(value: Any, out: list[torch.Tensor]) -> None:
    # Plain tuples, lists and dicts walked here, in the order pytree flattens them: the op
    # trace asks this of every op's arguments, and pytree's generic walk cost more than many
    # ops themselves. Anything else (a namedtuple, a registered output class) goes to pytree.
    kind = type(value)
    if kind is tuple or kind is list:
        for item in value:
            _collect(item, out)
    elif kind is dict:
        for item in value.values():
            _collect(item, out)
    elif isinstance(value, torch.Tensor):
        out.append(value)
    elif kind not in _ATOMS:
        out.extend(leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor))


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside nested tuples, lists and dicts (and other pytree nodes)."""
    found: list[torch.Tensor] = []
    _collect(value, found)
    return iter(found)


def floating(value: Any) -> list[torch.Tensor]:
    return [t for t in tensors_in(value) if t.is_floating_point() or t.is_complex()]


def is_finite(t: torch.Tensor) -> bool:
    """True when ``t`` holds no NaN or Inf.

    A sum is NaN or infinite when any element is, so a finite sum settles it in one
    reduction, without the full-size boolean mask isfinite() builds (on the CPU about 2.5
    times faster than min and max, which were about ten times faster than the mask). A
    sum can also overflow where every element is finite: then min and max, which
    propagate NaN and are infinite only when an element is, decide.
    """
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return True
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if math.isfinite(float(x.sum())):
        return True
    lo, hi = torch.aminmax(x)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (moved on by every in-place change), None for a tensor made
    under inference mode, which keeps none."""
    return None if t.is_inference() else int(t._version)


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    return all(is_finite(t) for t in tensors)


def neginf_only(tensors: Iterable[torch.Tensor]) -> bool:
    """True when no tensor holds a NaN or +inf: -inf is the only non-finite value there."""
    for t in tensors:
        if is_finite(t):
            continue
        x = t.detach()
        if x.is_complex() or bool(torch.isnan(x).any()) or bool((x == math.inf).any()):
            return False
    return True


def holds_neginf(t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.numel() > 0 and bool((t.detach() == -math.inf).any())


def is_additive_mask(t: torch.Tensor) -> bool:
    """A float attention mask: every entry 0 (attend) or -inf (masked), some of them -inf.

    Data made non-finite by a fault (log(0) of a feature) keeps its other, non-zero values;
    only the log of a one-hot tensor (0 and -inf exactly) would read as a mask.
    """
    if not holds_neginf(t):
        return False
    x = t.detach()
    return bool(((x == 0) | (x == -math.inf)).all())


def scalar_inputs_finite(args: Any) -> bool:
    """Python floats among an op's arguments: ``x * float('inf')`` is not a producer."""
    return all(not isinstance(v, float) or (v == v and abs(v) != float("inf"))
               for v in tree_leaves(args))


def tensor_stat(t: torch.Tensor) -> TensorStat:
    shape = tuple(int(d) for d in t.shape)
    dtype = str(t.dtype).removeprefix("torch.")
    numel = t.numel()
    if not (t.is_floating_point() and numel):
        return TensorStat(shape, dtype, numel)
    with torch.no_grad():
        x = t.detach()
        if x.is_complex():
            x = torch.view_as_real(x)
        lo_t, hi_t = torch.aminmax(x)
        lo, hi = float(lo_t), float(hi_t)
        if math.isfinite(lo) and math.isfinite(hi):
            # the common case: no mask and no float64 copy needed
            return TensorStat(shape, dtype, numel, absmax=max(abs(lo), abs(hi)),
                              absmin=float(x.abs().min()), min=lo, max=hi)
        ok = torch.isfinite(x)
        nan = int(torch.isnan(x).sum())
        posinf = int((x == float("inf")).sum())
        neginf = int((x == float("-inf")).sum())
        if not bool(ok.any()):
            return TensorStat(shape, dtype, numel, nan, posinf, neginf)
        wide = x.to(torch.float64)
        fin = wide[ok]
        mag = fin.abs()
        return TensorStat(shape, dtype, numel, nan, posinf, neginf,
                          absmax=float(mag.max()), absmin=float(mag.min()),
                          min=float(fin.min()), max=float(fin.max()))


def stats_of(value: Any) -> tuple[TensorStat, ...]:
    return tuple(tensor_stat(t) for t in tensors_in(value))


def _is_user_file(filename: str) -> bool:
    if filename.startswith("<frozen"):
        return False
    if "site-packages" in filename or "dist-packages" in filename:
        return not filename.startswith((_TORCH_DIR, _REPLAY_DIR))
    return not filename.startswith(_SKIP)


Frame = tuple[str, int, str]


def _pick(frames: list[Frame], limit: int) -> tuple[str, tuple[str, ...]] | None:
    """The line to blame among ``frames`` (innermost first), and a short stack.

    Only the frames between the replay's own code and the op count: the replay
    calls the model, so anything further out is the caller of the replay. The
    user's innermost line wins; a model made of torch modules alone gets the
    innermost torch line (e.g. Linear.forward) instead.
    """
    inner = 0
    while inner < len(frames) and frames[inner][0].startswith((_REPLAY_DIR, *_PLUMBING)):
        inner += 1
    segment = []
    for frame in frames[inner:]:
        if frame[0].startswith(_REPLAY_DIR):
            break
        if not frame[0].startswith(_PLUMBING):
            segment.append(frame)
    users = [f for f in segment if _is_user_file(f[0])]
    # Without user code, the innermost forward() of a torch module names the line
    # best (Linear.forward's F.linear); wrappers such as _call_impl say nothing.
    torch_own = [f for f in segment if f[0].startswith(_TORCH_DIR)]
    forwards = [f for f in torch_own if f[2] == "forward"]
    chosen = users or forwards or torch_own
    if not chosen:
        return None
    shown = tuple(f"{file}:{line} in {func}" for file, line, func in chosen[:limit])
    return f"{chosen[0][0]}:{chosen[0][1]}", shown


def user_frames_live(limit: int = 6) -> tuple[str, tuple[str, ...]] | None:
    """The line to blame on the live stack; see :func:`_pick`."""
    frames: list[Frame] = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return _pick(frames, limit)


def user_frames_from_trace(trace: Iterable[str], limit: int = 6
                           ) -> tuple[str, tuple[str, ...]] | None:
    """The same from a formatted traceback, as anomaly mode stores it on a node."""
    frames: list[Frame] = []
    for entry in trace:
        m = _TRACE_LINE.search(entry)
        if m:
            frames.append((m["file"], int(m["line"]), m["func"]))
    frames.reverse()  # tracebacks are outermost first
    return _pick(frames, limit)


def source_text(location: str | None) -> str | None:
    """The stripped text of ``file:line``, when the file can be read."""
    if location is None:
        return None
    file, _, line = location.rpartition(":")
    if not line.isdigit():
        return None
    text = linecache.getline(file, int(line)).strip()
    return text or None
