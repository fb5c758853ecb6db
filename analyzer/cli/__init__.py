"""The ``forensics`` command: the parser, one module per command's body, and the exit
status every command shares.

    exit        the exit status: 0 finite, 1 non-finite found, 2 usage or nothing readable,
                3 internal error (one line; ``--debug`` prints the traceback)
    parser      every command and option; building it imports neither torch nor streamlit
    dispatch    main(): parse, run one body, map errors to a status
    analyze     forensics analyze        inspect   forensics inspect
    replay      forensics replay         trust     forensics trust
    rules       forensics rules, forensics explain
    output      stdout that survives ``| head``, the --json file
    progress    the terminal progress bar of analyze

``forensics app`` is :func:`analyzer.dashboard.launch`. Bodies print what the presentation
modules (:mod:`analyzer.report`) render from the records that readers, the replayer and
the analysis return; readers never print and never choose an exit status.
"""

from __future__ import annotations

from analyzer.cli.dispatch import entry, main

__all__ = ["entry", "main"]
