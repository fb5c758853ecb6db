"""A one-line progress bar on a terminal, for ``forensics analyze``."""

from __future__ import annotations

import time
from typing import TextIO


class ProgressBar:
    """Shown only for analyses longer than a moment, fed with (runs done, runs in all) as
    runs finish; ``note`` says which slow step runs now."""

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
        self.stream.write(f"\ranalysing [{'#' * filled}{'.' * (width - filled)}] "
                          f"{done:,}/{total:,} runs")
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
