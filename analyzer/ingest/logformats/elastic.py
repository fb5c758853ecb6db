"""The failure report of torch.distributed's elastic agent (``torchrun``).

When a worker dies, the agent raises ``ChildFailedError``, whose message
(``torch.distributed.elastic.multiprocessing.errors``) is a table of the failures::

    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
      <NO_OTHER_FAILURES>
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      time      : 2024-05-01_10:00:00
      host      : node1
      rank      : 1 (local_rank: 1)
      exitcode  : 1 (pid: 1234)
      error_file: /tmp/torchelastic_x/.../attempt_0/1/error.json
      traceback : Traceback (most recent call last):
        File "train.py", line 17, in main
          loss.backward()
      RuntimeError: Function 'LogBackward0' returned nan values in its 0th output.
    ============================================================

The traceback is the worker's own, from the error file ``@record`` wrote
(``To enable traceback see: ...`` without it, ``Signal 9 (SIGKILL) received by PID
...`` for a signal). Each failure becomes an ``error`` event at its exception line (the
last ``SomethingError: message`` of its traceback, else the traceback field), with the
global ``rank``, ``local_rank``, ``exitcode``, ``error_file`` and ``root_cause`` (True
for the first observed failure, which the agent picks by the time each failure was
recorded: a rank stopped by the fault of another may come first). A failure whose message
reports a non-finite value (autograd's anomaly error, ``clip_grad_norm_``'s, a script's
``loss is nan at step 5``) is also a ``nonfinite`` event of that rank, as the worker's
own lines may not be in the log (``--local-ranks-filter``, or redirected to files). The
lines of the report are this parser's, so the traceback in it is not read a second time
as the run's own.

:func:`error_file_report` reads the error file itself (``error.json`` in the agent's
``attempt_N/<local_rank>/`` folder): ``{"message": {"message": "RuntimeError: ...",
"extraInfo": {"py_callstack": "...", "timestamp": "..."}}}``; :func:`read_error_file` makes
it events, for a run whose console was not kept. Policy: a file named ``error.json``
elsewhere is not read (:func:`error_file_rank`); one above ``ERROR_FILE_CAP`` bytes is
refused (``too_large``); one of another shape is reported (``bad_json``) and not read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from analyzer.ingest.logformats.anomaly import error_type, nonfinite_report
from analyzer.ingest.logformats.context import Context

_FIELDS = {"time      : ": "time", "rank      : ": "rank", "exitcode  : ": "exitcode",
           "error_file: ": "error_file", "traceback : ": "traceback", "host      : ": "host"}
_RANK = re.compile(r"(\d{1,9}+) \(local_rank: (\d{1,9}+)\)")
_EXIT = re.compile(r"(-?+\d{1,9}+)")
ROOT = "Root Cause (first observed failure):"
_NO_ERROR_FILE = "<N/A>"


@dataclass
class _Failure:
    root: bool
    fields: dict[str, str] = field(default_factory=dict)
    error: tuple[int, str] | None = None
    """The line and text of the last exception line of its traceback."""
    line: int = 0


class ElasticParser:
    framework = "torchelastic"
    repeats = False
    triggers: tuple[str, ...] = (
        "Failures:", ROOT, *_FIELDS, "=====", "-----", "Error", "Exception", 'File "',
    )

    def __init__(self) -> None:
        self.section: str | None = None
        self.failure: _Failure | None = None

    def parse(self, text: str, ctx: Context) -> bool:
        body = text.strip()
        if body == "Failures:" or body == ROOT:
            self._flush(ctx)
            self.section = "root" if body == ROOT else "failures"
            return True
        if self.section is None:
            return False
        if body.startswith(("=====", "-----")) and body.strip("=-") == "":
            self._flush(ctx)
            if body[0] == "=":
                self.section = None
            return True
        for key, name in _FIELDS.items():
            if body.startswith(key):
                if name == "time":
                    self._flush(ctx)
                    self.failure = _Failure(root=self.section == "root", line=ctx.line)
                if self.failure is not None:
                    value = body[len(key) :].strip()
                    self.failure.fields[name] = value
                    if name == "traceback":
                        self.failure.line = ctx.line
                        if error_type(value) is not None:
                            self.failure.error = (ctx.line, value)
                return True
        if self.failure is not None and error_type(body) is not None:
            self.failure.error = (ctx.line, body)
        return self.failure is not None or body == "<NO_OTHER_FAILURES>"

    def _flush(self, ctx: Context) -> None:
        failure, self.failure = self.failure, None
        if failure is None or not failure.fields:
            return
        detail = failure_detail(failure.fields)
        detail["root_cause"] = failure.root
        line, message = failure.error or (failure.line, failure.fields.get("traceback", ""))
        kind = error_type(message)
        if kind is not None:
            detail["type"] = kind
        here = ctx.line
        ctx.line = line  # the event is where its message is, not where the table ends
        ctx.event("error", None, message, detail)
        report = nonfinite_report(message)
        if report is not None:
            tag, nf_kind, extra, step = report
            if "rank" in detail:
                extra = {**extra, "rank": detail["rank"]}
            ctx.nonfinite(tag, nf_kind, step, message, global_step=step is not None, **extra,
                          reported_by="torchelastic")
        ctx.line = here
        ctx.votes["torchelastic"] += 1


def failure_detail(fields: dict[str, str]) -> dict[str, Any]:
    """The numbers of a failure entry: global and local rank, exit code, error file."""
    detail: dict[str, Any] = {}
    m = _RANK.match(fields.get("rank", ""))
    if m is not None:
        detail["rank"], detail["local_rank"] = int(m.group(1)), int(m.group(2))
    e = _EXIT.match(fields.get("exitcode", ""))
    if e is not None:
        detail["exitcode"] = int(e.group(1))
    where = fields.get("error_file")
    if where and where != _NO_ERROR_FILE:
        detail["error_file"] = where
    if "time" in fields:
        detail["failure_time"] = fields["time"]
    return detail


ERROR_FILE = "error.json"
ERROR_FILE_CAP = 1 << 24
"""An error file larger than this is not an error file the agent wrote."""


@dataclass(frozen=True)
class ErrorFileReport:
    """What a worker's ``error.json`` says: its exception line, the traceback, when."""

    message: str
    type: str | None
    traceback: str | None
    timestamp: int | None


def error_file_report(data: bytes) -> ErrorFileReport | None:
    """The report of an error file's bytes, or None when they are not one (not JSON,
    another shape). Never raises for content."""
    if len(data) > ERROR_FILE_CAP:
        return None
    try:
        doc = json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    outer = doc.get("message") if isinstance(doc, dict) else None
    if isinstance(outer, str):  # a message without a traceback
        return ErrorFileReport(outer[:10_000], error_type(outer), None, None)
    if not isinstance(outer, dict) or not isinstance(outer.get("message"), str):
        return None
    message: str = outer["message"]
    extra = outer.get("extraInfo")
    extra = extra if isinstance(extra, dict) else {}
    stack = extra.get("py_callstack")
    stamp = extra.get("timestamp")
    timestamp = int(stamp) if isinstance(stamp, str) and stamp.isdecimal() and len(
        stamp) <= 15 else None
    return ErrorFileReport(message[:10_000], error_type(message),
                           stack[:100_000] if isinstance(stack, str) else None, timestamp)


_ATTEMPT = re.compile(r"attempt_\d{1,9}+")


def error_file_rank(path: str) -> int | None:
    """The local rank of a worker's error file where ``path`` is where the elastic agent
    puts one (``.../attempt_N/<local_rank>/error.json``), else None: another file named
    ``error.json`` is not taken for one."""
    parts = path.replace("\\", "/").split("/")
    if len(parts) < 3 or parts[-1].lower() != ERROR_FILE:
        return None
    rank, attempt = parts[-2], parts[-3]
    if not (rank.isdecimal() and len(rank) <= 9 and _ATTEMPT.fullmatch(attempt)):
        return None
    return int(rank)


def read_error_file(data: bytes, local_rank: int | None, ctx: Context) -> None:
    """A worker's error file as events: an ``error`` at its message (``type``,
    ``local_rank``, ``timestamp``; the agent names its folders by local rank, which is
    the global rank only on one node, so no ``rank`` is claimed), and a ``nonfinite``
    one where the message reports a NaN or Inf. Not an error file's shape: ``bad_json``."""
    report = error_file_report(data)
    if report is None:
        ctx.issue("bad_json", "not an elastic agent error file (no message): not read", 1)
        return
    ctx.line = 1
    detail: dict[str, Any] = {"local_rank": local_rank} if local_rank is not None else {}
    if report.type is not None:
        detail["type"] = report.type
    if report.timestamp is not None:
        detail["timestamp"] = report.timestamp
    ctx.event("error", None, report.message, detail)
    found = nonfinite_report(report.message)
    if found is not None:
        tag, kind, extra, step = found
        ctx.nonfinite(tag, kind, step, report.message, global_step=step is not None,
                      **extra, **detail, reported_by="error_file")
    ctx.votes["torchelastic"] += 1
