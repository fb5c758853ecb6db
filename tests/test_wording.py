"""A step and the failing place in words: one wording for the report, the replay text and the
dashboard."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from analyzer.model import (
    BackwardReport,
    ForwardReport,
    OpFault,
    ReplayResult,
    Report,
    Run,
    RunResult,
    Series,
    UpdateReport,
    Verdict,
)
from analyzer.onset import locate
from analyzer.report.replay import brief_replay, format_replay
from analyzer.report.text import format_text
from analyzer.wording import Place, failing_place, place_words, replay_place, step_words
from app.rows import run_row


@pytest.mark.parametrize(("step", "after", "form", "words"), [
    (12, False, "noun", "step 12"), (12, True, "noun", "after step 12"),
    (None, False, "noun", "no step"),
    (12, False, "at", "at step 12"), (12, True, "at", "after step 12"),
    (None, False, "at", "with no step"),
    (12, False, "cell", "12"), (12, True, "cell", ">12"), (None, False, "cell", "?"),
])
def test_step_words(step: int | None, after: bool, form: str, words: str) -> None:
    assert step_words(step, after, form) == words  # type: ignore[arg-type]


def test_step_words_marks_the_step_for_markdown() -> None:
    assert step_words(12, False, "at", mark="**") == "at **step 12**"
    assert step_words(12, True, "at", mark="**") == "after **step 12**"
    assert step_words(None, False, "at", mark="**") == "with **no step**"


def _replay(module: str | None, phase: str | None = "forward") -> ReplayResult:
    """A replay whose forward pass went non-finite in one op of ``module``."""
    op = OpFault(phase="forward", op="div.Tensor", ordinal=3, inputs=(), outputs=(),
                 inputs_finite=True, module=module)
    return ReplayResult(
        source="capture/step_3", step=3, device="cpu", dtype="float32", autocast=None,
        phase=phase, forward=ForwardReport(frames=2, producer=None, window=(),  # type: ignore[arg-type]
                                           first_nonfinite=None, loss=None),
        forward_op=op if phase else None,
        backward=BackwardReport(ran=False, origin=None, first_param=None, bad_params=()),
        update=UpdateReport(ran=False, op=None, params=()), passes=(),
        verdict=Verdict("math-fault", "", "", ""))


def _result(replay: ReplayResult | None) -> RunResult:
    def series(tag: str) -> Series:
        return Series(tag=tag, steps=np.arange(4, dtype=np.int64),
                      values=np.array([1.0, 1.0, 1.0, math.nan]), wall_times=np.zeros(4),
                      source="events", positions=np.arange(4, dtype=np.int64) * 40)

    run = Run(path="r", name="r", files=("events",),
              series=(series("train/loss"), series("grad_norm/fc1.weight")))
    return dataclasses.replace(locate(run), replay=replay)


def _summary_layer(result: RunResult) -> str:
    table = format_text(Report(results=(result,))).splitlines()
    head = next(i for i, line in enumerate(table) if line.startswith("run "))
    start = table[head].index("layer")
    return table[head + 1][start:].split("  ")[0]


@pytest.mark.parametrize(("module", "cell", "prose"), [
    ("fc3", "fc3", "layer fc3"),
    ("(loss)", "(loss function)", "in the loss function"),
    ("(loss).inner", "(loss function)", "in the loss function"),
])
def test_the_failing_place_is_worded_alike_everywhere(module: str, cell: str, prose: str) -> None:
    result = _result(_replay(module))
    place = failing_place(result)
    assert place is not None and place == replay_place(_replay(module))
    assert (place_words(place, "cell"), place_words(place)) == (cell, prose)
    assert _summary_layer(result) == cell
    assert run_row("r", result, None).layer == cell
    assert f"forward, {prose}, aten.div.Tensor" in brief_replay(result.replay)  # type: ignore[arg-type]
    assert f"first non-finite value: forward, {prose}\n" in format_replay(result.replay)  # type: ignore[arg-type]


def test_without_a_replay_the_place_is_the_post_hoc_reading() -> None:
    """The loss and the only logged layer went NaN at one step: the forward pass or the loss,
    which the logged values cannot tell apart (no longer the first logged layer)."""
    tie = Place(tied=("loss function", "fc1"))
    assert failing_place(_result(None)) == tie
    assert _summary_layer(_result(None)) == "undetermined (loss function, fc1)"
    assert failing_place(_result(_replay(None, phase=None))) == tie


def test_a_place_the_replay_cannot_name_is_said_so() -> None:
    replay = _replay(None)
    assert replay_place(replay) == Place()
    assert (place_words(Place(), "cell"), place_words(Place())) == ("?", "layer unknown")
    assert "first non-finite value: forward, layer unknown\n" in format_replay(replay)


def test_regression_a_replay_that_names_no_layer_does_not_blame_the_loss_function() -> None:
    """The summary table said ``(loss fn)`` whenever the replay found the phase but no layer,
    though nothing said the loss function made the value; the dashboard showed the first
    logged layer for the same run. Both now show what the logged values say (here a tie)."""
    result = _result(_replay(None))
    assert _summary_layer(result) == "undetermined (loss function, fc1)"
    assert run_row("r", result, None).layer == "undetermined (loss function, fc1)"


def test_model_records_hold_no_wording() -> None:
    import analyzer.model as model

    assert not hasattr(model, "step_words")


def _app_strings() -> list[tuple[str, int, str]]:
    """(file, line, text) of every string literal of the dashboard's code."""
    import io
    import tokenize
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = []
    for path in sorted((root / "app").rglob("*.py")):
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text("utf-8")).readline)
        out += [(path.relative_to(root).as_posix(), t.start[0], t.string) for t in tokens
                if t.type == tokenize.STRING]
    return out


def test_regression_the_dashboard_counts_with_plural_not_an_s_in_brackets() -> None:
    """'3 run(s)', '1 folder(s) passed over', '139 key(s) not tested': a count says its
    noun as English does (tables.plural: '1 run', '2 runs')."""
    import re

    def words(literal: str) -> str:  # an f-string's text, less the code in its braces
        while (bare := re.sub(r"\{[^{}]*\}", "", literal)) != literal:
            literal = bare
        return literal

    found = [f"{f}:{n}: {s}" for f, n, s in _app_strings()
             if re.search(r"[a-z]\(s\)", words(s))]
    assert not found, found
