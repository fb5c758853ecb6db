"""``forensics replay RUN --batch FILE``: one step replayed from a checkpoint the real
frameworks wrote (torch.save, Lightning's ModelCheckpoint, the Hugging Face Trainer), on a
batch that really breaks the model, for runs that left no capture."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from analyzer.cli.dispatch import main
from analyzer.replayer.saved import optimizer_class
from analyzer.trust import CONFIG_ENV
from tests.readonly import snapshot

PROJECT = '''
import torch
from torch import nn


class Normalize(nn.Module):
    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True)  # no epsilon: a zero row is 0/0


class Net(nn.Module):
    def __init__(self, features=4, hidden=8):
        super().__init__()
        # No bias before the normalisation: a zero sample reaches it as a zero row.
        self.net = nn.Sequential(nn.Linear(features, hidden, bias=False), nn.Tanh(),
                                 Normalize(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)


def make_net(features=4, hidden=8):
    return Net(features, hidden)


def make_loss():
    return nn.MSELoss()


def make_step():
    def step(model, batch):
        x, y = batch
        return nn.functional.mse_loss(model(x), y)
    return step


def bad_batch(step):
    x = torch.ones(4, 4)
    x[step % 4] = 0
    return x, torch.zeros(4, 1)
'''

LIGHTNING = '''
import lightning.pytorch as pl
import torch
from torch import nn

from ckproj import Normalize


class LitNet(pl.LightningModule):
    def __init__(self, features=4, hidden=8, lr=0.01):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden, bias=False), nn.Tanh(),
                                 Normalize(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A user's project folder, outside the tool: the model, loss, step and data code."""
    folder = tmp_path_factory.mktemp("project")
    (folder / "ckproj.py").write_text(PROJECT)
    (folder / "litproj.py").write_text(LIGHTNING)
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        for name in ("ckproj", "litproj"):
            sys.modules.pop(name, None)


def module(name: str) -> ModuleType:
    import importlib

    return importlib.import_module(name)


def zero_row_batch(path: Path) -> Path:
    """Four samples, the second all zeros: 0/0 in the normalisation."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 4, generator=gen)
    x[1] = 0
    torch.save((x, torch.randn(4, 1, generator=gen)), path)
    return path


def train_plain(run: Path, steps: int = 3, **save: Any) -> torch.nn.Module:
    """A plain loop: Adam over a few healthy batches, then torch.save of its state."""
    proj = module("ckproj")
    torch.manual_seed(0)
    model = proj.make_net(4, 6)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        proj.make_loss()(model(torch.randn(8, 4)), torch.randn(8, 1)).backward()
        optimizer.step()
    run.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": steps, **save}, run / f"ckpt_{steps}.pt")
    return model


def forensics(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    code = main(["replay", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def replay_json(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, dict[str, Any]]:
    code, out, err = forensics(capsys, *args, "--json", "-")
    assert code in (0, 1), err
    return code, json.loads(out)


def named(data: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    op = data["forward_op"] if data["phase"] == "forward" else data["backward"]["origin"]
    return data["phase"], data["layer"], op["op"] if op else None


def test_a_torch_save_checkpoint_names_the_normalisation_a_zero_row_breaks(
        tmp_path: Path, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    train_plain(run)
    bad = zero_row_batch(tmp_path / "bad.pt")
    before = snapshot(run)
    flags = ["--model", "ckproj:make_net", "--model-kwargs", '{"features": 4, "hidden": 6}',
             "--loss", "ckproj:make_loss", "--import-path", project]
    code, data = replay_json(capsys, run, "--batch", bad, *flags)
    assert code == 1
    assert named(data) == ("forward", "net.2", "div.Tensor")
    origin = data["origin"]
    assert origin["kind"] == "checkpoint" and origin["checkpoint_step"] == 3
    assert origin["checkpoint"] == str(run / "ckpt_3.pt")
    assert origin["optimizer"] == {"class": "torch.optim.Adam", "restored": True}
    assert origin["step_call"] == {"kind": "loss_fn", "from": "--loss"}
    assert data["notes"][0] == origin["label"] == (
        f"replay from checkpoint ckpt_3.pt (step 3) on a supplied batch (--batch {bad}), "
        "not the failing step")
    code, text, _ = forensics(capsys, run, "--batch", bad, *flags)
    assert text.splitlines()[0] == origin["label"]  # the heading says what was replayed
    assert snapshot(run) == before


@pytest.mark.parametrize("kind", ["npz", "npy-and-step", "data"])
def test_the_batch_comes_from_numpy_files_or_the_users_data_function(
        tmp_path: Path, project: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    run = tmp_path / "run"
    train_plain(run, steps=5)
    x, y = np.ones((4, 4), np.float32), np.zeros((4, 1), np.float32)
    x[2] = 0
    flags: list[Any] = ["--model", "ckproj:make_net", "--model-kwargs", '{"hidden": 6}',
                        "--import-path", project]
    if kind == "npz":
        np.savez(tmp_path / "bad.npz", x, y)  # arr_0, arr_1: the (inputs, targets) pair
        flags += ["--batch", tmp_path / "bad.npz", "--loss", "ckproj:make_loss"]
    elif kind == "npy-and-step":
        np.save(tmp_path / "bad.npy", x)  # one array: the step function takes it whole
        flags += ["--batch", tmp_path / "bad.npy", "--step", "tests_step:make"]
        (tmp_path / "tests_step.py").write_text(
            "import torch\n\ndef make():\n    return lambda model, x: model(x).pow(2).mean()\n")
        flags += ["--import-path", tmp_path]
    else:
        flags += ["--data", "ckproj:bad_batch", "--step", "ckproj:make_step"]
    before = snapshot(run)
    code, data = replay_json(capsys, run, *flags)
    assert code == 1
    assert named(data) == ("forward", "net.2", "div.Tensor")
    if kind == "data":  # called with the checkpoint's step: 5 % 4 is the zero row
        assert data["forward"]["batch"][0]["absmin"] == 0
        assert data["origin"]["batch"] == "--data ckproj:bad_batch"
    assert snapshot(run) == before


def test_the_model_the_recorder_wrote_into_env_json_needs_no_flag(
        tmp_path: Path, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analyzer.capture import FlightRecorder

    proj = module("ckproj")
    run = tmp_path / "run"
    torch.manual_seed(0)
    model = proj.make_net(4, 5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # The recorder writes env.json when it starts and trusts its factories' code root here.
    recorder = FlightRecorder(run, model, optimizer, model_factory="ckproj:make_net",
                              model_kwargs={"features": 4, "hidden": 5},
                              loss_factory="ckproj:make_loss")
    loss_fn = proj.make_loss()
    for step in range(4):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        with recorder.step(step, x, y):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            recorder.loss(loss)
            loss.backward()
            optimizer.step()
    (run / "checkpoints").mkdir()
    torch.save(model.state_dict(), run / "checkpoints" / "step_4.pt")  # weights alone
    assert not recorder.captured
    bad = zero_row_batch(tmp_path / "bad.pt")
    before = snapshot(run)
    code, data = replay_json(capsys, run, "--batch", bad)
    assert code == 1
    assert named(data) == ("forward", "net.2", "div.Tensor")
    origin = data["origin"]
    assert origin["model"] == {"factory": "ckproj:make_net", "from": str(run / "env.json")}
    assert origin["step_call"]["kind"] == "loss_fn"
    assert origin["checkpoint_step"] == 4  # from the file name
    assert origin["optimizer"] == {"class": None, "restored": False}  # none saved
    assert any("SGD with lr=0" in n for n in data["notes"])
    assert snapshot(run) == before


def test_a_lightning_checkpoint_rebuilds_its_module_from_the_hyperparameters(
        tmp_path: Path, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    lit = module("litproj")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    checkpoint = pl.callbacks.ModelCheckpoint(every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(default_root_dir=tmp_path / "run", max_steps=4, logger=False,
                         callbacks=[checkpoint], enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's notes on a tiny dataset
        trainer.fit(lit.LitNet(hidden=6), DataLoader(data, batch_size=4))
    run = tmp_path / "run"
    saves = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert saves == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    bad = zero_row_batch(tmp_path / "bad.pt")
    before = snapshot(run)
    # hidden=6 is not the default: only the checkpoint's hyper_parameters say it
    code, data_ = replay_json(capsys, run, "--batch", bad, "--model", "litproj:LitNet",
                              "--import-path", project)
    assert code == 1
    assert named(data_) == ("forward", "net.2", "div.Tensor")
    origin = data_["origin"]
    assert origin["format"] == "lightning" and origin["checkpoint_step"] == 4
    assert origin["checkpoint"].endswith("epoch=0-step=4.ckpt")  # the last, all finite
    assert origin["step_call"]["kind"] == "training_step"
    assert origin["optimizer"] == {"class": "torch.optim.Adam", "restored": True}
    assert snapshot(run) == before
    code, _, err = forensics(capsys, run, "--batch", bad)  # the class is named nowhere
    assert code == 2 and "--model module:Class" in err and "Traceback" not in err


def test_a_lightning_run_under_the_recorder_callback_replays_with_no_flag(
        tmp_path: Path, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from analyzer.capture.lightning import FlightRecorderCallback

    lit = module("litproj")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    run = tmp_path / "run"
    # The callback writes env.json into the logger's version folder at fit start (and
    # trusts the project's root on this machine); the healthy run leaves no capture.
    trainer = pl.Trainer(default_root_dir=run, max_steps=4, enable_progress_bar=False,
                         callbacks=[pl.callbacks.ModelCheckpoint(every_n_train_steps=2),
                                    FlightRecorderCallback()],
                         enable_model_summary=False, accelerator="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(lit.LitNet(hidden=5), DataLoader(data, batch_size=4))
    version = run / "lightning_logs" / "version_0"
    assert (version / "env.json").is_file() and not (version / "capture").exists()
    bad = zero_row_batch(tmp_path / "bad.pt")
    before = snapshot(run)
    code, data_ = replay_json(capsys, run, "--batch", bad)
    assert code == 1
    assert named(data_) == ("forward", "net.2", "div.Tensor")
    origin = data_["origin"]
    assert origin["model"] == {"factory": "litproj:LitNet", "from": str(version / "env.json")}
    assert origin["step_call"] == {"kind": "training_step", "from": str(version / "env.json")}
    assert origin["label"].startswith("replay from checkpoint lightning_logs/version_0/"
                                      "checkpoints/epoch=0-step=4.ckpt (step 4) on a supplied")
    assert snapshot(run) == before


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.frameworks import corpus

    return {name: corpus.get(name, tmp_path_factory) for name in ("hf_nan", "hf_healthy")}


def huge_embeddings(path: Path) -> Path:
    """Token embeddings at 3e38 in one position: finite, but the layer norm's mean of them
    overflows float32."""
    embeds = torch.zeros(2, 16, 16)
    embeds[0, 3] = 3e38
    labels = torch.arange(16).repeat(2, 1) % 32
    torch.save({"inputs_embeds": embeds, "labels": labels}, path)
    return path


def test_a_hugging_face_trainer_run_replays_its_last_finite_checkpoint(
        tmp_path: Path, hf_runs: dict[str, Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = hf_runs["hf_nan"]  # checkpoint-8 is finite; -16 and -24 hold the NaN weights
    bad = huge_embeddings(tmp_path / "bad.pt")
    before = snapshot(run)
    code, data = replay_json(capsys, run, "--batch", bad)  # no flag: config.json says it
    assert code == 1
    assert (data["phase"], data["layer"]) == ("forward", "transformer.h.0.ln_1")
    origin = data["origin"]
    assert origin["checkpoint"] == str(run / "checkpoint-8") and origin["checkpoint_step"] == 8
    assert origin["model"] == {"factory": "transformers:GPT2LMHeadModel", "from": "config.json"}
    assert origin["step_call"]["kind"] == "model_loss"
    assert origin["optimizer"] == {"class": "torch.optim.SGD", "restored": True}
    assert snapshot(run) == before
    # The op, with dropout off: dropout draws its mask into torch.empty_like memory, whose
    # leftover bytes the op trace can take for a NaN that op made.
    folder = tmp_path / "checkpoint-8"
    shutil.copytree(run / "checkpoint-8", folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    (folder / "config.json").write_text(json.dumps(config))
    code, data = replay_json(capsys, tmp_path, "--checkpoint", folder, "--batch", bad)
    assert named(data) == ("forward", "transformer.h.0.ln_1", "native_layer_norm.default")
    assert data["verdict"]["kind"] == "range-overflow"  # finite in float64


def test_a_trainers_adamw_state_is_restored_in_its_parameter_groups(
        tmp_path: Path, hf_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    folder = hf_runs["hf_healthy"] / "checkpoint-10"
    bad = huge_embeddings(tmp_path / "bad.pt")
    code, data = replay_json(capsys, hf_runs["hf_healthy"], "--checkpoint", folder,
                             "--batch", bad)
    assert code == 1 and data["origin"]["checkpoint_step"] == 10
    # decayed weights first, then biases and norms: 6 and 10 parameters, Adam moments of
    # each parameter's own shape
    assert data["origin"]["optimizer"] == {"class": "torch.optim.AdamW", "restored": True}
    fine = tmp_path / "fine.pt"
    ids = torch.arange(16).repeat(2, 1) % 32
    torch.save({"input_ids": ids, "labels": ids}, fine)
    code, data = replay_json(capsys, hf_runs["hf_healthy"], "--checkpoint", folder,
                             "--batch", fine, "--model", "transformers:GPT2LMHeadModel")
    assert code == 0 and data["verdict"]["kind"] == "finite" and data["phase"] is None
    assert data["origin"]["model"] == {"factory": "transformers:GPT2LMHeadModel",
                                       "from": "--model"}  # built from the folder's config


@pytest.mark.parametrize("layout", ["sharded", "bin"])
def test_a_save_pretrained_folder_replays_sharded_or_as_a_bin(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    folder = tmp_path / "run" / "checkpoint-3"
    model = GPT2LMHeadModel(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(folder, max_shard_size="10KB")
    if layout == "bin":  # as transformers 4 wrote it: torch.save of the state dict
        for shard in folder.glob("model*.safetensors*"):
            shard.unlink()
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    else:
        assert (folder / "model.safetensors.index.json").is_file()
    # an Adam over the same parameters, saved beside the weights as the Trainer does
    torch.save(torch.optim.Adam(model.parameters()).state_dict(), folder / "optimizer.pt")
    bad = huge_embeddings(tmp_path / "bad.pt")
    before = snapshot(tmp_path / "run")
    code, data = replay_json(capsys, tmp_path / "run", "--batch", bad)
    assert code == 1
    assert named(data) == ("forward", "transformer.h.0.ln_1", "native_layer_norm.default")
    assert data["origin"]["checkpoint"] == str(folder)
    assert data["origin"]["checkpoint_step"] == 3
    assert data["origin"]["optimizer"]["class"] == "torch.optim.Adam"
    assert snapshot(tmp_path / "run") == before


def test_a_config_that_asks_for_remote_code_is_refused(
        tmp_path: Path, hf_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "checkpoint-8"
    shutil.copytree(hf_runs["hf_nan"] / "checkpoint-8", folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    code, _, err = forensics(capsys, tmp_path, "--checkpoint", folder, "--batch",
                             huge_embeddings(tmp_path / "bad.pt"))
    assert code == 2 and "auto_map" in err and "Traceback" not in err


def test_an_untrusted_model_factory_is_refused_and_never_imported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "config"))  # nothing trusted
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    marker = tmp_path / "ran"
    (stranger / "strangerproj.py").write_text(textwrap.dedent(f"""
        open({str(marker)!r}, "w").close()
        def make():
            raise AssertionError("called")
    """))
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"w": torch.zeros(2)}, run / "model.pt")
    monkeypatch.chdir(stranger)  # found in the current folder, which is not trusted
    code, _, err = forensics(capsys, run, "--batch", zero_row_batch(tmp_path / "bad.pt"),
                             "--model", "strangerproj:make", "--loss", "strangerproj:make")
    assert code == 2
    assert "not trusted" in err and "forensics trust" in err and "Traceback" not in err
    assert not marker.exists() and "strangerproj" not in sys.modules
    code, _, err = forensics(capsys, run, "--batch", tmp_path / "bad.pt",
                             "--model", "os:system", "--loss", "strangerproj:make")
    assert code == 2 and "standard library" in err
    # The tool's own model factory is trusted; the data function still is not.
    mlp = torch.nn.Sequential()
    mlp.add_module("fc1", torch.nn.Linear(4, 3))
    mlp.add_module("act1", torch.nn.ReLU())
    mlp.add_module("fc2", torch.nn.Linear(3, 1))
    torch.save(mlp.state_dict(), run / "model.pt")
    tool = ["--model", "analyzer.scenarios.models:mlp", "--loss", "analyzer.scenarios.losses:mse"]
    code, _, err = forensics(capsys, run, "--data", "strangerproj:make", *tool, "--model-kwargs",
                             '{"in_features": 4, "hidden": 3, "out_features": 1}')
    assert code == 2 and "not trusted" in err and not marker.exists()
    # ... and its arguments may not build a model larger than the checkpoint
    code, _, err = forensics(capsys, run, "--batch", tmp_path / "bad.pt", *tool,
                             "--model-kwargs",
                             '{"in_features": 4, "hidden": 100000, "out_features": 1}')
    assert code == 2 and "more than the 19 the checkpoint holds" in err


class Payload:
    """A pickled object: loading it would run code (``__setstate__``)."""

    loaded = False

    def __setstate__(self, state: object) -> None:
        Payload.loaded = True


def test_a_checkpoint_or_batch_that_needs_unpickling_is_refused_never_loaded(
        tmp_path: Path, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    train_plain(run, extra=Payload())
    bad = zero_row_batch(tmp_path / "bad.pt")
    flags = ["--model", "ckproj:make_net", "--model-kwargs", '{"hidden": 6}',
             "--loss", "ckproj:make_loss", "--import-path", project]
    code, _, err = forensics(capsys, run, "--batch", bad, "--checkpoint", run / "ckpt_3.pt",
                             *flags)
    assert code == 2 and "weights_only=True" in err and "not loaded any other way" in err
    assert "Traceback" not in err
    evil = tmp_path / "evil.pt"
    torch.save({"x": Payload()}, evil)
    good = tmp_path / "good"
    train_plain(good)
    code, _, err = forensics(capsys, good, "--batch", evil, *flags)
    assert code == 2 and f"--batch {evil}" in err and "weights_only=True" in err
    assert not Payload.loaded


def test_a_missing_file_or_a_bad_batch_is_named_in_one_line(
        tmp_path: Path, project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    train_plain(run)
    bad = zero_row_batch(tmp_path / "bad.pt")
    flags = ["--model", "ckproj:make_net", "--model-kwargs", '{"hidden": 6}',
             "--loss", "ckproj:make_loss", "--import-path", project]
    text = tmp_path / "text.pt"
    text.write_text("not a checkpoint")
    single = tmp_path / "single.pt"
    torch.save(torch.ones(4, 4), single)
    wide = tmp_path / "wide.pt"
    torch.save((torch.ones(4, 9), torch.ones(4, 1)), wide)
    cases = [
        (["--checkpoint", tmp_path / "nope.pt", "--batch", bad],
         f"--checkpoint {tmp_path / 'nope.pt'}: no such"),
        (["--batch", tmp_path / "nope.pt"], f"--batch {tmp_path / 'nope.pt'}: no such file"),
        (["--batch", text], f"--batch {text}: cannot be read"),
        (["--batch", single], "needs an (inputs, targets) pair"),
        (["--batch", wide], f"on --batch {wide}"),
        (["--batch", bad, "--model-kwargs", "{hidden: 6}"], "--model-kwargs is not JSON"),
        (["--batch", bad, "--model-kwargs", '{"hidden": 7}'],
         f"the weights of {run / 'ckpt_3.pt'} do not fit the model it built: size mismatch"),
        (["--batch", bad, "--data", "ckproj:bad_batch"], "not both"),
    ]
    for extra, message in cases:
        code, _, err = forensics(capsys, run, *flags, *extra)
        assert code == 2, (extra, err)
        assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    code, _, err = forensics(capsys, run, "--model", "ckproj:make_net")
    assert code == 2 and "needs a batch" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = forensics(capsys, empty, "--batch", bad, *flags)
    assert code == 2 and "no checkpoint found" in err
    code, _, err = forensics(capsys, run)  # no capture, no batch: says what would do
    assert code == 2 and "holds no capture" in err and "add --batch FILE" in err


@pytest.mark.parametrize("cls", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW,
                                 torch.optim.RMSprop, torch.optim.NAdam, torch.optim.Adagrad])
def test_the_optimizer_class_is_read_from_its_saved_hyperparameter_names(cls: Any) -> None:
    group = cls([torch.zeros(2, requires_grad=True)], lr=0.1).state_dict()["param_groups"][0]
    assert optimizer_class(group) is cls
    assert optimizer_class({**group, "initial_lr": 0.1}) is cls  # a scheduler's addition
    assert optimizer_class({"params": [0], "lr": 0.1, "not_an_argument": 1}) is None

