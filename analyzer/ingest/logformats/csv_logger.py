"""Lightning's ``CSVLogger``: ``<save_dir>/<name>/version_N/metrics.csv``.

``lightning.fabric.loggers.csv_logs._ExperimentWriter`` keeps one dict per
``log_metrics`` call (the metrics, plus ``step``) and writes them with ``csv.DictWriter``
under one header of every key seen, sorted; a new key rewrites the file under a new
header. A row holds only the metrics of its call, the other cells empty::

    epoch,step,train_loss,val_loss
    0,0,163.78012084960938,
    0,7,,9562777190400.0
    3,25,inf,

``step`` is the trainer's global step (``_batches_that_stepped``, what its TensorBoard
logger writes at too), so the series are on the global step; ``epoch`` is bookkeeping and
not a series. Values are Python's ``repr`` of floats: ``nan``, ``inf`` and ``-inf`` as
written. The writer buffers rows and flushes every ``flush_logs_every_n_steps`` (100),
so a run that died may have lost its last rows: what the file holds is read.

Policy, one rule each: a header without a ``step`` column is not a ``CSVLogger`` file
(``bad_record`` at line 1, nothing read); a row whose step is not an integer, or whose
cells are more than the header's, is skipped (``bad_record`` with its line); a cell that
is not a number is left out of its row (``bad_record``); invalid UTF-8 is replaced
(``bad_line``); reading stops at the time budget (``read_limit``), keeping the rows before.
A last row without its newline is read like any other.
"""

from __future__ import annotations

import csv
from typing import BinaryIO

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.safeio import Deadline

METRICS_FILE = "metrics.csv"
CHUNK = 1 << 22
_BOOKKEEPING = frozenset({"epoch", "step"})


def read_metrics_csv(stream: BinaryIO, size: int, ctx: Context, deadline: Deadline) -> None:
    """Read a ``CSVLogger`` ``metrics.csv`` into ``ctx``'s points (global steps)."""
    reader = _Rows(ctx)
    left = size
    pending = b""
    number = 0
    while left > 0:
        if deadline.expired():
            ctx.issue("read_limit", f"reading took over {deadline.seconds:g} s: stopped here; "
                      "the rows before are kept", number + 1)
            return
        chunk = stream.read(min(CHUNK, left))
        if not chunk:
            break
        left -= len(chunk)
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for raw in lines:
            number += 1
            if not reader.row(raw, number):
                return
    if pending:
        reader.row(pending, number + 1)


class _Rows:
    """The header, then each row as points."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.names: list[str] | None = None
        self.step_at = -1

    def row(self, raw: bytes, number: int) -> bool:
        """Read one line; False when the file is not one to read on."""
        ctx = self.ctx
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            ctx.issue("bad_line", "invalid UTF-8 in the line; replaced with U+FFFD", number)
            text = raw.decode("utf-8", errors="replace")
        text = text.rstrip("\r")
        if not text.strip():
            return True
        cells = next(csv.reader([text])) if '"' in text else text.split(",")
        ctx.line = number
        if self.names is None:
            return self._header(cells, number)
        if len(cells) > len(self.names):
            ctx.issue("bad_record", f"{len(cells)} cells under a header of "
                      f"{len(self.names)}: row skipped", number)
            return True
        step_text = cells[self.step_at].strip() if self.step_at < len(cells) else ""
        if not step_text.isdecimal() or len(step_text) > 18:
            ctx.issue("bad_record", f"step {step_text[:30]!r} is not a step: row skipped",
                      number)
            return True
        pairs = []
        for name, cell in zip(self.names, cells, strict=False):
            cell = cell.strip()
            if not cell or name in _BOOKKEEPING:
                continue
            try:
                pairs.append((name, float(cell)))
            except ValueError:
                ctx.issue("bad_record", f"{name} = {cell[:30]!r} is not a number: left out",
                          number)
        ctx.points_at(int(step_text), pairs)
        ctx.votes["lightning"] += 1
        return True

    def _header(self, cells: list[str], number: int) -> bool:
        names = [c.strip() for c in cells]
        if "step" not in names:
            self.ctx.issue("bad_record", "no step column in the header: not a CSVLogger "
                           "metrics file, not read", number)
            return False
        self.names = names
        self.step_at = names.index("step")
        return True
