"""The public API: pinned names, each the object it names, lazy imports, DataFrames."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import analyzer

# The public surface, written out: a change to it is a deliberate change to this list.
PUBLIC = [
    "SCHEMA_VERSION",
    "CaptureError",
    "CaptureMeta",
    "CheckpointHistory",
    "CheckpointScan",
    "CodeRefusal",
    "Event",
    "EventFile",
    "Evidence",
    "Finding",
    "FlightRecorder",
    "ForensicsError",
    "Histogram",
    "Incident",
    "IngestIssue",
    "Location",
    "LogSource",
    "ModelRebuildError",
    "ReadError",
    "ReplayError",
    "ReplayResult",
    "Report",
    "Run",
    "RunFiles",
    "RunResult",
    "Series",
    "SkippedRule",
    "UsageError",
    "analyze",
    "explain",
    "find_runs",
    "incidents",
    "iter_analyze",
    "iter_runs",
    "layer_from_tag",
    "load_capture",
    "locate",
    "read",
    "read_event_file",
    "replay",
    "replay_step",
    "scalars",
    "scan_checkpoint",
    "scan_run_checkpoints",
    "summary",
    "tool_version",
]
CONSTANTS = {"SCHEMA_VERSION"}
PACKAGE = Path(analyzer.__file__).parent

MLP = "analyzer.scenarios.models:mlp"
MLP_KW = {"in_features": 4, "hidden": 8, "out_features": 3, "depth": 2, "seed": 1}


def test_all_is_pinned() -> None:
    assert analyzer.__all__ == PUBLIC
    assert sorted(analyzer._EXPORTS) == sorted(PUBLIC)
    assert dir(analyzer) == sorted(PUBLIC)
    with pytest.raises(AttributeError, match="no attribute 'onset'"):
        analyzer.__getattr__("onset")


def test_regression_locate_is_the_function_after_read(summary_run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    summary_run({"train/loss": [1.0, 0.5, float("nan")]})
    runs = analyzer.read(str(tmp_path))
    result = analyzer.locate(runs[0])
    assert result.incident is not None and result.incident.step == 2


def test_regression_locate_is_the_function_after_analyze(summary_run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    summary_run({"train/loss": [1.0, float("inf")]})
    report = analyzer.analyze(str(tmp_path), replay=False)
    result = analyzer.locate(report.results[0].run)
    assert result.incident is not None and result.incident.kind == "+inf"


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run that really fails at step 3: its scalars, a checkpoint and a capture of the
    failing step, written by the real writers and the public FlightRecorder."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from analyzer.scenarios import losses, models

    run = tmp_path_factory.mktemp("api") / "run"
    torch.manual_seed(0)
    model = models.mlp(**MLP_KW)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = losses.log_of_softmax_nll()
    rec = analyzer.FlightRecorder(run, model, opt, model_factory=MLP, model_kwargs=MLP_KW,
                                  loss_factory="analyzer.scenarios.losses:log_of_softmax_nll",
                                  seed=0)
    writer = SummaryWriter(str(run))
    for step in range(6):
        x = torch.randn(16, 4) * (1e4 if step == 3 else 1.0)
        y = torch.randint(0, 3, (16,))
        with rec.step(step, x, y) as r:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            r.loss(loss)
            loss.backward()
            opt.step()
        writer.add_scalar("train/loss", loss.item(), step)
        if step == 2:
            torch.save(model.state_dict(), run / "checkpoint_2.pt")
        if rec.captured:
            break
    writer.close()
    assert rec.captured, rec.errors
    return run


def _defined(value: object) -> object:
    """What the module that defines ``value`` holds under its name."""
    return getattr(importlib.import_module(value.__module__), value.__qualname__)  # type: ignore[attr-defined]


def test_each_name_is_its_object_after_every_public_call(failed_run: Path) -> None:
    folder = str(failed_run)
    checkpoint = str(failed_run / "checkpoint_2.pt")
    (files,) = analyzer.find_runs([folder])
    assert isinstance(files, analyzer.RunFiles)
    events = analyzer.read_event_file(files.event_files[0])
    assert isinstance(events, analyzer.EventFile)
    (run,) = analyzer.read(folder)
    assert isinstance(run, analyzer.Run) and isinstance(run.series[0], analyzer.Series)
    assert isinstance(run.checkpoints, analyzer.CheckpointHistory)
    assert isinstance(run.capture_metas[0], analyzer.CaptureMeta)
    located = analyzer.locate(run)
    assert isinstance(located, analyzer.RunResult)
    assert isinstance(located.incident, analyzer.Incident) and located.incident.step == 3
    report = analyzer.analyze(folder)
    assert isinstance(report, analyzer.Report) and report.schema_version == analyzer.SCHEMA_VERSION
    (result,) = report.results
    assert isinstance(result.replay, analyzer.ReplayResult), result.replay_error
    top = result.findings[0]
    assert isinstance(top, analyzer.Finding) and isinstance(top.evidence[0], analyzer.Evidence)
    assert all(isinstance(s, analyzer.SkippedRule) for s in result.skipped_rules)
    assert not analyzer.scalars(folder).empty and not analyzer.incidents(report).empty
    scan = analyzer.scan_checkpoint(checkpoint)
    assert isinstance(scan, analyzer.CheckpointScan) and scan.issues == ()
    history = analyzer.scan_run_checkpoints([checkpoint])
    assert isinstance(history, analyzer.CheckpointHistory)
    capture = analyzer.load_capture(folder)
    assert capture.step == 3
    assert isinstance(analyzer.replay(folder), analyzer.ReplayResult)
    live = analyzer.replay_step(capture.model, capture.inputs, capture.targets, capture.loss_fn,
                                capture.optimizer, repeats=1)
    assert isinstance(live, analyzer.ReplayResult)
    assert "log" in (analyzer.explain(top.code) or "")
    assert analyzer.layer_from_tag("grad_norm/fc1.weight") == "fc1"
    assert analyzer.tool_version()
    with pytest.raises(analyzer.ForensicsError):
        analyzer.read(str(failed_run / "absent"))

    for name in PUBLIC:
        value = getattr(analyzer, name)
        assert not isinstance(value, ModuleType), f"analyzer.{name} is a module"
        home = getattr(importlib.import_module(analyzer._EXPORTS[name]), name)
        assert value is home, f"analyzer.{name} is not {analyzer._EXPORTS[name]}.{name}"
        if name in CONSTANTS:
            continue
        assert inspect.isfunction(value) or inspect.isclass(value), name
        assert value.__name__ == name and value.__module__.startswith("analyzer.")
        assert _defined(value) is value, f"analyzer.{name} is not where it is defined"


def test_import_is_cheap_star_import_too() -> None:
    code = ("import sys, analyzer; light = 'numpy' not in sys.modules; from analyzer import *; "
            "heavy = [m for m in ('torch', 'pandas', 'streamlit') if m in sys.modules]; "
            "print(light, heavy); sys.exit(0 if light and not heavy else 1)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _submodules(folder: Path) -> set[str]:
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    return modules | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """A module's statements, with those inside top-level ``if`` and ``try`` blocks."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If | ast.Try):
            inner = [*node.body, *node.orelse]
            if isinstance(node, ast.Try):
                inner += [*node.finalbody, *(s for h in node.handlers for s in h.body)]
            out += _top_level(inner)
    return out


def _values_bound(init: Path, package: str) -> set[str]:
    """The names a package's ``__init__.py`` binds to values (functions, classes, constants,
    names imported from modules), not to its submodules, and those its ``__all__`` lists."""
    names: set[str] = set()
    for node in _top_level(ast.parse(init.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound = {t.id for t in targets if isinstance(t, ast.Name)}
            names |= bound
            if "__all__" in bound:
                names |= set(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{source}" if source else base
            names |= {a.asname or a.name for a in node.names
                      if not _is_module(f"{source}.{a.name}")}
    return names


def test_no_submodule_is_named_like_what_its_package_exports() -> None:
    """Importing ``pkg.sub`` binds ``sub`` on ``pkg``: a function ``pkg.sub`` exported lazily
    (or bound before) would then be the module (``analyzer.locate`` was, once)."""
    shadowed = set(PUBLIC) & _submodules(PACKAGE)
    assert not shadowed, f"analyzer has submodules named like public names: {shadowed}"
    packages = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))
    assert len(packages) > 5
    for folder in packages:
        dotted = ".".join(folder.relative_to(PACKAGE.parent).parts)
        clash = _values_bound(folder / "__init__.py", dotted) & _submodules(folder)
        assert not clash, f"{dotted} binds {sorted(clash)}, the names of its submodules"


def test_dataframes(summary_run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    summary_run({"train/loss": [1.0, 0.5, float("nan")], "lr": [0.1, 0.1, 0.1]}, name="a")
    summary_run({"train/loss": [2.0, 1.0]}, name="b")
    frame = analyzer.scalars(str(tmp_path))
    assert list(frame.columns) == ["run", "tag", "step", "value", "wall_time", "source",
                                   "position"]
    assert len(frame) == 8
    loss_a = frame[(frame["run"] == "a") & (frame["tag"] == "train/loss")]
    assert loss_a["step"].tolist() == [0, 1, 2] and loss_a["value"].isna().tolist()[-1]
    report = analyzer.analyze(str(tmp_path), replay=False)
    incidents = analyzer.incidents(report)
    first = incidents[incidents["first"]]
    assert first[["run", "tag", "step", "kind"]].values.tolist() == [["a", "train/loss", 2,
                                                                      "nan"]]
