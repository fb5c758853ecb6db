"""The fuzz targets' budget: fixed and repeatable in ``make test``, long in ``make fuzz``.

``FORENSICS_FUZZ`` picks the profile: unset (or ``ci``) runs a fixed number of examples per
target, derandomized, so that ``make test`` runs the same inputs every time; ``long`` (what
``make fuzz`` sets) runs ``FORENSICS_FUZZ_EXAMPLES`` examples (default 20,000) per target
from a random seed, keeping failures in Hypothesis' example database for the next run.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

LONG = os.environ.get("FORENSICS_FUZZ", "ci") == "long"


def fuzz_settings(ci_examples: int = 100) -> Any:
    """Settings for one fuzz target; ``ci_examples`` is its share of ``make test``."""
    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large,
             HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much]
    if LONG:
        examples = int(os.environ.get("FORENSICS_FUZZ_EXAMPLES", "20000"))
        return settings(max_examples=examples, deadline=None, suppress_health_check=quiet)
    return settings(max_examples=ci_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=quiet, print_blob=True)
