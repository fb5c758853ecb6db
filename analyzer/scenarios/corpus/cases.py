"""What a corpus case is, and the split of the corpus into its two halves.

A case is a :class:`~analyzer.scenarios.harness.Scenario` (model, loss, data, optimizer,
precision: the training) plus what the evaluation needs: the model family, the intended
cause (a rule's name, or ``healthy``), what the run logs to its event file, whether it
writes ``env.json``, the name of its text log, an optional learning-rate schedule, and
the batch it was written in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from analyzer.capture import Factory
from analyzer.scenarios.harness import BatchSource, Scenario, StepHook

FAMILIES = ("mlp", "cnn", "recurrent", "attention", "generative", "metric")
HEALTHY = "healthy"
HALVES = ("tune", "heldout")
BATCHES = ("first", "fresh")
"""``first``: the cases the post-hoc rules were tuned on (half of them). ``fresh``: cases
written after that tuning, without looking at how the rules read them; all held out."""

Schedule = Callable[[torch.optim.Optimizer], StepHook]


@dataclass(frozen=True)
class Case:
    scenario: Scenario
    family: str
    intended: str
    """The rule name the top finding should have (``healthy``: no failure finding)."""
    logged: str = "full"
    """A profile of :data:`analyzer.scenarios.corpus.run.PROFILES`."""
    env: bool = True
    log_name: str = "train.log"
    schedule: Schedule | None = None
    batch: str = "first"

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def group(self) -> str:
        """What the split balances: healthy controls apart, failures by family (a fresh
        case's group is prefixed with its batch: it takes no part in the alternation)."""
        group = HEALTHY if self.intended == HEALTHY else self.family
        return group if self.batch == "first" else f"{self.batch}:{group}"


def make(name: str, family: str, intended: str, *, title: str, model: Factory, loss: Factory,
         batches: BatchSource, optimizer: str, lr: float, steps: int, log_style: str,
         fix: str = "", optimizer_kwargs: dict[str, Any] | None = None,
         logged: str = "full", env: bool = True, log_name: str = "train.log",
         schedule: Schedule | None = None, batch: str = "first", **scenario: Any) -> Case:
    """A case with the Scenario's defaults where the corpus does not care."""
    healthy = intended == HEALTHY
    sc = Scenario(name=name, title=title, story=title, fix=fix or "-", model=model, loss=loss,
                  batches=batches, optimizer=optimizer,
                  optimizer_kwargs={"lr": lr, **(optimizer_kwargs or {})}, steps=steps,
                  steps_per_epoch=scenario.pop("steps_per_epoch", 32), log_style=log_style,
                  healthy=healthy, **scenario)
    return Case(sc, family, intended, logged, env, log_name, schedule, batch)


def _rank(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def split(cases: Iterable[Case]) -> dict[str, str]:
    """Each case's half, ``tune`` or ``heldout``: within each group (a family's failures,
    or the healthy controls), cases sorted by the SHA-256 of their name alternate between
    the halves; the groups, sorted by name, take turns at which half gets a group's first
    case, so odd-sized groups do not all favour one half. Cases of a later batch than
    ``first`` are all ``heldout`` and take no part in the alternation, so adding them
    moves no earlier case."""
    groups: dict[str, list[str]] = {}
    halves: dict[str, str] = {}
    for c in cases:
        if c.batch == "first":
            groups.setdefault(c.group, []).append(c.name)
        else:
            halves[c.name] = "heldout"
    for g, group in enumerate(sorted(groups)):
        for i, name in enumerate(sorted(groups[group], key=_rank)):
            halves[name] = HALVES[(i + g) % 2]
    return halves
