"""The element types a checkpoint names, read with numpy instead of torch.

``torch.save`` and safetensors store values raw and little-endian, so their bytes can be
viewed with numpy. Types numpy lacks are widened exactly: bfloat16 is the top half of a
float32, and the float8 formats (256 codes each) go through a table built here from
their definitions. Floating types become float32 (float64 stays float64); a complex
tensor becomes its real and imaginary parts one after the other, as ``view_as_real``
gives them. Integers and booleans keep their own numpy type. A name not in the table
(quantized types, sub-byte integers, ...) is left to torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

Kind = Literal["float", "complex", "int", "bool"]


@dataclass(frozen=True)
class NpType:
    """How the bytes of one element type are viewed and widened."""

    name: str
    raw: str
    """The numpy type the stored bytes are viewed as (``<u2`` for bfloat16, ...)."""
    itemsize: int
    kind: Kind
    decode: str | None = None
    """``bf16``, ``half`` (float16 halves of complex32) or a float8 format: how the raw
    values become float32; None when the raw type is already the value."""

    @property
    def numeric(self) -> bool:
        return self.kind in ("float", "complex")


_TYPES = [
    NpType("float32", "<f4", 4, "float"),
    NpType("float64", "<f8", 8, "float"),
    NpType("float16", "<f2", 2, "float"),
    NpType("bfloat16", "<u2", 2, "float", "bf16"),
    NpType("float8_e4m3fn", "u1", 1, "float", "float8_e4m3fn"),
    NpType("float8_e5m2", "u1", 1, "float", "float8_e5m2"),
    NpType("float8_e4m3fnuz", "u1", 1, "float", "float8_e4m3fnuz"),
    NpType("float8_e5m2fnuz", "u1", 1, "float", "float8_e5m2fnuz"),
    NpType("float8_e8m0fnu", "u1", 1, "float", "float8_e8m0fnu"),
    NpType("complex32", "<f2", 4, "complex"),
    NpType("complex64", "<f4", 8, "complex"),
    NpType("complex128", "<f8", 16, "complex"),
    NpType("bool", "?", 1, "bool"),
    NpType("uint8", "u1", 1, "int"),
    NpType("int8", "i1", 1, "int"),
    NpType("int16", "<i2", 2, "int"),
    NpType("uint16", "<u2", 2, "int"),
    NpType("int32", "<i4", 4, "int"),
    NpType("uint32", "<u4", 4, "int"),
    NpType("int64", "<i8", 8, "int"),
    NpType("uint64", "<u8", 8, "int"),
]
TYPES = {t.name: t for t in _TYPES}
TYPES["chalf"] = TYPES["complex32"]  # spellings torch also accepts
TYPES["half"], TYPES["float"] = TYPES["float16"], TYPES["float32"]
TYPES["double"] = TYPES["float64"]
TYPES["long"], TYPES["int"], TYPES["short"] = TYPES["int64"], TYPES["int32"], TYPES["int16"]
TYPES["cfloat"], TYPES["cdouble"] = TYPES["complex64"], TYPES["complex128"]


def np_type(name: str) -> NpType | None:
    return TYPES.get(name)


_FLOAT8 = {
    # name: (exponent bits, mantissa bits, bias, infinities, NaN codes)
    "float8_e4m3fn": (4, 3, 7, False, "all_ones"),
    "float8_e5m2": (5, 2, 15, True, "ieee"),
    "float8_e4m3fnuz": (4, 3, 8, False, "neg_zero"),
    "float8_e5m2fnuz": (5, 2, 16, False, "neg_zero"),
}


@functools.cache
def float8_table(name: str) -> npt.NDArray[np.float32]:
    """The float32 value of each of the 256 codes of a float8 format."""
    table = np.empty(256, dtype=np.float32)
    if name == "float8_e8m0fnu":  # exponent only: 2^(e - 127); all ones is NaN
        for code in range(256):
            table[code] = np.nan if code == 255 else np.float32(2.0 ** (code - 127))
        return table
    exp_bits, man_bits, bias, infinities, nans = _FLOAT8[name]
    top = (1 << exp_bits) - 1
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent = (code >> man_bits) & top
        mantissa = code & ((1 << man_bits) - 1)
        if nans == "neg_zero" and code == 0x80:
            table[code] = np.nan
            continue
        if exponent == top and infinities:
            table[code] = sign * np.inf if mantissa == 0 else np.nan
            continue
        if exponent == top and mantissa == (1 << man_bits) - 1 and nans == "all_ones":
            table[code] = np.nan
            continue
        if exponent == 0:
            value = mantissa / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            value = (1 + mantissa / (1 << man_bits)) * 2.0 ** (exponent - bias)
        table[code] = np.float32(sign * value)
    return table
