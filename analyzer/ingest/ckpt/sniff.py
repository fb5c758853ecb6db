"""What a file holds, told by its first bytes rather than its name.

A torch zip archive starts with a local header (``PK\\x03\\x04``), a safetensors file with
the 8-byte length of its JSON header, a pickle with ``PROTO`` (protocol 2 and later) or the
first opcode of a protocol 0 or 1 pickle. Anything else, text above all, is not a
checkpoint, and saying "a text file" is more use than a list of globals it would need.

What such a file holds is described (text, a known format's signature, zero bytes, other
binary data) and its size given, but nothing of it is quoted: a file named ``model.pt`` may
be a link to anything, and reports get shared.
"""

from __future__ import annotations

from analyzer.ingest.ckpt.archive import LOCAL_MAGIC

PICKLE_STARTS = b"(}]c"
"""First bytes of protocol 0 and 1 pickles of a dict, list or object."""


def content_of(head: bytes, size: int, named_safetensors: bool) -> str | None:
    """``zip``, ``safetensors`` or ``pickle`` by the first bytes; None for none of them.
    A file named ``.safetensors`` whose first 8 bytes are a length that fits the file is
    taken for safetensors even when its header is not an object (the header check then
    says what is wrong): its length's low byte may well read as a pickle's first."""
    if head.startswith(LOCAL_MAGIC):
        return "zip"
    if looks_like_safetensors(head, size, strict=not named_safetensors):
        return "safetensors"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "pickle"
    if head[:1] and head[:1] in PICKLE_STARTS:
        return "pickle"
    return None


def mismatch(named: str, content: str) -> str:
    what = {"zip": "a torch zip archive", "pickle": "a pickle", "safetensors": "safetensors"}
    name = "a safetensors file" if named == "safetensors" else "a torch checkpoint"
    return f"named like {name} but holds {what[content]}: read as what it holds"


def looks_like_safetensors(head: bytes, size: int, *, strict: bool) -> bool:
    if len(head) < 9:
        return False
    length = int.from_bytes(head[:8], "little")
    return 2 <= length <= size - 8 and (head[8:9] == b"{" or not strict)


MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip-compressed data"),
    (b"BZh", "bzip2-compressed data"),
    (b"\xfd7zXZ\x00", "xz-compressed data"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-zip archive"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"\x7fELF", "an ELF executable or library"),
    (b"\x93NUMPY", "a NumPy .npy array"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
)
"""Signatures of formats a file named like a checkpoint turns out to hold now and then:
naming the format says what went wrong without quoting a byte of the file."""


def not_a_checkpoint(sample: bytes, size: int) -> str:
    """What a file none of the readers takes holds, told from its first bytes (``sample``)
    without quoting them: the file may be anything a link points to, a credentials file
    included, and reports get shared."""
    return f"not a checkpoint: {content_kind(sample, size)}"


def content_kind(sample: bytes, size: int) -> str:
    """The kind of content ``sample`` (a file's first bytes) starts, and the file's size."""
    if is_text(sample):
        return f"a text file of {size:,} bytes{_text_hint(sample)}; its contents are not quoted"
    for magic, what in MAGIC:
        if sample.startswith(magic):
            return f"{what}, {size:,} bytes"
    if sample and not sample.strip(b"\x00"):
        return (f"{size:,} bytes starting with {len(sample):,} zero bytes (space allocated, "
                "never written?)")
    return f"{size:,} bytes of binary data in no checkpoint format"


def recognised(sample: bytes) -> bool:
    """True when ``sample`` is text, zero bytes or a known format's signature: what a file
    holds is then said as such, not judged as a damaged checkpoint."""
    return is_text(sample) or not sample.strip(b"\x00") or any(
        sample.startswith(magic) for magic, _ in MAGIC)


def is_text(sample: bytes) -> bool:
    """True when ``sample`` reads as UTF-8 text (a character cut at its end allowed)."""
    text = sample.decode("utf-8", "ignore")
    if not text.strip() or len(text.encode()) < len(sample) - 3:
        return False
    return all(c.isprintable() or c in "\t\r\n\f" for c in text)


def _text_hint(sample: bytes) -> str:
    first = sample.lstrip()[:2]
    if first[:1] in (b"{", b"["):
        return ", which looks like JSON"
    if first[:1] == b"<":
        return ", which looks like XML or HTML"
    if first == b"#!":
        return ", a script"
    return ""
