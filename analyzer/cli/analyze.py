"""``forensics analyze``: read the runs below each path, report, and gate."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from analyzer.cli.exit import status
from analyzer.cli.output import write_json_file, write_stdout
from analyzer.cli.progress import ProgressBar
from analyzer.errors import UsageError


def analyze_command(
    paths: Sequence[str],
    *,
    json_file: str | None = None,
    quiet: bool = False,
    verify: bool = True,
    jobs: int = 1,
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
    JSON file, and return the exit status (:mod:`analyzer.cli.exit`)."""
    from analyzer.api import analyze
    from analyzer.report.json import to_json
    from analyzer.report.text import format_text

    if jobs < 1:
        raise UsageError("--jobs must be at least 1")
    progress = ProgressBar(sys.stderr) if sys.stderr.isatty() else None
    report = analyze(list(paths), verify=verify, jobs=jobs, progress=progress,
                     checkpoints=checkpoints, trust_pickle=trust_pickle, logs=list(logs),
                     replay=replay, device=device, import_paths=list(import_paths),
                     trust_code=trust_code, run_roots=list(run_roots),
                     status=progress.note if progress is not None else None)
    if progress is not None:
        progress.close()
    if json_file == "-":
        write_stdout(to_json(report) + "\n")
    else:
        text = format_text(report)
        if quiet:  # the summary table is the last block
            text = text[text.rfind("\n\n") + 2:] if "\n\n" in text else text
        write_stdout(text)
        if json_file:
            write_json_file(json_file, to_json(report))
    if not report.failed and not report.readable:
        print(f"forensics: nothing readable under {', '.join(paths)}: no value, event or "
              "checkpoint tensor could be read (see the read issues)", file=sys.stderr)
    return status(nonfinite=report.failed, unreadable=not report.readable)
