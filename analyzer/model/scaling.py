"""How a run's loss-scale series was read: which steps its scaler skipped, and whether the
scale was logged before or after ``scaler.update()`` (found by :mod:`analyzer.scaler`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ScaleConvention = Literal["before_update", "after_update"]


@dataclass(frozen=True)
class ScaleReading:
    """The skipped steps and how the loss-scale series was read to find them."""

    skips: frozenset[int]
    convention: ScaleConvention | None
    """None when the run logged no loss-scale series of two points or more."""
    inferred: bool = False
    """True when non-finite gradients decided the convention; False when it was assumed."""
    drops: int = 0
    """Scale drops seen, over every loss-scale series."""
    agree: int = 0
    """Drops whose skipped step, as the chosen reading places it, has non-finite gradients."""
    against_before: int = 0
    """Steps whose gradients contradict the before-update reading."""
    against_after: int = 0
    """Steps whose gradients contradict the after-update reading."""
    guarded: frozenset[int] = frozenset()
    """Steps whose update a guarded step refused (its ``guard/skipped_steps`` count grew)
    and which the run went on from: their loss and gradients are not incidents."""

    @property
    def statement(self) -> str | None:
        """How the series was read, in words a report can show; None without a series."""
        if self.convention is None:
            return None
        if self.convention == "after_update":
            rule = "loss scale logged after scaler.update(): a drop at step N marks step N " \
                   "as skipped"
        else:
            rule = "loss scale logged before scaler.update(): a drop at step N+1 marks step " \
                   "N as skipped"
        mine, other = ((self.against_after, self.against_before)
                       if self.convention == "after_update"
                       else (self.against_before, self.against_after))
        counts = (f"{self.agree} of {self.drops} drops mark a step with non-finite gradients; "
                  f"the gradients contradict this reading at {mine} steps, the other at "
                  f"{other}")
        if self.inferred:
            return f"{rule} ({counts})"
        if not (self.against_before or self.against_after or self.agree):
            return (f"{rule} (assumed: no gradient norm logged at consecutive steps to "
                    "decide from)")
        return f"{rule} (assumed: the gradients do not decide; {counts})"
