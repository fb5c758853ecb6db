"""How whole a run's record is: failed, finite, damaged or unreadable (plain, no Streamlit).

``RunResult.status`` says whether a value went non-finite; it calls a run "finite" when
what could be read is finite, even when its event file was cut in half before the NaN.
:func:`health` adds the read issues: a run whose issues cost data (a truncated or corrupt
file, a log line that could not be read, a read stopped at its limit) is ``damaged``, and
:attr:`Health.ends_early` says where the readable record stops ("the event file ... is cut
at byte 998: its record ends at step 18; nothing after it was read"). A run none of whose
files could be read is ``unreadable``. A failed run stays ``failed`` (its failure is the
news) and keeps its ``ends_early`` words. The Runs table, the run pages' headline and the
Fleet page read it, so that none shows a damaged run as healthy.

Issues that cost no data: an empty file (nothing was written), a file refused by policy
before opening (a FIFO or device, a checkpoint that would need unpickling), a symlinked or
too deep folder not walked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from analyzer.ingest.tb import is_event_file
from analyzer.model import IngestIssue, RunResult
from app.runinfo import rel

HealthStatus = Literal["failed", "finite", "damaged", "unreadable"]
COSTLESS = frozenset({"empty_file", "not_regular", "unsafe_checkpoint", "not_followed",
                      "too_deep"})
"""Issue kinds that lose no data the file held (see the module's docstring)."""
_CUT = frozenset({"truncated", "zero_tail", "read_limit"})
"""Kinds after which nothing more of the file was read."""


@dataclass(frozen=True)
class Cut:
    """Where one file's readable record stops."""

    file: str
    where: str
    """``byte 998`` or ``line 41``."""
    last_step: int | None
    """The last step read from the file; None when none was."""
    kind: str

    def words(self, run_path: str) -> str:
        name = rel(self.file, run_path)
        what = "event file" if is_event_file(self.file) else "file"
        how = {"zero_tail": f"ends in zero bytes (never written) from {self.where}",
               "read_limit": f"was read only up to {self.where} (the read limit)"}.get(
                   self.kind, f"is cut at {self.where}")
        tail = ("no step was read from it" if self.last_step is None
                else f"its record ends at step {self.last_step}")
        return f"the {what} `{name}` {how}: {tail}; nothing after it was read"


@dataclass(frozen=True)
class Health:
    status: HealthStatus
    ends_early: str | None
    """Where the readable record stops and why, when read issues cut it short."""
    issues: list[IngestIssue] = field(default_factory=list)
    """Every read issue of the run (the run's and its metadata's), costly or not."""
    cuts: list[Cut] = field(default_factory=list)

    @property
    def costly(self) -> list[IngestIssue]:
        return [i for i in self.issues if i.kind not in COSTLESS]


def where_words(issue: IngestIssue) -> str:
    loc = issue.location
    if loc.line is not None:
        return f"line {loc.line}"
    return f"byte {loc.offset}" if loc.offset is not None else "the whole file"


def run_issues(result: RunResult) -> list[IngestIssue]:
    """The run's read issues and its metadata's, once each, in the order they were met."""
    meta = result.run.metadata
    seen: dict[IngestIssue, None] = dict.fromkeys(result.run.issues)
    seen.update(dict.fromkeys(meta.issues if meta is not None else ()))
    return list(seen)


def _last_steps(result: RunResult) -> dict[str, int]:
    """The last step read from each file that gave a series or a histogram."""
    last: dict[str, int] = {}
    run = result.run
    ends = [(s.source, s.steps) for s in run.series]
    ends += [(h.source, h.steps) for h in run.histograms]
    for source, steps in ends:
        if len(steps):
            last[source] = max(last.get(source, int(steps.max())), int(steps.max()))
    return last


def _cuts(result: RunResult, issues: list[IngestIssue]) -> list[Cut]:
    """Where each file whose reading stopped early stops: a record cut off at the end of
    the file, a zero tail, a read limit. Damage that reading went on past (a bad CRC, a
    record cut where another follows) costs data but ends no record: the issue box lists
    it."""
    last = _last_steps(result)
    cuts: dict[str, Cut] = {}
    for issue in issues:
        file = issue.location.file
        if issue.kind not in _CUT or "resumes" in issue.message or file in cuts:
            continue
        cuts[file] = Cut(file, where_words(issue), last.get(file), issue.kind)
    return list(cuts.values())


def health(result: RunResult | None, error: str | None = None) -> Health:
    """The run's health (see the module's docstring); ``error`` is why it could not be
    analysed at all, when ``result`` is None."""
    if result is None:
        return Health("unreadable", error or "the run could not be analysed")
    issues = run_issues(result)
    cuts = _cuts(result, issues)
    ends = "; ".join(c.words(result.run.path) for c in cuts) or None
    if result.status == "unreadable":
        first = issues[0] if issues else None
        said = (f"nothing could be read: `{rel(first.location.file, result.run.path)}` at "
                f"{where_words(first)}: {first.message}" if first is not None
                else "nothing could be read")
        return Health("unreadable", said, issues, cuts)
    if result.failed:
        return Health("failed", ends, issues, cuts)
    costly = any(i.kind not in COSTLESS for i in issues)
    return Health("damaged" if costly else "finite", ends, issues, cuts)


def step_ranges(steps: list[int] | tuple[int, ...]) -> str:
    """``0-8, 12, 20-21``: runs of consecutive steps joined (a few runs, then "...")."""
    runs: list[list[int]] = []
    for s in sorted(set(steps)):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    return ", ".join(parts[:6]) + (", ..." if len(parts) > 6 else "")


def last_step(result: RunResult) -> int | None:
    last = _last_steps(result)
    return max(last.values()) if last else None


def skip_words(result: RunResult) -> str | None:
    """The loss scaler's overflow skips in words, taken from ``result.overflow_skips``:
    the non-finite gradients the charts mark at those steps were skipped by the scaler
    (the analysis does not count them as the failure). None when there were none; for a
    failed run only the skips before its first non-finite value are spoken of."""
    skips = list(result.overflow_skips)
    inc = result.incident
    if inc is not None and inc.step is not None:
        skips = [s for s in skips if s < inc.step]
    if not skips:
        return None
    n = len(skips)
    noun = "skipped step" if n == 1 else "skipped steps"
    at = f"step {skips[0]}" if n == 1 else f"steps {step_ranges(skips)}"
    if inc is not None:
        verb = "was" if n == 1 else "were"
        return f"{n} earlier {noun} ({at}) {verb} the loss scaler's overflow skips, benign"
    end = last_step(result)
    went_on = (f"training went on to step {end}" if end is not None and end > max(skips)
               else "training went on")
    return (f"the non-finite values were the loss scaler's overflow skips, benign: {n} "
            f"{noun} ({at}), {went_on}")
