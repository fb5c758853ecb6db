"""The dtypes a replay can run in, by name: a leaf module that imports nothing, so that the
command line's parser lists them without importing the replayer's package (numpy, the
records)."""

from __future__ import annotations

DTYPE_CHOICES = ("as-run", "float64", "float32", "bfloat16", "float16")
"""Values of ``--dtype``: ``as-run`` keeps the captured step's own dtype."""
