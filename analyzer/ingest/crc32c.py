"""CRC-32C (Castagnoli) as TFRecord framing uses it, for one buffer or many at once.

Event files hold millions of records of a few dozen bytes each. Calling a C CRC routine
once per record costs more in call overhead than in hashing. Two ways around it:

* records of equal length checked together: a 2-D array of shape (records, length) is
  hashed four bytes at a time with slicing-by-4 tables, every record of the block at once;
* a whole run of records checked in one C call (:func:`neutral_fields`): CRC-32C is affine,
  so the stored CRC of each record can be replaced by the 32-bit value that makes the
  record's bytes, from its header to its CRC field, leave a CRC register started at zero
  at zero, when (and, but for chance, only when) the stored CRC is right. Then the register
  over the whole run ends at zero exactly when, but for a chance of about 2**-32 per run,
  every record's payload checks. Unlike XORing records together, errors in different
  records cannot cancel by repeating each other: each is shifted by its place in the run.
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


def unmask(stored: U32) -> U32:
    """The CRC a masked CRC was made from."""
    x = stored - np.uint32(_MASK_DELTA)
    return (x << np.uint32(15)) | (x >> np.uint32(17))


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
    return int(google_crc32c.extend(crc, data if isinstance(data, bytes) else bytes(data)))


# Per payload length n: the value K[n] such that a record of n payload bytes whose payload
# CRC is c leaves a CRC register started at zero at zero after its CRC field, when that
# field holds c ^ K[n] instead of the masked c. Filled on first use of each length.
NEUTRAL_MAX = 4096
_NEUTRAL = np.zeros(NEUTRAL_MAX + 1, dtype=np.uint32)
_NEUTRAL_DONE = np.zeros(NEUTRAL_MAX + 1, dtype=bool)


def neutral_keys(lengths: npt.NDArray[np.int64]) -> U32:
    """K[n] for each length (all at most :data:`NEUTRAL_MAX`).

    A record is header H (12 bytes) | payload P (n) | CRC field. The register started at
    zero, R0, after H|P is crc(H|P) ^ crc(0^(12+n)) (crc with its usual start and final
    inversion), and crc(H|P) = shift_n(crc(H)) ^ crc(P), where shift_n(crc(H)) =
    crc(H|0^n) ^ crc(0^n). A field holding R0's four bytes (little-endian, the register's
    bit order) brings the register back to zero, so K[n] = crc(H|0^n) ^ crc(0^n) ^
    crc(0^(12+n)) with H the header of a length-n record (it depends on n alone).
    """
    present = np.flatnonzero(np.bincount(lengths.astype(np.intp), minlength=1))
    todo = present[~_NEUTRAL_DONE[present]]
    for n in todo.tolist():
        length = int(n).to_bytes(8, "little")
        header = length + mask_int(crc32c_extend(0, length)).to_bytes(4, "little")
        _NEUTRAL[n] = (crc32c_extend(0, header + bytes(n)) ^ crc32c_extend(0, bytes(n))
                       ^ crc32c_extend(0, bytes(12 + n)))
        _NEUTRAL_DONE[n] = True
    keys: U32 = _NEUTRAL[lengths.astype(np.intp)]
    return keys


def register_is_zero(data: bytes) -> bool:
    """Whether a CRC register started at zero ends at zero over ``data``."""
    return crc32c_extend(0xFFFFFFFF, data) == 0xFFFFFFFF
