"""``python -m analyzer.cli``: the same as the ``forensics`` console script."""

from analyzer.cli.dispatch import entry

entry()
