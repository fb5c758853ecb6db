"""Numbers of many lines of one layout read at once, from their bytes.

A layout (see ``fast.Shape``) is a line's characters but its ASCII digits: every line of
one layout holds each of its numbers at the same byte offsets, with the same sign,
decimal point and exponent mark. The numbers of a run of such lines are then read in
numpy from one byte array: the digits of each number as a column of the matrix the
lines make, a number's integer mantissa as the dot product of its digit columns with
powers of ten.

A value becomes ``mantissa * 10**scale`` (``scale`` the exponent less the digits after
the point), computed as one multiplication or division of two floats that are exact:
the mantissa has at most ``MANTISSA_DIGITS`` digits (below 2**53) and ``10**|scale|``
is exact for ``|scale| <= 22``. One correctly rounded operation on exact operands is
the correctly rounded value of the decimal, which is what ``float`` gives for the same
text (the fast path of every correct decimal reader). A value whose scale lies further
out is read by ``float`` from its text. A layout whose numbers do not fit these bounds,
or whose line is not ASCII, gets no numeric form, and its lines are sliced into strings
as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

MANTISSA_DIGITS = 15
"""Digits of a mantissa read in numpy: 10**15 - 1 is below 2**53, so exact as a float."""
_EXACT_POWER = 22
"""10**22 is the largest power of ten a float holds exactly."""
_NUMBER = re.compile(r"([-+]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([-+]?)([0-9]+))?")
_POWERS = 10 ** np.arange(MANTISSA_DIGITS, dtype=np.int64)[::-1]
_TENS = np.array([float(10**i) for i in range(_EXACT_POWER + 1)])
"""Powers of ten, each exact."""


@dataclass(frozen=True)
class Value:
    """Where one value group's parts lie among a layout's digit columns."""

    mantissa: tuple[int, int]
    exponent: tuple[int, int]
    exponent_sign: int
    decimals: int
    negative: bool
    span: tuple[int, int]
    """The value's characters in the line, to read it with ``float`` when out of bounds."""


@dataclass(frozen=True)
class Numeric:
    """The numbers of one layout: ``positions`` are the byte offsets of the digits read,
    from the start of the line; each counter, value and fixed group names its columns."""

    positions: np.ndarray
    counters: tuple[tuple[int, int], ...]
    values: tuple[Value, ...]
    fixed: tuple[tuple[tuple[int, int], np.ndarray], ...]


def numeric(
    line: str,
    spans: list[tuple[int, int]],
    skip: int,
    counters: tuple[int, ...],
    fixed: tuple[tuple[int, str], ...],
) -> Numeric | None:
    """The numeric form of the layout of ``line``, whose groups lie at ``spans``: groups
    before ``skip`` are counters, of which those in ``counters`` are read (digits only);
    the rest are values. None when the line is not ASCII or a number is out of bounds."""
    if not line.isascii():
        return None
    positions: list[int] = []

    def columns(start: int, text: str) -> tuple[int, int]:
        first = len(positions)
        positions.extend(start + i for i in range(len(text)))
        return first, len(positions)

    read: list[tuple[int, int]] = []
    for g in counters:
        a, b = spans[g]
        text = line[a:b]
        if not text.isdigit() or len(text) > MANTISSA_DIGITS:
            return None
        read.append(columns(a, text))
    values: list[Value] = []
    for g in range(skip, len(spans)):
        a, b = spans[g]
        m = _NUMBER.fullmatch(line, a, b)
        if m is None:
            return None
        sign, whole, decimals, exp_sign, exponent = m.groups("")
        if (not whole and not decimals) or len(whole) + len(decimals) > MANTISSA_DIGITS:
            return None
        first = len(positions)
        columns(m.start(2), whole)
        if decimals:
            columns(m.start(3), decimals)
        mantissa = (first, len(positions))
        exp = columns(m.start(5), exponent) if exponent else (len(positions), len(positions))
        if exp[1] - exp[0] > 2:
            return None
        value = Value(mantissa, exp, -1 if exp_sign == "-" else 1, len(decimals), sign == "-",
                      (a, b))
        values.append(value)
    fixed_cols = []
    for g, text in fixed:
        a, b = spans[g]
        if line[a:b] != text:
            return None
        digits = [(a + i, ord(ch) - 48) for i, ch in enumerate(text) if "0" <= ch <= "9"]
        first = len(positions)
        positions.extend(p for p, _ in digits)
        fixed_cols.append(((first, len(positions)), np.array([d for _, d in digits], np.int64)))
    return Numeric(
        np.array(positions, dtype=np.int64), tuple(read), tuple(values), tuple(fixed_cols)
    )


def _number(digits: np.ndarray, cols: tuple[int, int]) -> np.ndarray:
    """The integers whose digits are the columns ``cols`` of ``digits``."""
    a, b = cols
    if a == b:
        return np.zeros(len(digits), dtype=np.int64)
    return np.asarray(digits[:, a:b] @ _POWERS[MANTISSA_DIGITS - (b - a) :])


def evaluate(
    form: Numeric, data: np.ndarray, starts: np.ndarray, lines: list[str], rows: np.ndarray
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """For the lines ``rows`` (indexes into ``lines``, starting at ``starts`` in ``data``,
    the lines' bytes): whether each holds its fixed groups' text, its counters, and its
    values (one column per value group)."""
    digits = data[starts[rows][:, None] + form.positions[None, :]].astype(np.int64) - 48
    fits = np.ones(len(rows), dtype=bool)
    for cols, want in form.fixed:
        fits &= (digits[:, cols[0] : cols[1]] == want).all(axis=1)
    counters = [_number(digits, cols) for cols in form.counters]
    values = np.empty((len(rows), len(form.values)), dtype=np.float64)
    for j, value in enumerate(form.values):
        mantissa = _number(digits, value.mantissa).astype(np.float64)
        a, b = value.exponent
        if a == b:  # no exponent: the scale is the same on every line
            out = mantissa / _TENS[value.decimals]
        else:
            scale = value.exponent_sign * _number(digits, value.exponent) - value.decimals
            size = np.abs(scale)
            far = np.flatnonzero(size > _EXACT_POWER)
            np.minimum(size, _EXACT_POWER, out=size)
            out = np.where(scale >= 0, mantissa * _TENS[size], mantissa / _TENS[size])
            for i in far.tolist():
                out[i] = float(lines[int(rows[i])][value.span[0] : value.span[1]])
                if value.negative:
                    out[i] = -out[i]  # undone below: the text holds its sign
        if value.negative:
            out = -out
        values[:, j] = out
    return fits, counters, values
