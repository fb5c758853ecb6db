"""Score the post-hoc analysis on dead runs that leave no capture (docs/evaluation.md).

    python bench/evaluate.py [--corpus DIR] [--json] [--out docs/evaluation.json]

Generates the evaluation corpus (``python -m analyzer.scenarios.corpus``) into a temporary
folder, or reads one already generated with ``--corpus``; copies the sample runs without
their ``capture/`` folders; analyses each set with ``analyzer.analyze`` (no replay) and
prints, per half (the sample runs are a third set, and the sample runs with their captures
replayed a fourth, for comparison): top-cause accuracy, false alarms on healthy runs, the
confusion matrix (intended cause against the top finding) and each rule's precision.
Thresholds may be tuned on ``tune``; ``heldout`` is only reported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

HEALTHY = "healthy"
NO_CAUSE = "no-cause"
"""The prediction for a run that failed and got no cause or symptom finding."""
SAMPLES = "samples"
CAPTURED = "samples_with_captures"
FRAMEWORKS = "frameworks"


UNDETERMINED = "undetermined"
"""The prediction's prefix when two causes tie at the top: never counted as right."""


@dataclass(frozen=True)
class Scored:
    run: str
    half: str
    intended: str
    predicted: str
    confidence: str = ""
    """The top finding's confidence (empty for healthy, no-cause and ties)."""
    batch: str = ""
    """The corpus batch a case belongs to (``first``, ``fresh``: docs/evaluation.md)."""


@dataclass(frozen=True)
class Ranked:
    """What scoring reads of one finding, in the report's order."""

    name: str
    role: str
    confidence: str = "medium"
    score: float = 0.0


def prediction(failed: bool, findings: Iterable[Ranked]) -> tuple[str, str]:
    """The top finding's rule name and confidence, from findings ranked best first:
    warnings are not failure findings; a run with none is healthy, or ``no-cause`` when
    the analysis found it failed. Two causes at the top with the same confidence and
    score are a tie the report calls undetermined: ``undetermined (a, b)``, which is
    never the intended cause."""
    from analyzer.model import top_tie

    tie = top_tie(list(findings))
    if not tie:
        return (NO_CAUSE if failed else HEALTHY), ""
    if len(tie) > 1:
        return f"{UNDETERMINED} ({', '.join(f.name for f in tie)})", ""
    return tie[0].name, tie[0].confidence


def in_tie(row: Scored) -> bool:
    """Whether a tie at the top names the intended cause among the causes it leaves."""
    if not row.predicted.startswith(UNDETERMINED):
        return False
    names = row.predicted[len(UNDETERMINED):].strip(" ()").split(", ")
    return row.intended in names


def calibration(rows: Iterable[Scored]) -> dict[str, dict[str, Any]]:
    """Per confidence level of the top finding, how often it named the intended cause (a
    finding on a healthy control is made and never right)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:  # a false alarm counts against its confidence too
        if not r.confidence:
            continue
        cell = out.setdefault(r.confidence, {"right": 0, "made": 0})
        cell["made"] += 1
        cell["right"] += r.predicted == r.intended
    for cell in out.values():
        cell["precision"] = cell["right"] / cell["made"]
    return {k: out[k] for k in ("high", "medium", "low") if k in out}


def score(rows: Iterable[Scored]) -> dict[str, Any]:
    """Accuracy, false alarms, confusion matrix and per-rule precision of some rows."""
    rows = list(rows)
    failing = [r for r in rows if r.intended != HEALTHY]
    healthy = [r for r in rows if r.intended == HEALTHY]
    right = sum(r.predicted == r.intended for r in failing)
    named = sum(r.predicted == r.intended or in_tie(r) for r in failing)
    alarms = [r.run for r in healthy if r.predicted != HEALTHY]
    confusion: dict[str, dict[str, int]] = {}
    for r in rows:
        cell = confusion.setdefault(r.intended, {})
        cell[r.predicted] = cell.get(r.predicted, 0) + 1
    made = Counter(r.predicted for r in rows if r.predicted not in (HEALTHY, NO_CAUSE)
                   and not r.predicted.startswith(UNDETERMINED))
    hits = Counter(r.predicted for r in rows if r.predicted == r.intended)
    precision = {name: {"right": hits[name], "made": n, "precision": hits[name] / n}
                 for name, n in sorted(made.items())}
    return {
        "runs": len(rows),
        "failing": len(failing),
        "top_cause_right": right,
        "top_cause_accuracy": right / len(failing) if failing else None,
        "right_cause_named": named,
        "healthy": len(healthy),
        "false_alarms": len(alarms),
        "false_alarm_runs": alarms,
        "confusion": {k: dict(sorted(v.items())) for k, v in sorted(confusion.items())},
        "precision": precision,
        "calibration": calibration(rows),
        "rows": [r.__dict__ for r in rows],
    }


def analyse(folder: str, truth: Mapping[str, tuple[str, str]], *, replay: bool = False,
            batches: Mapping[str, str] | None = None) -> list[Scored]:
    """``analyzer.analyze`` on ``folder`` (no replay unless asked); one row per run named
    in ``truth`` (run name -> (half, intended cause)), with its batch from ``batches``."""
    batches = batches or {}
    import analyzer

    report = analyzer.analyze(folder, replay=replay)
    rows = []
    for result in report.results:
        if result.run.name not in truth:
            continue
        half, intended = truth[result.run.name]
        found = [Ranked(f.name, f.role, f.confidence, f.score) for f in result.findings]
        predicted, confidence = prediction(result.failed, found)
        rows.append(Scored(result.run.name, half, intended, predicted, confidence,
                           batches.get(result.run.name, "")))
    missing = set(truth) - {r.run for r in rows}
    for name in sorted(missing):  # a run the analysis did not list is not silently dropped
        half, intended = truth[name]
        rows.append(Scored(name, half, intended, "not-analysed", "", batches.get(name, "")))
    return sorted(rows, key=lambda r: r.run)


def corpus_info(folder: str) -> dict[str, dict[str, Any]]:
    """Each corpus run's case.json."""
    from analyzer.scenarios.corpus.run import INFO_FILE

    out = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, INFO_FILE)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                out[name] = json.load(fh)
    return out


def corpus_truth(folder: str) -> dict[str, tuple[str, str]]:
    return {name: (info["split"], info["intended"]) for name, info in corpus_info(folder).items()}


SAMPLE_RUNS = os.path.join(ROOT, "sample_runs")


def samples_truth(folder: str, half: str) -> dict[str, tuple[str, str]]:
    """The sample runs' intended causes, from their scenario.json."""
    truth = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, "scenario.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                info = json.load(fh)
            cause = info["expected"]["cause"]
            truth[name] = (half, HEALTHY if info["healthy"] else cause)
    return truth


def frameworks_truth(folder: str) -> dict[str, tuple[str, str]]:
    """The real-framework runs' intended causes (tests/frameworks/corpus.py INTENDED)."""
    from tests.frameworks.corpus import INTENDED

    return {name: (FRAMEWORKS, cause) for name, cause in INTENDED.items()
            if os.path.isdir(os.path.join(folder, name))}


def make_frameworks(out: str) -> str:
    """Generate the real-framework runs (Lightning, the Hugging Face Trainer,
    tensorboardX, DDP over gloo: the dev extras) into ``out``."""
    from pathlib import Path

    from tests.frameworks.corpus import FAMILIES, generate

    for names in FAMILIES.values():
        generate(Path(out), names)
    return out


def evaluate(corpus: str | None = None, samples: bool = True, captures: bool = True,
             frameworks: str | None = None) -> dict[str, Any]:
    """Every set's scores: ``tune``, ``heldout``, ``samples`` (captures hidden: a copy
    without its capture/ folders), ``samples_with_captures`` (sample_runs/ itself,
    read in place, captures replayed) and, given a folder of them, ``frameworks`` (the
    runs of tests/frameworks/, written by the real frameworks; ``""`` generates them)."""
    halves = ["tune", "heldout"]
    with tempfile.TemporaryDirectory() as tmp:
        if frameworks is not None:
            folder = frameworks or make_frameworks(os.path.join(tmp, "frameworks"))
            rows_fw = analyse(folder, frameworks_truth(folder))
        if corpus is None:
            from analyzer.scenarios.corpus.__main__ import generate

            corpus = os.path.join(tmp, "corpus")
            generate(corpus)
        info = corpus_info(corpus)
        rows = analyse(corpus, corpus_truth(corpus),
                       batches={n: i.get("batch", "first") for n, i in info.items()})
        if samples:
            copy = os.path.join(tmp, "samples")
            shutil.copytree(SAMPLE_RUNS, copy, ignore=shutil.ignore_patterns("capture"))
            rows += analyse(copy, samples_truth(copy, SAMPLES))
            halves.append(SAMPLES)
        if samples and captures:
            rows += analyse(SAMPLE_RUNS, samples_truth(SAMPLE_RUNS, CAPTURED), replay=True)
            halves.append(CAPTURED)
        if frameworks is not None:
            rows += rows_fw
            halves.append(FRAMEWORKS)
    scores = {half: score(r for r in rows if r.half == half) for half in halves}
    held = [r for r in rows if r.half == "heldout"]
    for batch in sorted({r.batch for r in held if r.batch}):
        if len({r.batch for r in held}) > 1:  # the held-out half per batch, when it has two
            scores[f"heldout_{batch}"] = score(r for r in held if r.batch == batch)
    return scores


def render(scores: Mapping[str, Mapping[str, Any]]) -> str:
    out: list[str] = []
    for half, s in scores.items():
        acc = s["top_cause_accuracy"]
        out.append(f"== {half}: {s['runs']} runs")
        out.append(f"top cause right: {s['top_cause_right']}/{s['failing']}"
                   + (f" ({acc:.0%})" if acc is not None else ""))
        out.append(f"right cause named, alone or in a tie: {s['right_cause_named']}/"
                   f"{s['failing']}")
        out.append(f"false alarms on healthy: {s['false_alarms']}/{s['healthy']}"
                   + (f" ({', '.join(s['false_alarm_runs'])})" if s["false_alarm_runs"] else ""))
        out.append("confusion (intended -> top finding: count):")
        for intended, cells in s["confusion"].items():
            row = ", ".join(f"{k}: {v}" for k, v in cells.items())
            out.append(f"  {intended:28s} {row}")
        out.append("precision per rule (right/made):")
        for name, p in s["precision"].items():
            out.append(f"  {name:28s} {p['right']}/{p['made']} ({p['precision']:.0%})")
        if s.get("calibration"):
            out.append("top finding right, by its confidence: " + ", ".join(
                f"{level} {c['right']}/{c['made']}" for level, c in s["calibration"].items()))
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", help="a corpus already generated (default: generate one)")
    parser.add_argument("--no-samples", action="store_true", help="score the corpus only")
    parser.add_argument("--no-captures", action="store_true",
                        help="do not score the sample runs with their captures replayed")
    parser.add_argument("--frameworks", nargs="?", const="", metavar="DIR",
                        help="also score the real-framework runs of tests/frameworks/ "
                             "(generated unless DIR holds them; needs the dev extras)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--out", help="also write the scores as JSON to this file "
                                      "(make evaluate: docs/evaluation.json)")
    args = parser.parse_args(argv)
    scores = evaluate(args.corpus, samples=not args.no_samples, captures=not args.no_captures,
                      frameworks=args.frameworks)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(scores, fh, indent=1, sort_keys=True)
            fh.write("\n")
    if args.json:
        json.dump(scores, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
