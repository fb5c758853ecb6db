"""What a file holds, told by its first bytes rather than its name.

A torch zip archive starts with a local header (``PK\\x03\\x04``), a safetensors file with
the 8-byte length of its JSON header, a pickle with ``PROTO`` (protocol 2 and later) or the
first opcode of a protocol 0 or 1 pickle. Anything else, text above all, is not a
checkpoint, and saying "a text file" is more use than a list of globals it would need.
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


def not_a_checkpoint(sample: bytes) -> str:
    """What a file none of the readers takes looks like, from its first bytes."""
    line = text_line(sample)
    if line is not None:
        return f"not a checkpoint: a text file ({line!r})"
    return f"not a checkpoint: starts with bytes {sample[:8].hex()}"


def text_line(sample: bytes) -> str | None:
    """The first line of ``sample`` when it reads as text, else None."""
    text = sample.decode("utf-8", "ignore")
    if not text or len(text.encode()) < len(sample) - 3:  # allow a character cut at the end
        return None
    if any(not (c.isprintable() or c in "\t\r\n\f") for c in text):
        return None
    return text.splitlines()[0][:60] if text.strip() else None
