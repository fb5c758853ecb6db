"""``forensics analyze``: analyse the runs below each path, report, and gate.

Runs are analysed one task per run: in this process for a single run (or ``-j 1``), on a
local process pool sized to the machine by default, or on a Dask cluster with
``--scheduler`` (see :mod:`analyzer.fleet`); the report is the same whichever runs them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial
from itertools import chain
from typing import TYPE_CHECKING

from analyzer.cli.exit import status
from analyzer.cli.output import write_json_file, write_stdout
from analyzer.cli.progress import ProgressBar
from analyzer.errors import UsageError

if TYPE_CHECKING:
    from analyzer.model import Report
    from analyzer.model.fleet import SweepSummary


def analyze_command(
    paths: Sequence[str],
    *,
    json_file: str | None = None,
    quiet: bool = False,
    verify: bool = True,
    jobs: int | None = None,
    scheduler: str | None = None,
    summary: bool = False,
    logs: Sequence[str] = (),
    replay: bool = True,
    device: str = "cpu",
    import_paths: Sequence[str] = (),
    trust_code: bool = False,
    checkpoints: bool = True,
    trust_pickle: bool = False,
    run_roots: Sequence[str] = (),
) -> int:
    """Analyse, print the text report (or the JSON one for ``json_file`` '-'), write the
    JSON file, and return the exit status (:mod:`analyzer.cli.exit`). ``jobs`` None: one
    process per CPU; ``summary``: the sweep summary after the report (or alone, ``quiet``)
    and in the JSON."""
    from analyzer.api import analyze
    from analyzer.report.json import json_chunks
    from analyzer.report.text import format_text

    if jobs is not None and jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if jobs is not None and scheduler is not None:
        raise UsageError("--jobs sizes the local pool; with --scheduler the cluster's workers "
                         "run the runs (local:N for N of them)")
    progress = ProgressBar(sys.stderr) if sys.stderr.isatty() else None
    try:
        report = analyze(list(paths), verify=verify, jobs=jobs, scheduler=scheduler,
                         progress=progress, checkpoints=checkpoints, trust_pickle=trust_pickle,
                         logs=list(logs), replay=replay, device=device,
                         import_paths=list(import_paths), trust_code=trust_code,
                         run_roots=list(run_roots), keep_series=False,
                         status=progress.note if progress is not None else None)
    finally:
        if progress is not None:
            progress.close()
    sweep, document = None, json_chunks
    if summary:
        from analyzer.fleet.summary import summarize
        from analyzer.report.summary import format_summary

        digest = summarize(report.results)
        sweep = format_summary(digest).rstrip("\n") + "\n"
        document = partial(_json_with_summary, digest=digest)
    if json_file == "-":
        write_stdout(chain(document(report), ["\n"]))
    else:
        text = format_text(report)
        if quiet:  # the summary table is the last block
            text = text[text.rfind("\n\n") + 2:] if "\n\n" in text else text
        if sweep is not None:
            text = sweep if quiet else f"{text}\n{sweep}"
        write_stdout(text)
        if json_file:
            write_json_file(json_file, document(report))
    if not report.failed and not report.readable:
        print(f"forensics: nothing readable under {', '.join(paths)}: no value, event or "
              "checkpoint tensor could be read (see the read issues)", file=sys.stderr)
    return status(nonfinite=report.failed, unreadable=not report.readable)


def _json_with_summary(report: Report, *, digest: SweepSummary) -> Iterator[str]:
    """The JSON report with the sweep summary under its top-level ``summary`` key."""
    from analyzer.report.json import json_chunks

    return json_chunks(replace(report, summary=digest))
