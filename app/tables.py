"""Every table of the dashboard, drawn one way: missing cells blank, numbers short, no
inner scroll for an ordinary table, the first column pinned, long text given room.

``st.dataframe`` draws a missing cell as a grey "None" and a float with all its digits
(``9.640987946362755e+37``); neither helps someone reading a run that died. :func:`show`
turns the cells it must into text before drawing: a missing value becomes blank, a float
keeps 5 significant digits, and a NaN or an infinity that is data is spelled ``nan`` /
``+inf`` / ``-inf``. Which NaN is data: in a column of Python objects (a frame built by
:func:`frame`, or rows holding ``None``), ``None`` is missing and a float NaN is data; in a
float column pandas has already turned ``None`` into NaN, so there a NaN counts as missing
when every other value of the column is a whole number (a step, a count), and as data
otherwise (a logged value). Columns of whole numbers with nothing missing stay numbers,
so they sort as numbers.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
import streamlit as st

ROW_PX = 35
"""Streamlit's default row height in a dataframe (the header's too)."""
_BORDER_PX = 3
LONG_TEXT = 40
"""A text column whose longest cell is longer than this gets the wide column."""


def plural(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``, ``1 read issue``, ``0 read issues``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def frame(rows: Iterable[Mapping[str, object]]) -> pd.DataFrame:
    """A frame of ``rows`` that keeps each cell as given: ``None`` stays missing and a
    float NaN stays data (pandas would make both NaN in a column of numbers)."""
    return pd.DataFrame(list(rows), dtype=object)


def without_blank(frame_: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """``frame_`` less those of ``columns`` that are blank in every row (``None`` or empty
    text): a column that says nothing only pushes the others past the page's edge."""
    blank = [c for c in columns if c in frame_.columns
             and all(_missing(v) or v == "" for v in frame_[c])]
    return frame_.drop(columns=blank)


def number_text(value: float) -> str:
    """A float in a cell: whole numbers without a point, others to 5 significant digits,
    NaN and infinities spelled out."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.5g}"


def _missing(value: object) -> bool:
    return value is None or value is pd.NA or value is pd.NaT


def _cell(value: object, *, nan_missing: bool) -> object:
    if _missing(value):
        return ""
    if isinstance(value, float):
        if nan_missing and math.isnan(value):
            return ""
        return number_text(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return value if isinstance(value, str) else str(value)


def _whole(values: pd.Series) -> bool:
    """Every value present is a whole number (an int, or a float with nothing after the
    point), so a NaN among them stood for a missing one."""
    seen = False
    for v in values:
        if _missing(v) or (isinstance(v, float) and math.isnan(v)):
            continue
        if isinstance(v, bool):
            return False
        if isinstance(v, numbers.Integral) or (
                isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
            seen = True
            continue
        return False
    return seen


def _texts(values: pd.Series) -> bool:
    """A column of text: a NaN in it stands for a missing cell, never for data."""
    if pd.api.types.is_string_dtype(values.dtype) and not pd.api.types.is_object_dtype(
            values.dtype):
        return True
    present = [v for v in values if not _missing(v)
               and not (isinstance(v, float) and math.isnan(v))]
    return bool(present) and all(isinstance(v, str) for v in present)


def _numeric(values: pd.Series) -> bool:
    return all(isinstance(v, numbers.Real) and not isinstance(v, bool)
               for v in values if not _missing(v))


def display(frame_: pd.DataFrame, keep: Iterable[str] = ()) -> tuple[pd.DataFrame, set[str]]:
    """``frame_`` as it is shown, and the columns that became right-aligned number text;
    the columns in ``keep`` (configured by the caller) are left as they are."""
    out = frame_.copy()
    numbers: set[str] = set()
    kept = set(keep)
    for col in out.columns:
        if col in kept:
            continue
        values = out[col]
        if pd.api.types.is_bool_dtype(values.dtype):
            continue
        if pd.api.types.is_integer_dtype(values.dtype) and not values.isna().any():
            continue  # a nullable integer column with a gap goes on: pd.NA draws "None"
        whole = _whole(values)
        if whole and not any(_missing(v) or (isinstance(v, float) and math.isnan(v))
                             for v in values):
            try:
                out[col] = pd.array([int(v) for v in values], dtype="int64")
            except OverflowError:  # a count beyond int64: text, as any other
                out[col] = [_cell(v, nan_missing=False) for v in values]
                numbers.add(str(col))
            continue
        # NaN is pandas' own marker for a missing cell in a column of counts or of text
        texts = _texts(values)
        nan_missing = texts or (pd.api.types.is_float_dtype(values.dtype) and whole)
        out[col] = [_cell(v, nan_missing=nan_missing) for v in values]
        if _numeric(values):
            numbers.add(str(col))
    return out, numbers


def height(rows: int, max_rows: int = 25) -> int:
    """Pixels that show up to ``max_rows`` rows and the header without an inner scroll."""
    return ROW_PX * (max(1, min(rows, max_rows)) + 1) + _BORDER_PX


def _config(shown: pd.DataFrame, numbers: set[str],
            given: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    columns = [str(c) for c in shown.columns]
    for k, col in enumerate(columns):
        if col in given:
            cfg = given[col]
            if col in numbers and isinstance(cfg, dict) and _text(cfg) \
                    and cfg.get("alignment") is None:
                config[col] = {**cfg, "alignment": "right"}  # numbers made text, as others
            continue
        if col in numbers:
            config[col] = st.column_config.TextColumn(alignment="right", pinned=k == 0 or None)
            continue
        longest = max((len(v) for v in shown[col] if isinstance(v, str)), default=0)
        if longest > LONG_TEXT:
            config[col] = st.column_config.TextColumn(
                width="large", pinned=k == 0 or None,
                help="Long cells: widen the column, or hover a cell to read it whole.")
        elif k == 0:
            config[col] = st.column_config.Column(pinned=True)
    return dict(given) | config


def _text(config: Any) -> bool:
    """A column config of a text column (st.column_config.TextColumn or a bare label)."""
    if isinstance(config, str):
        return True
    kind = config.get("type_config", {}).get("type") if isinstance(config, dict) else None
    return kind == "text"


def show(frame_: pd.DataFrame, key: str, *, column_config: dict[str, Any] | None = None,
         column_order: list[str] | None = None, on_select: Any = None,
         selection_mode: Any = None, max_rows: int = 25,
         widths: Mapping[str, int] | None = None, **kw: Any) -> Any:
    """``st.dataframe`` the dashboard's way (see the module's docstring); returns its
    value (the selection event when ``on_select`` is given). ``widths`` sets columns'
    widths in pixels (their cells shown as any other's), so that a table of many columns
    fits the page instead of running past its edge."""
    given = dict(column_config or {})
    # a column configured as text (a label, a help) is still shown the dashboard's way; one
    # configured otherwise (a number format, a progress bar) gets its values as they are
    shown, numbers = display(frame_, keep=[c for c, cfg in given.items() if not _text(cfg)])
    config = _config(shown, numbers, given)
    for col, px in (widths or {}).items():
        if col in shown.columns and col not in given:
            config[col] = st.column_config.TextColumn(
                width=px, alignment="right" if col in numbers else None,
                pinned=col == str(shown.columns[0]) or None,
                help="Hover a cell to read it whole.")
    args: dict[str, Any] = {
        "hide_index": True, "width": "stretch", "key": key,
        "height": height(len(shown), max_rows),
        "column_config": config,
    }
    if column_order is not None:
        args["column_order"] = column_order
    if on_select is not None:
        args["on_select"] = on_select
    if selection_mode is not None:
        args["selection_mode"] = selection_mode
    return st.dataframe(shown, **(args | kw))
