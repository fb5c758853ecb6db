"""CRC-32C (Castagnoli) as TFRecord framing uses it, for one buffer or many at once.

Event files hold millions of records of a few dozen bytes each. Calling a C CRC routine
once per record costs more in call overhead than in hashing, so records of equal length are
checked together: a 2-D array of shape (records, length) is hashed four bytes at a time
with slicing-by-4 tables, every record of the block at once.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_POLY = 0x82F63B78  # CRC-32C polynomial, bit-reflected
_MASK_DELTA = 0xA282EAD8
U32 = npt.NDArray[np.uint32]


def _tables() -> npt.NDArray[np.uint32]:
    t0 = np.zeros(256, dtype=np.uint64)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t0[i] = c
    tables = [t0]
    for _ in range(3):
        prev = tables[-1]
        tables.append((prev >> np.uint64(8)) ^ t0[(prev & np.uint64(0xFF)).astype(np.intp)])
    return np.stack(tables).astype(np.uint32)


_T = _tables()
_T0, _T1, _T2, _T3 = _T[0], _T[1], _T[2], _T[3]
# The four byte tables of a 32-bit step folded pairwise into two 16-bit tables (256 KiB each):
# two gathers per word instead of four.
_IDX16 = np.arange(1 << 16, dtype=np.uint32)
_LO16 = _T3[_IDX16 & 0xFF] ^ _T2[_IDX16 >> 8]
_HI16 = _T1[_IDX16 & 0xFF] ^ _T0[_IDX16 >> 8]
del _IDX16


def crc32c_rows(rows: npt.NDArray[np.uint8], start: int = 0) -> U32:
    """CRC-32C of every row of a C-contiguous (n, length) uint8 array, each continuing a
    CRC ``start`` (of the bytes before it; 0 for none)."""
    n, length = rows.shape
    crc = np.full(n, start ^ 0xFFFFFFFF, dtype=np.uint32)
    words = length // 4
    if words:
        block = np.ascontiguousarray(rows[:, : words * 4]).view("<u4")
        for j in range(words):
            crc ^= block[:, j]
            crc = _LO16[crc & 0xFFFF] ^ _HI16[crc >> 16]
    for j in range(words * 4, length):
        crc = _T0[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def mask(crc: U32) -> U32:
    """TFRecord's masking: rotate right by 15 bits and add a constant, modulo 2**32."""
    rotated = (crc >> 15) | (crc << 17)
    return (rotated.astype(np.uint64) + _MASK_DELTA).astype(np.uint32)


def masked_crc32c_rows(rows: npt.NDArray[np.uint8]) -> U32:
    return mask(crc32c_rows(rows))


def masked_crc32c(data: bytes | memoryview) -> int:
    """Masked CRC-32C of one buffer; uses the C implementation for long payloads."""
    return mask_int(crc32c_extend(0, data))


def mask_int(crc: int) -> int:
    return int(((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF)


def crc32c_extend(crc: int, data: bytes | memoryview) -> int:
    """The CRC-32C of the bytes a CRC ``crc`` was of, followed by ``data`` (unmasked), so
    that a long payload can be checked piece by piece."""
    try:
        import google_crc32c
    except ImportError:  # pragma: no cover - the dependency is declared; keep working without
        arr = np.frombuffer(data, dtype=np.uint8)[None, :]
        return int(crc32c_rows(arr, crc)[0])
    return int(google_crc32c.extend(crc, bytes(data)))
