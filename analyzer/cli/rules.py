"""``forensics rules`` and ``forensics explain``: the catalogue of root causes, in the
terminal."""

from __future__ import annotations

import sys

from analyzer.cli.exit import EXIT_OK
from analyzer.errors import UsageError


def rules_command() -> int:
    """One line per rule: code, name, role, title."""
    from analyzer.rules import RULES

    width = max(len(r.name) for r in RULES)
    for r in RULES:
        print(f"{r.code}  {r.name.ljust(width)}  {r.role:<8} {r.title}")
    print(f"\n{len(RULES)} rules; 'forensics explain CODE' prints one rule's documentation.")
    return EXIT_OK


def explain_command(code: str) -> int:
    """One rule's documentation, by code (NF101) or name."""
    from analyzer.rules import explain

    text = explain(code)
    if text is None:
        raise UsageError(f"no rule {code!r}; 'forensics rules' lists them")
    sys.stdout.write(text)
    return EXIT_OK
