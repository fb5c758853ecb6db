"""``forensics trust``: record, forget or list the folders whose code replays may import."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from analyzer import trust
from analyzer.cli.exit import EXIT_OK
from analyzer.errors import UsageError


def trust_command(folders: Sequence[str], *, remove: bool = False) -> int:
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
