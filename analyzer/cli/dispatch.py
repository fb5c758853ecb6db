"""``main``: parse, run one command's body, and turn what went wrong into an exit status.

A :class:`~analyzer.errors.ForensicsError` is the user's to fix: its message, status 2.
Anything else is a bug of ours: one line, status 3, and the traceback with ``--debug``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from analyzer.cli.exit import EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK
from analyzer.cli.parser import build_parser
from analyzer.errors import ForensicsError


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
        return EXIT_INTERRUPTED
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
    """The command's body, imported only when it runs: the others' imports cost nothing."""
    if args.command == "analyze":
        from analyzer.cli.analyze import analyze_command

        return analyze_command(
            args.paths, json_file=args.json, quiet=args.quiet, verify=not args.no_verify,
            jobs=args.jobs, scheduler=args.scheduler, summary=args.summary, logs=args.log,
            replay=not args.no_replay, device=args.device,
            import_paths=args.import_path, trust_code=args.trust_code,
            checkpoints=not args.no_checkpoints, trust_pickle=args.trust_pickle,
            run_roots=args.run_root)
    if args.command == "replay":
        from analyzer.cli.replay import replay_command

        return replay_command(args.path, device=args.device, dtype=args.dtype,
                              json_file=args.json, import_paths=args.import_path,
                              trust_code=args.trust_code, run_roots=args.run_root,
                              checkpoint=args.checkpoint, batch=args.batch, data=args.data,
                              model=args.model, model_kwargs=args.model_kwargs,
                              loss=args.loss, step=args.step, passes=args.passes)
    if args.command == "inspect":
        from analyzer.cli.inspect import inspect_command

        return inspect_command(args.paths, trust_pickle=args.trust_pickle, as_json=args.json)
    if args.command == "app":
        from analyzer.dashboard import launch  # the app's body: it serves Streamlit in a child

        return launch(args.path, port=args.port, open_browser=args.open,
                      import_paths=args.import_path, run_roots=args.run_root)
    if args.command == "trust":
        from analyzer.cli.trust import trust_command

        return trust_command(args.folders, remove=args.remove)
    if args.command == "rules":
        from analyzer.cli.rules import rules_command

        return rules_command()
    if args.command == "explain":
        from analyzer.cli.rules import explain_command

        return explain_command(args.code)
    raise AssertionError(f"unknown command {args.command}")


def entry() -> None:
    """The console script: let ``forensics analyze ... | head`` end quietly."""
    try:
        sys.exit(main())
    except BrokenPipeError:
        os._exit(EXIT_OK)
