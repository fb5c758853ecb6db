"""The dtypes a replay can run in, by name, without importing torch (the CLI lists them
from :mod:`analyzer.dtypes`, which this re-exports)."""

from __future__ import annotations

from analyzer.dtypes import DTYPE_CHOICES

__all__ = ["DTYPE_CHOICES"]
