"""The ``forensics`` command.

Exit status, the same for every command, so ``forensics analyze`` can gate a CI job:

    0   every value read is finite
    1   something non-finite was found
    2   a usage error, a path that cannot be read, or nothing readable at all
    3   an internal error: a one-line message; ``--debug`` prints the traceback

Start-up imports neither torch nor streamlit; commands that need them import them late.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from analyzer.errors import ForensicsError

EXIT_OK, EXIT_FOUND, EXIT_ERROR, EXIT_INTERNAL = 0, 1, 2, 3

_TRUST_CODE_HELP = ("import the capture's model and loss factories wherever they are found, "
                    "for this call only; only for runs whose code you trust")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forensics",
        description="Find when, where and why a PyTorch training run went NaN or Inf.",
        epilog="exit status: 0 every value read is finite, 1 something non-finite was found, "
               "2 a usage error or nothing readable, 3 an internal error (--debug prints "
               "the traceback)")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--debug", action="store_true",
                        help="on an internal error, print the traceback")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    analyze = sub.add_parser(
        "analyze", help="read the runs below each path and find their first non-finite values",
        description="Find every run (a folder with TensorBoard event files) below each PATH "
                    "and report the first step at which a logged value went NaN or Inf.")
    analyze.add_argument("paths", nargs="+", metavar="PATH")
    analyze.add_argument("--json", metavar="FILE",
                         help="also write the versioned JSON report to FILE ('-' for stdout, "
                              "which then replaces the text report)")
    analyze.add_argument("--no-verify", action="store_true",
                         help="skip the CRC checks of event-file records (faster, and damage "
                              "inside a record goes unnoticed)")
    analyze.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                         help="read event files in N processes (default 1)")
    analyze.add_argument("-q", "--quiet", action="store_true",
                         help="print only the summary table")
    analyze.add_argument("--log", action="append", default=[], metavar="FILE",
                         help="also read FILE as a text log (for logs whose names do not end "
                              "in .log/.txt/.out/.err); may be repeated")
    analyze.add_argument("--no-replay", action="store_true",
                         help="do not replay the runs' captured failing steps")
    analyze.add_argument("--device", default="cpu",
                         help="where to replay captured steps: cpu (default), cuda, cuda:N")
    analyze.add_argument("--import-path", action="append", default=[], metavar="DIR",
                         help="a folder whose code you trust, to import a capture's model and "
                              "loss factories from (see 'forensics trust')")
    analyze.add_argument("--trust-code", action="store_true", help=_TRUST_CODE_HELP)
    analyze.add_argument("--no-checkpoints", action="store_true",
                         help="do not scan the runs' checkpoints")
    analyze.add_argument("--trust-pickle", action="store_true",
                         help="let checkpoints that need code outside torch's weights_only "
                              "allow-list run it while loading; only for files you trust")

    inspect = sub.add_parser(
        "inspect", help="scan checkpoints for non-finite and runaway tensors",
        description="Scan checkpoint files (or the checkpoints in folders) safely, tensor by "
                    "tensor: NaN/Inf counts, abs-max and norms per tensor and layer, the "
                    "optimizer's state and the loss scale.",
        epilog="exit status: 0 every file read as a checkpoint and finite, 1 a non-finite "
               "tensor found, 2 a file that could not be read as a checkpoint at all (and "
               "none non-finite) or a usage error, 3 an internal error")
    inspect.add_argument("paths", nargs="+", metavar="CHECKPOINT")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of text")
    inspect.add_argument("--trust-pickle", action="store_true",
                         help="allow unpickling code; only for files you trust")
    _replay_parser(sub)
    app = sub.add_parser(
        "app", help="browse runs in the dashboard (Streamlit, on 127.0.0.1 only)",
        description="Serve the Streamlit dashboard on 127.0.0.1, headless, with usage "
                    "statistics off, on the runs below PATH.")
    app.add_argument("path", nargs="?", default="sample_runs", metavar="PATH")
    app.add_argument("--port", type=int, default=8501)
    app.add_argument("--open", action="store_true", help="open the dashboard in a web browser")
    app.add_argument("--import-path", action="append", default=[], metavar="DIR",
                     help="a folder whose code you trust, to replay captures from")
    _trust_parser(sub)
    sub.add_parser("rules", help="list the catalogue of root causes",
                   description="List every rule: its stable code, name and title.")
    explain = sub.add_parser("explain", help="print one rule's documentation",
                             description="Print what a rule detects, why it produces NaN/Inf, "
                                         "the evidence it uses, the fix and its false "
                                         "positives.")
    explain.add_argument("code", metavar="CODE", help="a rule code (NF101) or name")
    for command in sub.choices.values():  # also accepted after the command's name
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="on an internal error, print the traceback")
    return parser


def _replay_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from analyzer.replayer import DTYPE_CHOICES

    rp = sub.add_parser(
        "replay", help="re-run a captured failing step and name the layer, op and line",
        description="Replay the failing step saved by the flight recorder under "
                    "instrumentation: module hooks, an aten-op trace and anomaly mode name "
                    "the producer of the first non-finite value; float64 and repeated "
                    "replays tell a mathematical fault from overflow and non-determinism.")
    rp.add_argument("path", metavar="RUN_OR_CAPTURE")
    rp.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    rp.add_argument("--dtype", default="as-run", choices=DTYPE_CHOICES)
    rp.add_argument("--json", metavar="FILE", help="also write JSON to FILE ('-' for stdout)")
    rp.add_argument("--import-path", action="append", default=[], metavar="DIR",
                    help="a folder whose code you trust, to import the capture's model and "
                         "loss factories from (see 'forensics trust')")
    rp.add_argument("--trust-code", action="store_true", help=_TRUST_CODE_HELP)


def _trust_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    trust = sub.add_parser(
        "trust", help="trust a folder's code, so that replays may import factories from it",
        description="Replaying a capture imports and calls the model and loss factories its "
                    "meta.json names. They are imported only from folders you trust: those "
                    "given with --import-path, those recorded here (kept in your "
                    "configuration folder, never in an analysed one), and the tool's own. "
                    "With no argument, list the trusted folders.")
    trust.add_argument("folders", nargs="*", metavar="DIR")
    trust.add_argument("--remove", action="store_true",
                       help="forget the given folders instead of trusting them")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        from analyzer.api import tool_version

        print(f"forensics {tool_version()}")
        return EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_ERROR
    try:
        return _dispatch(args)
    except ForensicsError as exc:
        print(f"forensics: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("forensics: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise
    except Exception as exc:  # a bug of ours: one line, and the traceback on request
        if args.debug:
            import traceback

            traceback.print_exc()
        detail = str(exc).strip().splitlines()
        print(f"forensics: internal error: {type(exc).__name__}"
              f"{': ' + detail[0] if detail else ''}"
              + ("" if args.debug else " (run again with --debug for the traceback)"),
              file=sys.stderr)
        return EXIT_INTERNAL


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "analyze":
        return _analyze(args)
    if args.command == "replay":
        from analyzer.replayer.command import replay_command

        return replay_command(args.path, device=args.device, dtype=args.dtype,
                              json_file=args.json, import_paths=args.import_path,
                              trust_code=args.trust_code)
    if args.command == "app":
        from analyzer.dashboard import launch

        return launch(args.path, port=args.port, open_browser=args.open,
                      import_paths=args.import_path)
    if args.command == "trust":
        return _trust(args.folders, remove=args.remove)
    if args.command == "rules":
        return _rules()
    if args.command == "explain":
        return _explain(args.code)
    if args.command == "inspect":
        from analyzer.ingest.checkpoints import inspect_command

        return inspect_command(args.paths, trust_pickle=args.trust_pickle, as_json=args.json)
    raise AssertionError(f"unknown command {args.command}")


def _trust(folders: list[str], *, remove: bool) -> int:
    from analyzer import trust
    from analyzer.errors import UsageError

    if remove:
        if not folders:
            raise UsageError("--remove needs the folders to forget")
        for folder in folders:
            gone = trust.distrust_folder(folder)
            print(f"{'no longer trusted' if gone else 'was not trusted'}: {folder}")
        return EXIT_OK
    for folder in folders:
        print(f"trusted: {trust.trust_folder(folder)}")
    if not folders:
        held = trust.trusted_folders()
        for folder in held:
            print(folder)
        print(f"{len(held)} trusted folder{'' if len(held) == 1 else 's'} "
              f"(in {trust.config_path()})", file=sys.stderr)
    return EXIT_OK


def _analyze(args: argparse.Namespace) -> int:
    from analyzer.api import analyze
    from analyzer.errors import UsageError
    from analyzer.report import format_text, to_json

    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    progress = _ProgressBar(sys.stderr) if sys.stderr.isatty() else None
    report = analyze(args.paths, verify=not args.no_verify, jobs=args.jobs,
                     progress=progress, checkpoints=not args.no_checkpoints,
                     trust_pickle=args.trust_pickle, logs=args.log,
                     replay=not args.no_replay, device=args.device,
                     import_paths=args.import_path, trust_code=args.trust_code,
                     status=progress.note if progress is not None else None)
    if progress is not None:
        progress.close()
    if args.json == "-":
        _out(to_json(report) + "\n")
    else:
        text = format_text(report)
        if args.quiet:
            text = text[text.rfind("\n\n") + 2:] if "\n\n" in text else text
        _out(text)
        if args.json:
            _write_json(args.json, to_json(report))
    if report.failed:
        return EXIT_FOUND
    if not report.readable:
        print(f"forensics: nothing readable under {', '.join(args.paths)}: no value, event or "
              "checkpoint tensor could be read (see the read issues)", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _out(text: str) -> None:
    """Write the report; a reader that stopped early (``| head``) does not change the exit
    status the gate depends on: the rest goes nowhere."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _rules() -> int:
    from analyzer.rules import RULES

    width = max(len(r.name) for r in RULES)
    for r in RULES:
        print(f"{r.code}  {r.name.ljust(width)}  {r.role:<8} {r.title}")
    print(f"\n{len(RULES)} rules; 'forensics explain CODE' prints one rule's documentation.")
    return EXIT_OK


def _explain(code: str) -> int:
    from analyzer.errors import UsageError
    from analyzer.rules import explain

    text = explain(code)
    if text is None:
        raise UsageError(f"no rule {code!r}; 'forensics rules' lists them")
    sys.stdout.write(text)
    return EXIT_OK


def _write_json(path: str, text: str) -> None:
    from analyzer.errors import ReadError

    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    except OSError as exc:
        raise ReadError(path, f"cannot write the JSON report: {exc.strerror or exc}") from None


class _ProgressBar:
    """A one-line progress bar on a terminal, shown only for reads longer than a moment."""

    def __init__(self, stream: TextIO, delay: float = 0.5) -> None:
        self.stream = stream
        self.start = time.monotonic()
        self.delay = delay
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if time.monotonic() - self.start < self.delay or total <= 0:
            return
        width = 30
        filled = int(width * done / total)
        mb = 1 << 20
        self.stream.write(f"\rreading [{'#' * filled}{'.' * (width - filled)}] "
                          f"{done / mb:,.0f}/{total / mb:,.0f} MB")
        self.stream.flush()
        self.shown = True

    def note(self, message: str) -> None:
        """Say which slow step runs now, on the same line."""
        self.stream.write(f"\r{message[:70]:<70}")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 72 + "\r")
            self.stream.flush()


def entry() -> None:
    # Let `forensics analyze ... | head` end quietly.
    try:
        sys.exit(main())
    except BrokenPipeError:
        os._exit(EXIT_OK)


if __name__ == "__main__":
    entry()
