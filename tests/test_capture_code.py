"""Where a capture's code lives, and replaying a model defined in the training script.

Real training scripts are written to tmp_path and run with ``python train.py`` (or
``python -m pkg.train``) in a fresh process with this test's configuration folder: they
record their code with :func:`code_record`, register it with :func:`register_trust` and
save the script as a capture would. The test then judges and loads the recorded factory
as a replay does (:func:`analyzer.trust.check` and :func:`resolve_plan`). Every training
block would leave a marker file: none may appear.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer import trust
from analyzer.capture.code import (
    SAVED_MAIN,
    code_record,
    recorded_main,
    recorded_modules,
    register_trust,
    top_level_code,
)
from analyzer.replayer.errors import ModelRebuildError
from analyzer.trust import Plan, RefusedCode, TrustPolicy, UntrustedCode, check, resolve_plan

RECORD = textwrap.dedent("""
    def record_capture():
        import json, os
        from analyzer.capture.code import code_record, register_trust, write_main_source
        record = code_record(["__main__:make_model", "__main__:Net", "torch.optim.Adam"])
        notes = register_trust(record) if os.environ.get("REGISTER") == "1" else []
        step = os.environ["STEP_FOLDER"]
        os.makedirs(step, exist_ok=True)
        write_main_source(step, record)
        with open(os.path.join(step, "meta.json"), "w") as fh:
            json.dump({"code": record, "notes": notes}, fh)
""")

GUARDED = textwrap.dedent("""
    import torch
    from torch import nn

    MARKER = {marker!r}

    class Net(nn.Module):
        def __init__(self, width=4):
            super().__init__()
            self.layer = nn.Linear(width, 2)

        def forward(self, x):
            return self.layer(x)

    def make_model(width=4):
        return Net(width)

    def train():
        open(MARKER, "w").close()
""") + RECORD + textwrap.dedent("""
    if __name__ == "__main__":
        record_capture()
        train()
""")

UNGUARDED = textwrap.dedent("""
    import os
    MARKER = {marker!r}

    class Net:
        def __init__(self, width=4):
            self.width = width

    def make_model(width=4):
        return Net(width)

    def train():
        open(MARKER, "w").close()
""") + RECORD + textwrap.dedent("""
    record_capture()
    train()
    for epoch in range(1):
        train()
    while not os.path.exists(MARKER + ".while"):
        open(MARKER + ".while", "w").close()
    with open(MARKER + ".with", "w"):
        pass
""")


@pytest.fixture(autouse=True)
def own_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "config"
    monkeypatch.setenv("FORENSICS_CONFIG_DIR", str(folder))
    return folder


def _train(tmp_path: Path, source: str, *, register: bool = True, home: Path | None = None,
           project: Path | None = None, module: str | None = None) -> tuple[Path, Path]:
    """Run a training script in a fresh process; (its capture's step folder, the script)."""
    project = project or tmp_path / "proj"
    script = project / (module.replace(".", "/") + ".py" if module else "train.py")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(source.replace("{marker!r}", repr(str(tmp_path / "marker"))))
    step = tmp_path / "run" / "capture" / "step_3"
    env = dict(os.environ, STEP_FOLDER=str(step), REGISTER="1" if register else "0")
    if home is not None:
        env["HOME"] = str(home)
    command = [sys.executable, "-m", module] if module else [sys.executable, str(script)]
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    os.remove(tmp_path / "marker")  # the training ran there; a replay must not run it again
    return step, script


def _code(step: Path) -> dict[str, Any]:
    return json.loads((step / "meta.json").read_text())["code"]  # type: ignore[no-any-return]


def _judge(step: Path, target: str = "__main__:make_model", *, code: Any = None,
           policy: TrustPolicy | None = None) -> Plan:
    return check(target, policy or TrustPolicy(), run_folder=str(step.parent.parent),
                 code=_code(step) if code is None else code, capture_folder=str(step))


def _build(plan: Plan, **kwargs: Any) -> Any:
    return resolve_plan(plan, TrustPolicy(), run_folder=None).obj(**kwargs)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_saved_script_of_a_registered_run_replays_and_its_training_block_does_not_run(
        tmp_path: Path, own_config: Path) -> None:
    step, script = _train(tmp_path, GUARDED)
    code = _code(step)
    assert code["main"] == {"file": str(script), "root": str(script.parent),
                            "sha256": _sha(script), "saved": SAVED_MAIN}
    assert (step / SAVED_MAIN).read_bytes() == script.read_bytes()
    config = json.loads((own_config / "trusted.json").read_text())
    assert config["version"] == 1 and config["trusted"] == [str(script.parent)]
    assert _sha(script) in config["sources"]
    script.write_text("raise SystemExit('edited after the capture')\n")  # not what runs
    plan = _judge(step)
    assert (plan.source, plan.file, plan.notes) == ("main", str(step / SAVED_MAIN), ())
    model = _build(plan, width=3)
    assert type(model).__name__ == "Net" and model.layer.in_features == 3
    assert type(model).__module__ != "__main__"
    net = resolve_plan(_judge(step, "__main__:Net"), TrustPolicy()).obj
    assert type(model) is net  # one module for every factory of the same script
    dotted = check("__main__.Net", TrustPolicy(), separator=".", code=code,
                   capture_folder=str(step))  # how an optimizer class is named
    assert resolve_plan(dotted, TrustPolicy()).obj is net
    assert not (tmp_path / "marker").exists()


def test_an_unguarded_script_runs_its_definitions_but_not_its_training(
        tmp_path: Path) -> None:
    step, _ = _train(tmp_path, UNGUARDED)
    for suffix in (".while", ".with"):
        os.remove(str(tmp_path / "marker") + suffix)
    assert _build(_judge(step), width=5).width == 5
    assert not list(tmp_path.glob("marker*"))


def test_a_changed_script_in_a_trusted_folder_replays_with_a_note(tmp_path: Path) -> None:
    step, script = _train(tmp_path, GUARDED, register=False)
    trust.trust_folder(str(script.parent))  # trusted by folder, the hash unknown here
    script.write_text(script.read_text().replace("nn.Linear(width, 2)", "nn.Linear(width, 7)"))
    plan = _judge(step)
    assert plan.file == str(script)
    recorded = _code(step)["main"]["sha256"]
    assert plan.notes == (f"train.py changed since the capture (sha256 {recorded[:12]} then, "
                          f"{_sha(script)[:12]} now); replayed with today's file",)
    assert _build(plan).layer.out_features == 7  # today's file
    assert not (tmp_path / "marker").exists()


def test_a_script_in_an_untrusted_folder_is_refused_unless_trust_code(
        tmp_path: Path) -> None:
    step, script = _train(tmp_path, GUARDED, register=False)
    with pytest.raises(UntrustedCode) as refused:
        _judge(step)
    assert refused.value.folder == str(script.parent)
    assert refused.value.command == f"forensics trust {script.parent}"
    assert "it would run `__main__:make_model`" in str(refused.value)
    plan = _judge(step, policy=TrustPolicy(trust_code=True))
    assert plan.file == str(step / SAVED_MAIN)
    assert _build(plan).layer.in_features == 4
    os.remove(script)  # gone: trusting the saved copy's folder is what fixes it
    with pytest.raises(UntrustedCode) as refused:
        _judge(step)
    assert refused.value.folder == str(step / "source")
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize("meta_hash", ["trusted_one", "forged_one"])
def test_regression_a_forged_saved_script_does_not_run_whatever_meta_says(
        tmp_path: Path, meta_hash: str) -> None:
    step, script = _train(tmp_path, GUARDED)
    forged = f"open({str(tmp_path / 'marker')!r}, 'w').close()\n" + script.read_text()
    (step / SAVED_MAIN).write_text(forged)
    meta = json.loads((step / "meta.json").read_text())
    if meta_hash == "forged_one":  # else meta.json keeps the hash the user trusts
        meta["code"]["main"]["sha256"] = hashlib.sha256(forged.encode()).hexdigest()
    (step / "meta.json").write_text(json.dumps(meta))
    # The project is trusted: its own train.py runs, not the capture's copy.
    plan = _judge(step)
    assert plan.file == str(script)
    assert bool(plan.notes) == (meta_hash == "forged_one")  # today's file vs the record
    _build(plan)
    assert not (tmp_path / "marker").exists()
    # On a machine that trusts neither the project nor the forged hash: nothing runs.
    assert trust.distrust_folder(str(script.parent))
    with pytest.raises(UntrustedCode):
        _judge(step)
    assert not (tmp_path / "marker").exists()


def test_a_script_in_the_home_folder_is_not_trusted_as_a_folder_but_replays_by_its_hash(
        tmp_path: Path, own_config: Path) -> None:
    home = tmp_path / "home"
    step, script = _train(tmp_path, GUARDED, home=home, project=home)
    notes = json.loads((step / "meta.json").read_text())["notes"]
    assert len(notes) == 1 and "home folder" in notes[0]
    config = json.loads((own_config / "trusted.json").read_text())
    assert config["trusted"] == [] and _sha(script) in config["sources"]
    assert _build(_judge(step)).layer.out_features == 2


def test_python_dash_m_records_the_folder_above_the_package_as_root(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "layers.py").write_text("WIDTH = 6\n")
    source = GUARDED.replace("MARKER =", "from pkg.layers import WIDTH\nMARKER =")
    step, script = _train(tmp_path, source.replace("width=4", "width=WIDTH"),
                          module="pkg.train")
    main = recorded_main(_code(step))
    assert main is not None and (main.file, main.root) == (str(script), str(project))
    for name in ("pkg", "pkg.layers"):
        sys.modules.pop(name, None)
    plan = _judge(step)
    assert plan.folder == str(project)  # trusted: the script's imports come from there
    assert _build(plan).layer.in_features == 6
    for name in ("pkg", "pkg.layers"):
        sys.modules.pop(name, None)


def test_code_record_of_modules_names_their_file_root_and_hash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "proj"
    (project / "mypkg_code").mkdir(parents=True)
    (project / "mypkg_code" / "__init__.py").write_text("")
    (project / "mypkg_code" / "models.py").write_text("def make():\n    return 1\n")
    monkeypatch.syspath_prepend(str(project))
    import importlib

    importlib.import_module("mypkg_code.models")
    record = code_record(["mypkg_code.models:make", "json:loads",
                          "analyzer.scenarios.models:mlp", "nosuchmodule_x:make", "bad target"])
    file = project / "mypkg_code" / "models.py"
    assert record["modules"]["mypkg_code.models"] == {
        "file": str(file), "root": str(project), "sha256": _sha(file)}
    assert record["modules"]["json"]["root"] is None
    assert record["modules"]["analyzer.scenarios.models"]["root"] is None
    assert set(record["modules"]) == {"mypkg_code.models", "json", "analyzer.scenarios.models"}
    assert record["main"] is None or record["main"]["file"]  # pytest's own __main__
    for name in ("mypkg_code", "mypkg_code.models"):
        sys.modules.pop(name, None)


def test_a_recorded_root_is_searched_not_trusted_and_a_changed_module_gets_a_note(
        tmp_path: Path) -> None:
    project = tmp_path / "elsewhere"
    (project / "recnets").mkdir(parents=True)
    (project / "recnets" / "__init__.py").write_text("")
    models = project / "recnets" / "models.py"
    models.write_text("def make():\n    return 'built'\n")
    code = {"modules": {"recnets.models": {"file": str(models), "root": str(project),
                                           "sha256": _sha(models)}}, "main": None}
    with pytest.raises(ModelRebuildError):  # without the record: nowhere to be found
        check("recnets.models:make", TrustPolicy())
    with pytest.raises(UntrustedCode) as refused:
        check("recnets.models:make", TrustPolicy(), code=code)
    assert refused.value.folder == str(project)
    trust.trust_folder(str(project))
    assert check("recnets.models:make", TrustPolicy(), code=code).notes == ()
    recorded = _sha(models)
    models.write_text("def make():\n    return 'changed'\n")
    plan = check("recnets.models:make", TrustPolicy(), code=code)
    assert plan.folder == str(project)
    assert plan.notes == (f"recnets/models.py changed since the capture (sha256 "
                          f"{recorded[:12]} then, {_sha(models)[:12]} now); replayed with "
                          "today's file",)
    assert resolve_plan(plan, TrustPolicy()).obj() == "changed"
    for name in ("recnets", "recnets.models"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("code", [None, {}, {"main": None}, {"main": {"file": 3}},
                                  {"main": {"file": "relative/train.py"}}, [1, 2],
                                  {"main": {"file": "/x\x00y"}, "modules": [1]}])
def test_a_main_factory_without_a_well_formed_recorded_script_is_refused(
        tmp_path: Path, code: Any) -> None:
    with pytest.raises(RefusedCode, match="records no script"):
        check("__main__:make_model", TrustPolicy(trust_code=True), code=code,
              capture_folder=str(tmp_path))
    assert recorded_modules(code) == {}


def test_top_level_code_skips_exactly_the_statements_that_would_train() -> None:
    source = textwrap.dedent('''
        """Docstring."""
        import os
        X = 1
        def f(): return 2
        class C: pass
        if X: Y = 3
        try:
            Z = 4
        except ImportError:
            pass
        main()
        print("training")
        for i in range(3): X += 1
        while True: pass
        with open("m"): pass
        raise SystemExit(main())
    ''').encode()
    namespace: dict[str, Any] = {}
    exec(top_level_code(source, "train.py"), namespace)
    assert (namespace["X"], namespace["Y"], namespace["Z"]) == (1, 3, 4)
    assert namespace["f"]() == 2 and "C" in namespace and namespace["__doc__"] == "Docstring."


def test_register_trust_never_raises_and_keeps_the_folders_of_version_one(
        tmp_path: Path, own_config: Path) -> None:
    own_config.mkdir()
    (own_config / "trusted.json").write_text(json.dumps(
        {"version": 1, "trusted": [str(tmp_path)]}))
    digest = "ab" * 32
    installed = {"file": str(tmp_path / "lib.py"), "root": None, "sha256": "cd" * 32}
    notes = register_trust({"modules": {"lib": installed},
                            "main": {"file": str(tmp_path / "t.py"), "root": "/",
                                     "sha256": digest}})
    assert len(notes) == 1 and "filesystem root" in notes[0]
    assert trust.trusted_folders() == (str(tmp_path),)
    assert trust.trusted_sources() == {digest}
    trust.trust_folder(str(tmp_path / "config"))  # saving folders keeps the sources
    assert trust.trusted_sources() == {digest}
    assert register_trust({"main": {"file": 5}}) == []  # nothing well-formed: nothing done
    (own_config / "trusted.json").unlink()
    own_config.rmdir()
    own_config.write_text("a file where the folder should be")
    notes = register_trust({"main": {"file": str(tmp_path / "t.py"), "sha256": digest}})
    assert notes and notes[0].startswith("could not record the code as trusted")


@pytest.mark.timeout(120)
def test_regression_a_fifo_as_the_saved_script_does_not_hang(tmp_path: Path) -> None:
    step, script = _train(tmp_path, GUARDED, register=False)
    os.remove(step / SAVED_MAIN)
    os.mkfifo(step / SAVED_MAIN)
    with pytest.raises(UntrustedCode):  # the script's own folder is what trust would fix
        _judge(step, policy=TrustPolicy(trust_code=False))
    os.remove(script)
    with pytest.raises(ModelRebuildError, match="gone"):
        _judge(step, policy=TrustPolicy(trust_code=True))


def test_regression_a_refusal_never_offers_a_recorded_root_that_cannot_be_trusted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    step, script = _train(tmp_path, GUARDED, register=False)
    code = _code(step)
    code["main"]["root"] = os.sep  # a hostile record: "trust /" must not be suggested
    with pytest.raises(UntrustedCode) as refused:
        _judge(step, code=code)
    assert refused.value.folder == str(script.parent)
    monkeypatch.setenv("HOME", str(script.parent))  # the script's folder is now home
    os.remove(step / SAVED_MAIN)
    with pytest.raises(RefusedCode, match="cannot be trusted"):
        _judge(step, code=code)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8)
                     | st.sampled_from(["/", "/tmp", "/nonexistent/train.py", "a" * 64,
                                        "source/__main__.py", "\x00"]),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(["modules", "main", "file", "root",
                                                        "sha256", "saved", "json"]),
                                       inner, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(code=_JSON)
def test_any_code_record_is_read_or_ignored_never_a_crash(tmp_path_factory: Any,
                                                          code: Any) -> None:
    folder = str(tmp_path_factory.getbasetemp())
    for target, separator in (("__main__:make", ":"), ("json_nowhere_x.m:make", ":"),
                              ("__main__.Opt", ".")):
        with contextlib.suppress(RefusedCode, UntrustedCode, ModelRebuildError):
            check(target, TrustPolicy(), code=code, capture_folder=folder, separator=separator)
    recorded_modules(code), recorded_main(code)


def test_a_script_importing_a_folder_it_put_on_sys_path_needs_that_folder_given(
        tmp_path: Path) -> None:
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "widths_t.py").write_text("WIDTH = 9\n")
    source = GUARDED.replace("MARKER =", f"import sys\nsys.path.insert(0, {str(helpers)!r})\n"
                                         "from widths_t import WIDTH\nMARKER =")
    step, _ = _train(tmp_path, source.replace("width=4", "width=WIDTH"))
    sys.modules.pop("widths_t", None)
    plan = _judge(step)
    with pytest.raises(ModelRebuildError, match="--import-path"):
        _build(plan)
    given = TrustPolicy.of([str(helpers)])
    assert resolve_plan(plan, given).obj().layer.in_features == 9
    sys.modules.pop("widths_t", None)
