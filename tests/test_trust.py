"""No entry point runs code named by an analysed folder unless the user trusts it.

A capture's meta.json names the factories a replay imports and calls. These tests give
captures hostile names (the standard library, a module shipped inside the run folder, a
name defined elsewhere) and check, by every entry point (the CLI's analyze and replay, the
Python API, the dashboard), that none of them ran: each payload would create a marker
file. They also check that trusting a folder, --import-path and --trust-code do let
ordinary code run, and that the tool's own sample runs still replay.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from analyzer import trust
from analyzer.api import analyze
from analyzer.cli import main
from analyzer.replayer import load_capture, replay
from analyzer.trust import RefusedCode, TrustPolicy, UntrustedCode

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_runs" / "log_softmax_underflow"

BENIGN = textwrap.dedent("""
    from analyzer.scenarios.models import mlp

    def make(**kwargs):
        return mlp(**kwargs)
""")


@pytest.fixture(autouse=True)
def own_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "config"
    monkeypatch.setenv("FORENSICS_CONFIG_DIR", str(folder))
    return folder


def _run(tmp_path: Path, name: str = "run", parent: str = "runs") -> Path:
    if not (SAMPLE / "capture").is_dir():
        pytest.skip("sample_runs/ has no capture (make samples)")
    run = tmp_path / parent / name
    shutil.copytree(SAMPLE, run)
    return run


def _meta_path(run: Path) -> Path:
    return next((run / "capture").glob("step_*/meta.json"))


def _set(run: Path, what: str, value: Any) -> None:
    path = _meta_path(run)
    meta = json.loads(path.read_text())
    meta[what] = value
    path.write_text(json.dumps(meta))


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _payloads(marker: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "os_system": ("os:system", {"command": f"touch {marker}"}),
        "subprocess_run": ("subprocess:run", {"args": ["touch", str(marker)]}),
        "builtins_exec": ("builtins:exec", {"source": f"open({str(marker)!r}, 'w')"}),
        "posix_system": ("posix:system", {"command": f"touch {marker}"}),
        "shutil_rmtree": ("shutil:rmtree", {"path": str(marker.parent / "victim")}),
    }


@pytest.mark.parametrize("payload", ["os_system", "subprocess_run", "builtins_exec",
                                     "posix_system", "shutil_rmtree"])
@pytest.mark.parametrize("slot", ["model", "loss"])
def test_standard_library_factories_never_run_by_any_entry_point(
        tmp_path: Path, payload: str, slot: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path)
    marker = tmp_path / "marker"
    (tmp_path / "victim").mkdir()
    target, kwargs = _payloads(marker)[payload]
    _set(run, slot, {"factory": target, "kwargs": kwargs})
    before = _snapshot(run)
    for trust_code in (False, True):  # no trust makes the standard library importable
        report = analyze(str(run), trust_code=trust_code)
        refused = report.results[0].replay_refused
        assert refused is not None and refused.target == target
        assert "standard library" in refused.message and refused.folder is None
        with pytest.raises(RefusedCode):
            replay(str(run), trust_code=trust_code)
        with pytest.raises(RefusedCode):
            load_capture(str(run), trust_code=trust_code)
        flags = ["--trust-code"] if trust_code else []
        assert main(["analyze", str(run), "-q", *flags]) == 1  # analysed all the same
        assert main(["replay", str(run), *flags]) == 2
        assert "replay not run" in capsys.readouterr().err
    assert not marker.exists() and (tmp_path / "victim").is_dir()
    assert _snapshot(run) == before


def test_optimizer_class_from_the_standard_library_never_runs(tmp_path: Path) -> None:
    run = _run(tmp_path)
    marker = tmp_path / "marker"
    meta = json.loads(_meta_path(run).read_text())
    meta["optimizer"]["class"] = "os.system"
    meta["optimizer"]["hyperparameters"] = {"command": f"touch {marker}"}
    _meta_path(run).write_text(json.dumps(meta))
    result = analyze(str(run), trust_code=True).results[0]
    assert result.replay_refused is not None and result.replay_refused.target == "os.system"
    assert not marker.exists()


def _evil_module(folder: Path, marker: Path) -> None:
    # Importing this module is enough to leave the marker.
    (folder / "evilnets.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n\ndef make(**kwargs):\n    return None\n")


def test_a_module_in_the_analysed_folder_is_not_imported_without_trust(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path)
    marker = tmp_path / "marker"
    _evil_module(run, marker)
    _set(run, "model", {"factory": "evilnets:make", "kwargs": {}})
    before = _snapshot(run)
    result = analyze(str(run)).results[0]
    refused = result.replay_refused
    assert refused is not None and refused.folder == os.path.realpath(run)
    assert refused.message.startswith(
        f"replay not run: it would import `evilnets:make` from {os.path.realpath(run)}")
    assert refused.command == f"forensics trust {os.path.realpath(run)}"
    assert result.failed and result.findings  # everything else is analysed
    with pytest.raises(UntrustedCode):
        replay(str(run))
    assert main(["analyze", str(run)]) == 1
    out = capsys.readouterr().out
    assert "replay not run: it would import `evilnets:make`" in out
    assert "forensics trust" in out
    assert main(["replay", str(run)]) == 2
    assert not marker.exists()
    assert _snapshot(run) == before


def test_the_cli_in_a_fresh_process_runs_no_untrusted_code(tmp_path: Path) -> None:
    run = _run(tmp_path)
    marker = tmp_path / "marker"
    _evil_module(run, marker)
    _set(run, "loss", {"factory": "evilnets:make", "kwargs": {}})
    for command in (["analyze", str(run)], ["replay", str(run)]):
        done = subprocess.run([sys.executable, "-m", "analyzer.cli", *command], cwd=run,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode in (1, 2), done.stderr
        assert "Traceback" not in done.stderr
        assert "replay not run" in done.stdout + done.stderr
    assert not marker.exists()


def _benign_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                parent: str = "runs") -> tuple[Path, Path]:
    """A run whose model factory lives in a module one folder above the run, the project
    folder the user runs forensics from (the current folder is where factories are looked
    for; the folders above a run are not)."""
    run = _run(tmp_path, parent=parent)
    monkeypatch.chdir(run.parent)
    (run.parent / "mynets_trusted.py").write_text(BENIGN)
    meta = json.loads(_meta_path(run).read_text())
    meta["model"] = {"factory": "mynets_trusted:make", "kwargs": meta["model"]["kwargs"]}
    _meta_path(run).write_text(json.dumps(meta))
    return run, run.parent


def _forget_module() -> None:
    sys.modules.pop("mynets_trusted", None)


def test_trusted_folder_import_path_and_trust_code_let_ordinary_code_run(
        tmp_path: Path, own_config: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    run, code = _benign_run(tmp_path, monkeypatch)
    real = os.path.realpath(code)
    result = analyze(str(run)).results[0]
    assert result.replay is None and result.replay_refused is not None
    assert result.replay_refused.folder == real
    for kwargs in ({"import_paths": [str(code)]}, {"trust_code": True}):
        _forget_module()
        done = analyze(str(run), **kwargs).results[0]  # type: ignore[arg-type]
        assert done.replay is not None and done.replay.phase == "forward", kwargs
    _forget_module()
    assert main(["trust", str(code)]) == 0
    assert trust.trusted_folders() == (real,)
    assert own_config.joinpath("trusted.json").is_file()
    assert not any(p.name == "trusted.json" for p in run.rglob("*"))
    done = analyze(str(run)).results[0]
    assert done.replay is not None and done.replay.phase == "forward"
    assert main(["trust"]) == 0 and real in capsys.readouterr().out
    assert main(["trust", "--remove", str(code)]) == 0
    _forget_module()
    assert analyze(str(run)).results[0].replay_refused is not None
    _forget_module()


def test_a_copy_of_a_sample_run_replays_but_not_when_its_meta_names_other_code(
        tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert analyze(str(run)).results[0].replay is not None  # the tool's own factories
    _set(run, "loss", {"factory": "analyzer.cli:main", "kwargs": {"argv": ["trust", "/"]}})
    refused = analyze(str(run)).results[0].replay_refused
    assert refused is not None and "module of this tool" in refused.message
    assert trust.trusted_folders() == ()


@pytest.mark.parametrize("target", ["mynets_trusted:make.__globals__", "mynets_trusted:_make",
                                    "mynets_trusted:__import__", "mynets_trusted",
                                    "__main__:make", "mynets_trusted:os"])
def test_factory_names_must_be_plain_public_attributes(
        tmp_path: Path, target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run, code = _benign_run(tmp_path, monkeypatch)
    (code / "mynets_trusted.py").write_text(BENIGN + "\nimport os\n_make = make\n")
    _set(run, "model", {"factory": target, "kwargs": {}})
    _forget_module()
    with pytest.raises(RefusedCode):
        replay(str(run), import_paths=[str(code)])
    _forget_module()


def test_a_name_imported_from_elsewhere_is_not_a_factory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, code = _benign_run(tmp_path, monkeypatch)
    marker = tmp_path / "marker"
    (code / "mynets_trusted.py").write_text("from os import system\n")
    _set(run, "model", {"factory": "mynets_trusted:system",
                        "kwargs": {"command": f"touch {marker}"}})
    _forget_module()
    with pytest.raises(RefusedCode, match="not a function or class defined"):
        replay(str(run), trust_code=True)
    assert not marker.exists()
    _forget_module()


def test_installed_packages_are_never_imported_for_a_factory(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _set(run, "model", {"factory": "torch.hub:load", "kwargs": {"repo_or_dir": "x/y",
                                                                 "model": "m"}})
    with pytest.raises(RefusedCode, match="installed"):
        replay(str(run), trust_code=True)


def test_trusting_site_packages_or_a_missing_folder_is_refused(tmp_path: Path) -> None:
    import sysconfig

    assert main(["trust", sysconfig.get_paths()["purelib"]]) == 2
    assert main(["trust", str(tmp_path / "missing")]) == 2
    assert trust.trusted_folders() == ()


def test_policy_trusts_sub_folders_of_a_trusted_folder(tmp_path: Path) -> None:
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    policy = TrustPolicy.of([str(tmp_path / "a")])
    assert policy.trusts(str(inner)) and not policy.trusts(str(tmp_path))
    assert not TrustPolicy.of([str(tmp_path / "a")]).trusts(str(tmp_path / "ab"))


def test_a_damaged_config_file_trusts_nothing(own_config: Path) -> None:
    own_config.mkdir()
    (own_config / "trusted.json").write_text("{not json")
    assert trust.trusted_folders() == ()
    (own_config / "trusted.json").write_text(json.dumps({"trusted": ["relative/path", 3]}))
    assert trust.trusted_folders() == ()


def test_the_dashboard_replays_untrusted_code_only_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    hostile = _run(tmp_path, "hostile", parent="runs")
    marker = tmp_path / "marker"
    _evil_module(hostile, marker)
    _set(hostile, "model", {"factory": "evilnets:make", "kwargs": {}})
    # Trusting team/ leaves hostile/ out.
    _, code = _benign_run(tmp_path, monkeypatch, parent="runs/team")
    before = _snapshot(hostile)
    monkeypatch.setenv("FORENSICS_RUNS", str(tmp_path / "runs"))
    _forget_module()
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=300).run()
    assert not at.exception
    # The Runs table paints before any replay: the capture is not replayed yet.
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["hostile", "replay"].startswith("not replayed yet")
    assert not marker.exists()
    at.selectbox(key="run_picker").set_value("hostile")
    at.switch_page("app_pages/replay.py").run()
    assert any("replay not run: it would import `evilnets:make`" in w.value for w in at.warning)
    # Once its replay was tried (and refused), the Runs table says so.
    at.switch_page("app_pages/runs.py").run()
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["hostile", "replay"].startswith("not run: its code is not trusted")
    at.switch_page("app_pages/replay.py").run()
    at.button(key="replay_button").click().run()
    assert not at.exception and not marker.exists()
    assert _snapshot(hostile) == before
    at.selectbox(key="run_picker").set_value("team/run")
    at.switch_page("app_pages/replay.py").run()
    assert any("mynets_trusted:make" in w.value for w in at.warning)
    at.button(key="replay_trust_folder").click().run()
    assert not at.exception
    assert trust.trusted_folders() == (os.path.realpath(code),)
    assert any("Verdict: math-fault" in i.value for i in at.info)
    assert not marker.exists()
    _forget_module()


def test_regression_a_trusted_folder_behind_an_earlier_sys_path_entry_is_the_one_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The trusted folder is on sys.path already (PYTHONPATH, a .pth), but behind the
    # current folder, which is the analysed run and ships a package of the same name.
    run = _run(tmp_path)
    marker = tmp_path / "marker"
    trusted = tmp_path / "project"
    (trusted / "myproj").mkdir(parents=True)
    (trusted / "myproj" / "__init__.py").write_text("")
    (trusted / "myproj" / "models.py").write_text(BENIGN)
    (run / "myproj").mkdir()
    (run / "myproj" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (run / "myproj" / "models.py").write_text(BENIGN)
    meta = json.loads(_meta_path(run).read_text())
    meta["model"]["factory"] = "myproj.models:make"
    _meta_path(run).write_text(json.dumps(meta))
    monkeypatch.chdir(run)
    monkeypatch.setattr(sys, "path", [str(run), *sys.path, str(trusted)])
    for name in ("myproj", "myproj.models"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    result = analyze(str(run), import_paths=[str(trusted)]).results[0]
    assert not marker.exists()
    assert result.replay is not None, result.replay_error or result.replay_refused
    assert sys.modules["myproj"].__file__ == str(trusted / "myproj" / "__init__.py")
    for name in ("myproj", "myproj.models"):
        sys.modules.pop(name, None)


def test_regression_no_folder_above_a_run_is_offered_for_trust(tmp_path: Path) -> None:
    run = _run(tmp_path)
    # A dotted name that plain folders above the run would spell as namespace packages.
    parts = [p for p in str(run).split(os.sep) if p]
    (run / "evil.py").write_text("def make(**kwargs):\n    return None\n")
    _set(run, "model", {"factory": ".".join([*parts, "evil"]) + ":make", "kwargs": {}})
    result = analyze(str(run)).results[0]
    assert result.replay_refused is None or result.replay_refused.folder != os.sep
    assert "forensics trust /" not in (result.replay_error or "") + str(result.replay_refused)
    assert main(["trust", os.sep]) == 2 and main(["trust", os.path.expanduser("~")]) == 2
    assert trust.trusted_folders() == ()


def test_regression_a_run_under_a_trusted_project_does_not_inherit_its_trust(
        tmp_path: Path) -> None:
    project = tmp_path / "proj"
    run = _run(tmp_path, "colleague", parent="proj/runs")
    marker = tmp_path / "marker"
    _evil_module(run, marker)
    _set(run, "model", {"factory": "evilnets:make", "kwargs": {}})
    assert main(["trust", str(project)]) == 0
    refused = analyze(str(run)).results[0].replay_refused
    assert refused is not None and refused.folder == os.path.realpath(run)
    assert not marker.exists()
    assert main(["trust", str(run)]) == 0  # the run's own folder, trusted on purpose
    sys.modules.pop("evilnets", None)
    analyze(str(run))
    assert marker.exists()
    sys.modules.pop("evilnets", None)


def test_regression_the_tools_own_source_tree_is_no_factory_even_when_trusted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(tmp_path)
    monkeypatch.chdir(ROOT)
    for target in ("app.data:trust_folder", "tests.test_trust:analyze",
                   "tests.conftest:only_event_file"):
        _set(run, "model", {"factory": target, "kwargs": {"folder": os.sep}})
        refused = analyze(str(run), import_paths=[str(ROOT)]).results[0].replay_refused
        assert refused is not None and "this tool" in refused.message, target
    assert trust.trusted_folders() == ()


def test_regression_a_namespace_package_is_not_a_factory_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(tmp_path)
    code = tmp_path / "code"
    (code / "nspkg").mkdir(parents=True)  # no __init__.py: any plain folder would do
    (code / "nspkg" / "nets.py").write_text(BENIGN)
    _set(run, "model", {"factory": "nspkg.nets:make", "kwargs": {}})
    monkeypatch.chdir(code)
    result = analyze(str(run), import_paths=[str(code)]).results[0]
    assert result.replay is None and (result.replay_error or result.replay_refused)
    assert main(["analyze", str(run), "--import-path", str(code), "-q"]) == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["env.json", "capture/step_61/meta.json",
                                  "capture/step_61/state.pt"])
def test_regression_a_fifo_in_a_capture_or_beside_it_does_not_hang(
        tmp_path: Path, name: str) -> None:
    run = _run(tmp_path)
    os.remove(run / name)
    os.mkfifo(run / name)
    for replay_too in (False, True):
        assert main(["analyze", str(run), "-q", *([] if replay_too else ["--no-replay"])]) == 1
    result = analyze(str(run)).results[0]
    if name != "env.json":
        assert result.replay is None and result.replay_error


@pytest.mark.parametrize("damage", ["env_list", "hyperparameters_list", "deep_meta",
                                    "meta_to_dev_zero", "deep_env"])
def test_regression_one_hostile_capture_does_not_stop_the_analysis(
        tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path)
    other = _run(tmp_path, "other")
    meta_path = _meta_path(run)
    meta = json.loads(meta_path.read_text())
    if damage == "env_list":
        meta["env"] = [1, 2]
    elif damage == "hyperparameters_list":
        meta["optimizer"]["hyperparameters"] = [1, 2]
    if damage == "deep_meta":
        meta_path.write_text("[" * 200_000 + "]" * 200_000)
    elif damage == "meta_to_dev_zero":
        os.remove(meta_path)
        os.symlink("/dev/zero", meta_path)
    elif damage == "deep_env":
        (run / "env.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    else:
        meta_path.write_text(json.dumps(meta))
    assert main(["analyze", str(tmp_path / "runs"), "-q"]) == 1
    assert "internal error" not in capsys.readouterr().err
    results = {r.run.name: r for r in analyze(str(tmp_path / "runs")).results}
    assert results["other"].replay is not None
    if damage != "deep_env":
        assert results["run"].replay is None and results["run"].replay_error
    del other


def test_regression_history_entries_that_are_not_dicts_are_a_capture_error(
        tmp_path: Path) -> None:
    import torch

    run = _run(tmp_path)
    meta = json.loads(_meta_path(run).read_text())
    meta["mode"] = "every_n"
    _meta_path(run).write_text(json.dumps(meta))
    torch.save({"steps": [1, 2, 3]}, _meta_path(run).parent / "history.pt")
    result = analyze(str(run)).results[0]
    assert result.replay is None and "not dicts" in (result.replay_error or "")


def test_regression_the_tools_own_factories_refuse_arguments_beyond_the_saved_state(
        tmp_path: Path) -> None:
    run = _run(tmp_path)
    meta = json.loads(_meta_path(run).read_text())
    meta["model"]["kwargs"].update(hidden=10**6, in_features=10**6)  # ~10^12 parameters
    _meta_path(run).write_text(json.dumps(meta))
    result = analyze(str(run)).results[0]
    assert result.replay is None and "more than the" in (result.replay_error or "")


@pytest.mark.parametrize("target", ["transformers:GPT2LMHeadModel",
                                    "transformers.models.gpt2.modeling_gpt2:GPT2LMHeadModel"])
def test_a_model_class_of_the_installed_transformers_is_allowed_without_trust(
        target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    plan = trust.check(target, TrustPolicy())
    assert (plan.source, plan.folder) == ("library", None)
    import transformers

    found = trust.resolve_plan(plan, TrustPolicy())
    assert found.obj is transformers.GPT2LMHeadModel and found.folder is None
    trust.check_model_config(target, {"n_layer": 1, "n_embd": 8})


@pytest.mark.parametrize("target", ["transformers:pipeline", "transformers:AutoModelForCausalLM",
                                    "transformers:PreTrainedModel", "transformers:GPT2Config",
                                    "transformers.models.bert.modeling_bert:GPT2LMHeadModel",
                                    "transformers.trainer:Trainer", "transformers:_private"])
def test_nothing_else_of_transformers_is_a_library_factory(
        target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RefusedCode):
        trust.resolve(target, TrustPolicy(trust_code=True))


@pytest.mark.parametrize("key", ["auto_map", "trust_remote_code"])
def test_a_library_model_config_asking_for_remote_code_is_refused(key: str) -> None:
    with pytest.raises(RefusedCode, match=key):
        trust.check_model_config("transformers:GPT2LMHeadModel",
                                 {"n_layer": 1, key: {"AutoModel": "evil.Model"}})
