"""The dtypes a replay can run in, by name, without importing torch (the CLI lists them)."""

from __future__ import annotations

DTYPE_CHOICES = ("as-run", "float64", "float32", "bfloat16", "float16")
"""Values of ``--dtype``: ``as-run`` keeps the captured step's own dtype."""
