"""Prefixes put in front of a log line by launchers or by pasting.

Always recognised: quote marks (``> ``); torch's ``[rank3]:`` (its logging's rank
prefix); the elastic agent's ``[default3]:`` (``torchrun --tee``, and the console copy
of every worker's output: ``[{role}{local_rank}]:``, the role ``default`` unless
``--role`` names another, or ``[3]:`` from a ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``
of ``[${rank}]:``; these two are looked for in every record when the head of the file
holds one, see :attr:`PrefixRule.bracketed`); Lightning's ``[rank: 3]``
(``rank_prefixed_message``); Open MPI's ``[1,3]<stdout>:``. Accelerate's logger with
``main_process_only=False`` puts ``[RANK 3]`` at the start of the message, after the logging header
(``12/01/2024 10:00:00 - INFO - __main__ - [RANK 3] ...``): that mark is taken out
wherever it is in the first :data:`EMBEDDED_CHARS` characters. A bare leading number
(``3: text`` from ``srun --label``, ``12\ttext`` from ``cat -n``) is ambiguous, so
the head of the file decides: numbers that keep increasing are pasted line numbers,
numbers that repeat are ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

TAGGED = re.compile(
    r"[ \t]*+(?:"
    r"(?:>[ \t]?+)++"
    r"|\[(?:rank|Rank|RANK)(?:: |[ _])?+(?P<r1>\d{1,9}+)\]:?+[ \t]?+"
    r"|\[[A-Za-z][A-Za-z_\-]{0,31}+(?P<r2>\d{1,9}+)\]:[ \t]?+"
    r"|\[(?P<r4>\d{1,9}+)\]:[ \t]?+"
    r"|\[\d++,(?P<r3>\d{1,9}+)\]<std(?:out|err)>:[ \t]?+"
    r")"
)
EMBEDDED = re.compile(r"\[(?:RANK (?P<a>\d{1,9}+)|rank: (?P<b>\d{1,9}+))\] ?+")
"""Accelerate's ``[RANK 3]`` and Lightning's ``[rank: 3]`` inside a logging header."""
EMBEDDED_MARKS = ("[RANK ", "[rank: ")
EMBEDDED_CHARS = 256
_NUMBERED = re.compile(r"[ \t]*+(\d{1,9}+)(?::[ \t]|\t|[ \t]?+\|[ \t])")

NumberMode = Literal["none", "rank", "line"]

_STARTS = frozenset(" \t>[0123456789")


@dataclass(frozen=True)
class PrefixRule:
    """How leading numbers are read in one file."""

    numbers: NumberMode = "none"
    bracketed: bool = False
    """True when the head of the file holds a launcher's bracketed rank (``[trainer3]:``,
    ``[3]:``): such a prefix has no mark that a whole batch could be searched for cheaply
    (``]:`` is in most bars), so every batch of the file is then treated as possibly
    prefixed. A file whose head holds none is read as one without them, where a batch
    holds no other mark."""

    def strip(self, text: str) -> tuple[str, int | None]:
        """The record without its prefixes, and the rank they named (None if none)."""
        rank: int | None = None
        for _ in range(4):
            if not text or text[0] not in _STARTS:
                break
            m = TAGGED.match(text)
            if m is not None:
                found = m.group("r1") or m.group("r2") or m.group("r3") or m.group("r4")
                if found is not None:
                    rank = int(found)
                text = text[m.end() :]
                continue
            if self.numbers != "none":
                n = _NUMBERED.match(text)
                if n is not None:
                    if self.numbers == "rank":
                        rank = int(n.group(1))
                    text = text[n.end() :]
                    continue
            break
        if rank is None and ("[RANK " in text or "[rank: " in text):
            e = EMBEDDED.search(text, 0, EMBEDDED_CHARS)
            if e is not None:
                rank = int(e.group("a") or e.group("b"))
                text = text[: e.start()] + text[e.end() :]
        return text, rank


def decide_rule(head_lines: list[str]) -> PrefixRule:
    """Pick how bare leading numbers are read, from the first lines of a file."""
    bracketed = any(_BRACKETED.search(line) is not None for line in head_lines)
    rule = _numbers_rule(head_lines)
    return PrefixRule(rule.numbers, bracketed) if bracketed else rule


_BRACKETED = re.compile(r"\[[A-Za-z_\-]{0,32}+\d{1,9}+\]:")
"""A bracketed rank prefix, wherever it is in a head line (a carriage return may start
the record it prefixes)."""


def _numbers_rule(head_lines: list[str]) -> PrefixRule:
    numbers: list[int] = []
    nonempty = 0
    for line in head_lines:
        if not line.strip():
            continue
        nonempty += 1
        m = _NUMBERED.match(line)
        if m is not None:
            numbers.append(int(m.group(1)))
    if nonempty < 3 or len(numbers) < 0.6 * nonempty:
        return PrefixRule()
    rising = sum(1 for a, b in pairwise(numbers) if b > a)
    if rising >= 0.8 * (len(numbers) - 1):
        return PrefixRule("line")
    if len(set(numbers)) <= max(1, len(numbers) // 3):
        return PrefixRule("rank")
    return PrefixRule()
