"""Number tokens as training logs print them.

Every pattern here uses possessive quantifiers, so a failed match never backtracks
into a run of digits: matching stays linear in the length of the line.
"""

from __future__ import annotations

import math
import re

# Windows C runtimes print 1.#INF / 1.#IND / 1.#QNAN; glibc prints -nan; numpy and
# torch print nan/inf; JavaScript-flavoured JSON writes Infinity.
NUM = (
    r"[-+]?+(?:1\.\#(?:INF|IND|QNAN|inf|ind|qnan)0*+"
    r"|(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][-+]?+\d++)?+"
    r"|(?i:nan(?:\((?:ind|snan)\))?+|inf(?:inity)?+))"
)
"""A number token."""

STEP = r"\d{1,3}+(?:,\d{3}){1,4}+(?![\d,])|\d{1,15}+(?!\d)"
"""A step counter, thousands separators allowed (``12,000``). Longer digit runs are
not steps: they could not be stored as int64, and Python refuses to convert runs
of thousands of digits at all."""

NUM_FULL = re.compile(NUM + r"\s*+")


def to_float(token: str) -> float | None:
    """The value of a NUM token, or None when it is not one."""
    try:
        return float(token)
    except ValueError:
        pass
    low = token.strip().lower()
    if "#inf" in low:
        return -math.inf if low.startswith("-") else math.inf
    if "nan" in low or "#ind" in low or "#qnan" in low:
        return math.nan
    return None


def number_value(text: str) -> float | None:
    """The value of a field that should hold exactly one number (surrounding blanks allowed)."""
    try:
        # float() accepts exactly the common spellings; only the rare ones pay for a regex.
        return float(text)
    except ValueError:
        pass
    text = text.strip()
    if not text or NUM_FULL.fullmatch(text) is None:
        return None
    return to_float(text)


_WRAPPED = re.compile(
    r"\s*+(?:(?:np|numpy)\.(?:float|int|uint)\d{0,3}+\(|tensor\(\[?+)([^,()\[\]]{1,64}+)"
)
"""A number printed inside its type: numpy 2's ``np.float32(nan)``, torch's
``tensor(nan, device='cuda:0')`` or ``tensor([2.3])``."""


def wrapped_value(text: str) -> float | None:
    """The number a numpy scalar's or a torch tensor's repr holds, or None."""
    m = _WRAPPED.match(text)
    return None if m is None else number_value(m.group(1))


def to_step(token: str) -> int:
    """A STEP token as an int."""
    return int(token.replace(",", ""))
