"""Framework metadata: hparams.yaml, config.json, trainer_state.json, training_args.bin and
scheduler states, written by the real libraries into tmp_path, read without executing
anything, and fed to the learning-rate rule."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analyzer.ingest.metadata import hparams as hparams_module
from analyzer.ingest.metadata.hfjson import read_model_config, read_trainer_state
from analyzer.ingest.metadata.hparams import read_hparams
from analyzer.ingest.metadata.read import read_run_metadata
from analyzer.ingest.metadata.torchsaved import read_scheduler, read_training_args
from analyzer.model import RunMetadata, encode
from tests.readonly import snapshot


@pytest.fixture(autouse=True, scope="module")
def _offline() -> Iterator[None]:
    """No hub, no tracker: the frameworks read these when they are imported and used."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                            "WANDB_DISABLED")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_DISABLED="true")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def args_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real training_args.bin, saved as the Trainer's _save does."""
    import torch
    from transformers import TrainingArguments

    folder = tmp_path_factory.mktemp("args")
    args = TrainingArguments(output_dir=str(folder / "out"), learning_rate=5.0, warmup_steps=0,
                             logging_steps=7, gradient_accumulation_steps=4, seed=123,
                             max_grad_norm=0.5, adam_epsilon=1e-6, report_to=["tensorboard"])
    path = folder / "training_args.bin"
    torch.save(args, path)
    return path


def test_training_args_read_statically_from_the_real_file(args_file: Path) -> None:
    got = read_training_args(str(args_file))
    assert got.complete and not got.issues
    assert got.fields["learning_rate"] == 5.0
    assert got.fields["warmup_steps"] == 0
    assert got.fields["logging_steps"] == 7
    assert got.fields["gradient_accumulation_steps"] == 4
    assert got.fields["seed"] == 123
    assert got.fields["max_grad_norm"] == 0.5
    assert got.fields["adam_epsilon"] == 1e-6
    assert got.fields["fp16"] is False and got.fields["bf16"] is False
    assert got.fields["lr_scheduler_type"] == "linear"  # an enum, by its value
    assert isinstance(got.fields["optim"], str) and "adamw" in got.fields["optim"]


def test_training_args_agree_with_torch_load_of_the_same_file(args_file: Path) -> None:
    """The oracle: what the Trainer itself would load (trusted, here only)."""
    import torch

    loaded = torch.load(args_file, weights_only=False)
    got = read_training_args(str(args_file)).fields
    for name, value in got.items():
        real = getattr(loaded, name)
        assert value == getattr(real, "value", real), name


def _closed_zip_with_pickle(path: Path, payload: bytes, prefix: str = "training_args") -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", payload)
        z.writestr(f"{prefix}/version", "3\n")


class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_pickle_naming_os_system_never_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    marker = tmp_path / "pwned"
    state = {"learning_rate": 0.1, "hook": _Boom(str(marker)), "warmup_steps": 10}
    payload = pickle.dumps(state, protocol=2)
    assert any(op.name in ("GLOBAL", "STACK_GLOBAL") for op, _, _ in pickletools.genops(payload))
    _closed_zip_with_pickle(tmp_path / "training_args.bin", payload)
    (tmp_path / "scheduler.pt").write_bytes((tmp_path / "training_args.bin").read_bytes())
    before = snapshot(tmp_path)

    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("something tried to unpickle an analysed file")

    import torch

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    got = read_training_args(str(tmp_path / "training_args.bin"))
    read_scheduler(str(tmp_path / "scheduler.pt"))
    assert not marker.exists()
    assert got.fields["learning_rate"] == 0.1 and got.fields["warmup_steps"] == 10
    assert snapshot(tmp_path) == before


def test_truncated_training_args_keeps_the_fields_before_the_cut(args_file: Path,
                                                                 tmp_path: Path) -> None:
    data = args_file.read_bytes()
    full = read_training_args(str(args_file)).fields
    seen_partial = False
    for cut in range(0, len(data), max(1, len(data) // 97)):
        path = tmp_path / "training_args.bin"
        path.write_bytes(data[:cut])
        got = read_training_args(str(path))
        assert got.issues, cut  # a cut file always says so
        for name, value in got.fields.items():
            assert full[name] == value, (cut, name)
        seen_partial |= 0 < len(got.fields) < len(full)
    assert seen_partial  # some cut kept part of the fields, not all or nothing


def test_zip_bomb_and_foreign_archives_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "training_args.bin"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("training_args/data.pkl", b"\0" * (8 << 20))
    got = read_training_args(str(path))
    assert not got.fields and got.issues
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("something/else.txt", "hello")
    got = read_training_args(str(path))
    assert not got.fields and [i.kind for i in got.issues] == ["bad_record"]
    path.write_bytes(b"learning_rate: 5\n")  # not a pickle at all
    got = read_training_args(str(path))
    assert not got.fields and got.issues


def test_legacy_torch_save_is_read_too(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "scheduler.pt"
    torch.save({"base_lrs": [0.3, 0.1], "last_epoch": 12, "_last_lr": [0.2, 0.05]}, path,
               _use_new_zipfile_serialization=False)
    got = read_scheduler(str(path))
    assert got.fields == {"base_lr": 0.3, "param_groups": 2, "last_lr": 0.2, "last_epoch": 12}


def test_scheduler_state_of_a_real_transformers_schedule(tmp_path: Path) -> None:
    import torch
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=3e-4)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=10, num_training_steps=100)
    for _ in range(5):
        opt.step()
        sched.step()
    torch.save(sched.state_dict(), tmp_path / "scheduler.pt")
    got = read_scheduler(str(tmp_path / "scheduler.pt"))
    assert got.complete and got.fields["base_lr"] == pytest.approx(3e-4)
    assert got.fields["last_epoch"] == 5
    assert got.fields["last_lr"] == pytest.approx(sched.get_last_lr()[0])


@pytest.fixture(scope="module")
def lightning_hparams(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning.pytorch.core.saving import save_hparams_to_yaml

    folder = tmp_path_factory.mktemp("lightning")
    path = folder / "hparams.yaml"
    save_hparams_to_yaml(str(path), {
        "lr": 0.02, "betas": (0.9, 0.95), "warmup_steps": 0, "batch_size": 64,
        "optimizer": {"name": "AdamW", "eps": 1e-7}, "accumulate_grad_batches": 2,
        "gradient_clip_val": 1.0, "precision": "16-mixed", "seed": 7,
        "model": {"lr": 9.0, "hidden": 32},
    }, use_omegaconf=False)
    return path


def test_lightning_hparams_yaml_by_common_key_names(lightning_hparams: Path) -> None:
    text = lightning_hparams.read_text()
    assert "!!python/tuple" in text  # what yaml.dump makes of the tuple
    got = read_hparams(str(lightning_hparams))
    assert not got.issues
    settings = {k: v for k, (_, v) in got.settings.items()}
    assert settings["learning_rate"] == 0.02  # the top-level lr, not model.lr
    assert got.settings["learning_rate"][0] == "lr"
    assert settings["adam_epsilon"] == 1e-7  # eps under an optimizer's sub-config
    assert settings["gradient_accumulation_steps"] == 2
    assert settings["max_grad_norm"] == 1.0
    assert settings["precision"] == "16-mixed"
    assert settings["warmup_steps"] == 0 and settings["seed"] == 7
    assert got.fields["model.lr"] == 9.0


def test_hparams_with_python_tags_never_constructs_them(tmp_path: Path,
                                                        lightning_hparams: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "hparams.yaml"
    path.write_text(lightning_hparams.read_text()
                    + f"hook: !!python/object/apply:os.system ['touch {marker}']\n"
                    + "cls: !!python/name:os.system ''\n"
                    + "custom: !mytag 3\n")
    got = read_hparams(str(path))
    assert not marker.exists()
    tagged = [i for i in got.issues if i.kind == "bad_record"]
    assert len(tagged) == 3
    lines = path.read_text().splitlines()
    for issue in tagged:
        assert issue.location.file == str(path) and issue.location.line is not None
        assert lines[issue.location.line - 1].startswith(("hook:", "cls:", "custom:"))
    assert got.settings["learning_rate"] == ("lr", 0.02)  # the rest is kept


def test_hostile_yaml_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    huge = tmp_path / "huge.yaml"
    huge.write_text("lr: 0.1\npad: '" + "x" * (hparams_module.MAX_BYTES + 10) + "'\n")
    got = read_hparams(str(huge))
    assert [i.kind for i in got.issues] == ["too_large"] and not got.settings
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 {lr: 1.0, x: 1}"]
    lines += [f"a{i}: &a{i} {{p: *a{i - 1}, q: *a{i - 1}, r: *a{i - 1}}}" for i in range(1, 25)]
    bomb.write_text("\n".join(lines) + "\n")
    got = read_hparams(str(bomb))
    assert [i.kind for i in got.issues] == ["read_limit"]
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 50_000 + "]" * 50_000 + "\n")
    got = read_hparams(str(deep))
    assert [i.kind for i in got.issues] == ["bad_record"]
    broken = tmp_path / "broken.yaml"
    broken.write_text("lr: 0.1\nfoo: [1, 2\nbar: 3\n")
    got = read_hparams(str(broken))
    assert got.issues[0].kind == "bad_record" and got.issues[0].location.line is not None


def test_fifo_named_hparams_is_not_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "hparams.yaml"
    os.mkfifo(fifo)
    assert [i.kind for i in read_hparams(str(fifo)).issues] == ["not_regular"]
    assert [i.kind for i in read_training_args(str(fifo)).issues] == ["not_regular"]
    assert [i.kind for i in read_model_config(str(fifo)).issues] == ["not_regular"]


def test_hf_config_and_trainer_state_from_the_real_writers(tmp_path: Path) -> None:
    from transformers import GPT2Config
    from transformers.trainer_callback import TrainerState

    GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64).save_pretrained(tmp_path)
    config = read_model_config(str(tmp_path / "config.json"))
    assert config.complete
    assert config.fields["model_type"] == "gpt2"
    assert config.fields["layer_norm_epsilon"] == 1e-5
    assert config.fields["n_layer"] == 1
    state = TrainerState(global_step=40, max_steps=100, logging_steps=5, train_batch_size=8,
                         best_metric=0.25)
    state.log_history = [{"loss": 1.0, "step": s} for s in range(5, 45, 5)]
    state.save_to_json(str(tmp_path / "trainer_state.json"))
    got = read_trainer_state(str(tmp_path / "trainer_state.json"))
    assert got.complete
    assert {k: got.fields[k] for k in ("global_step", "max_steps", "logging_steps",
                                       "train_batch_size", "best_metric")} == {
        "global_step": 40, "max_steps": 100, "logging_steps": 5, "train_batch_size": 8,
        "best_metric": 0.25}


def test_trainer_state_too_large_or_cut_is_read_from_its_top_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.trainer_callback import TrainerState

    from analyzer.ingest.metadata import hfjson

    state = TrainerState(global_step=900, max_steps=1000, logging_steps=10)
    state.log_history = [{"loss": 0.5, "step": s, "grad_norm": 1.0} for s in range(0, 900, 10)]
    path = tmp_path / "trainer_state.json"
    state.save_to_json(str(path))
    monkeypatch.setattr(hfjson, "MAX_BYTES", 2000)
    monkeypatch.setattr(hfjson, "WINDOW", 1000)
    got = read_trainer_state(str(path))
    assert [i.kind for i in got.issues] == ["too_large"]
    assert got.fields["global_step"] == 900 and got.fields["logging_steps"] == 10
    monkeypatch.undo()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # the last fields lost
    got = read_trainer_state(str(path))
    assert got.issues[0].kind == "bad_json"
    assert got.fields["global_step"] == 900  # written before the log history's end


def test_run_metadata_resolves_each_setting_with_its_file(tmp_path: Path, args_file: Path,
                                                          lightning_hparams: Path) -> None:
    (tmp_path / "checkpoint-10").mkdir()
    (tmp_path / "checkpoint-20").mkdir()
    (tmp_path / "checkpoint-20" / "training_args.bin").write_bytes(args_file.read_bytes())
    (tmp_path / "checkpoint-10" / "rng_state.pth").write_bytes(b"never opened")
    (tmp_path / "hparams.yaml").write_text(lightning_hparams.read_text())
    files = [str(tmp_path / "hparams.yaml"), str(tmp_path / "checkpoint-10" / "rng_state.pth"),
             str(tmp_path / "checkpoint-20" / "training_args.bin")]
    meta = read_run_metadata(files)
    assert isinstance(meta, RunMetadata)
    assert meta.learning_rate == 5.0  # training_args.bin over hparams.yaml
    assert meta.settings["learning_rate"].source.endswith("training_args.bin")
    assert meta.logging_steps == 7 and meta.gradient_accumulation_steps == 4
    assert meta.text("precision") == "16-mixed"  # only hparams.yaml gives it
    assert meta.settings["precision"].source.endswith("hparams.yaml")
    assert [f.status for f in meta.files] == ["read", "listed", "read"]
    encoded = json.loads(json.dumps(encode(meta), allow_nan=False))
    assert encoded["settings"]["learning_rate"]["value"] == 5.0
    assert read_run_metadata([]) is None


@pytest.fixture(scope="module")
def diverging_trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real Hugging Face Trainer run configured with learning_rate=5.0 (AdamW): a small
    MLP whose gradient norm is sane at the first logged step, 5e16 at the second and
    infinite from the third on. TensorBoard events, checkpoints and their metadata, as saved."""
    import torch
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[torch.nn.Module] = []
            for _ in range(6):
                layers += [torch.nn.Linear(16, 16), torch.nn.ReLU()]
            self.body = torch.nn.Sequential(*layers, torch.nn.Linear(16, 1))

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            pred = self.body(x).squeeze(-1)
            return {"loss": torch.nn.functional.mse_loss(pred, labels), "logits": pred}

    class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return 512

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            x = torch.randn(16, generator=torch.Generator().manual_seed(i))
            return {"x": x, "labels": x.sum()}

    out = tmp_path_factory.mktemp("hf_lr5")
    args = TrainingArguments(output_dir=str(out), learning_rate=5.0, warmup_steps=0,
                             max_steps=40, logging_steps=1, save_steps=20,
                             per_device_train_batch_size=8, report_to=["tensorboard"],
                             use_cpu=True, disable_tqdm=True,
                             seed=0, remove_unused_columns=False, dataloader_num_workers=0)
    Trainer(model=MLP(), args=args, train_dataset=Data()).train()
    yield out


def test_regression_absurd_lr_in_training_args_beats_bad_initialisation(
        diverging_trainer_run: Path) -> None:
    """Before: the run's gradient norm, huge from the second logged step, made
    bad-initialisation the cause and learning-rate-too-high said nothing; the
    configured learning_rate=5.0 was never read."""
    from analyzer import pipeline

    before = snapshot(diverging_trainer_run)
    report = pipeline.analyze([str(diverging_trainer_run)], replay=False)
    assert snapshot(diverging_trainer_run) == before
    with_args = [r for r in report.results
                 if r.run.metadata is not None and r.run.metadata.learning_rate is not None]
    assert with_args, [r.run.name for r in report.results]
    for result in with_args:
        assert result.failed
        top = result.findings[0]
        assert top.name == "learning-rate-too-high" and top.confidence == "high"
        configured = [e for e in top.evidence if e.subject == "learning_rate"]
        assert configured and configured[0].value == 5.0
        assert configured[0].location is not None
        assert configured[0].location.file.endswith("training_args.bin")
        assert any(e.subject == "warmup" for e in top.evidence)
        names = [f.name for f in result.findings]
        if "bad-initialisation" in names:
            assert names.index("bad-initialisation") > 0
        encoded = json.loads(json.dumps(encode(result.run)))
        assert encoded["metadata"]["settings"]["learning_rate"]["value"] == 5.0
        assert "issues" not in encoded["metadata"]


def test_a_sane_configured_rate_is_not_a_cause(diverging_trainer_run: Path,
                                               tmp_path: Path) -> None:
    """The same diverging run with its arguments saying 5e-5 (the Trainer's default):
    the configured rate is no evidence, and learning-rate-too-high does not claim it."""
    import shutil

    import torch
    from transformers import TrainingArguments

    copy = tmp_path / "run"
    shutil.copytree(diverging_trainer_run, copy)
    for path in copy.rglob("training_args.bin"):
        torch.save(TrainingArguments(output_dir=str(copy), learning_rate=5e-5), path)
    from analyzer import pipeline

    report = pipeline.analyze([str(copy)], replay=False)
    for result in report.results:
        if result.run.metadata is None or result.run.metadata.learning_rate is None:
            continue
        for finding in result.findings:
            if finding.name == "learning-rate-too-high":
                assert finding.confidence != "high"
                assert not any(e.subject == "learning_rate" for e in finding.evidence)


def test_lightning_checkpoint_hyperparameters_join_the_run_metadata(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The corpus' Lightning run: hparams.yaml and its checkpoints' hyper_parameters
    (exposed by the checkpoint scan) on one RunMetadata, the latest save's first."""
    from analyzer import pipeline
    from tests.frameworks import corpus

    run = corpus.get("lightning_restart", tmp_path_factory)
    before = snapshot(run)
    report = pipeline.analyze([str(run)], replay=False)
    assert snapshot(run) == before
    metas = [r.run.metadata for r in report.results if r.run.metadata is not None]
    assert metas
    meta = metas[0]
    kinds = [f.kind for f in meta.files]
    assert "hparams" in kinds and "checkpoint_hparams" in kinds
    ckpt = [f for f in meta.files if f.kind == "checkpoint_hparams"]
    assert len(ckpt) == 1 and "version_1" in ckpt[0].path  # the latest save's
    assert meta.learning_rate is not None
    assert meta.settings["learning_rate"].source == ckpt[0].path


def test_hf_trainer_run_metadata_from_the_corpus(tmp_path_factory: pytest.TempPathFactory
                                                 ) -> None:
    """hf_nan: SGD at lr=30 with a warm-up of 4 steps. Its training_args.bin, config.json,
    trainer_state.json and scheduler.pt are read; the configured rate is evidence for
    learning-rate-too-high (30x SGD's ceiling), and not a cause by itself."""
    from analyzer import pipeline
    from tests.frameworks import corpus

    run = corpus.get("hf_nan", tmp_path_factory)
    report = pipeline.analyze([str(run)], replay=False)
    metas = [r for r in report.results if r.run.metadata is not None]
    assert len(metas) == 1
    result = metas[0]
    meta = result.run.metadata
    assert meta is not None
    assert meta.learning_rate == 30.0 and meta.text("optimizer") == "sgd"
    assert meta.number("warmup_steps") == 4 and meta.logging_steps == 1
    assert meta.text("model_type") == "gpt2"
    assert meta.integer("global_step") == 24  # the latest save's trainer_state.json
    assert {f.kind for f in meta.files} >= {"training_args", "model_config", "trainer_state",
                                            "scheduler", "rng_state", "generation_config"}
    assert all(f.status in ("read", "listed") for f in meta.files)
    lr_rule = [f for f in result.findings if f.name == "learning-rate-too-high"]
    assert lr_rule
    configured = [e for e in lr_rule[0].evidence if e.subject == "learning_rate"]
    assert configured and configured[0].ratio == pytest.approx(30.0)
    assert not any(e.subject == "warmup" for e in lr_rule[0].evidence)  # it has one


def test_healthy_hf_run_with_metadata_is_not_a_failure(tmp_path_factory: pytest.TempPathFactory
                                                       ) -> None:
    from analyzer import pipeline
    from tests.frameworks import corpus

    run = corpus.get("hf_healthy", tmp_path_factory)
    report = pipeline.analyze([str(run)], replay=False)
    assert any(r.run.metadata is not None for r in report.results)
    assert not any(r.failed for r in report.results)
    assert not any(i.location.file.endswith((".bin", ".json", ".pt", ".pth"))
                   for r in report.results for i in r.run.issues)


def test_regression_yaml_integer_of_thousands_of_digits_is_an_issue_not_a_traceback(
        tmp_path: Path) -> None:
    """Before: PyYAML's int() of a 5,000-digit scalar raised ValueError out of the reader."""
    path = tmp_path / "hparams.yaml"
    path.write_text("seed: " + "7" * 5000 + "\nlr: 0.1\n")
    got = read_hparams(str(path))
    assert [(i.kind, i.location.line) for i in got.issues] == [("bad_record", 1)]
    assert got.settings == {"learning_rate": ("lr", 0.1)}


def test_regression_pickled_integer_too_long_to_print_is_not_kept(tmp_path: Path) -> None:
    """Before: a 6,000-digit int in training_args.bin was kept as a field, and writing the
    JSON or text report then failed (Python refuses to turn it into text)."""
    path = tmp_path / "training_args.bin"
    _closed_zip_with_pickle(path, pickle.dumps({"learning_rate": 0.5, "seed": 10**6000},
                                               protocol=2))
    got = read_training_args(str(path))
    assert got.fields == {"learning_rate": 0.5}
    meta = read_run_metadata([str(path)])
    assert meta is not None
    json.dumps(encode(meta))
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "gpt2", "n_layer": ' + "1" * 5000 + "}")
    assert [i.kind for i in read_model_config(str(config)).issues] == ["bad_json"]


def test_accelerate_save_state_scheduler_read_and_rng_states_never_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Accelerate's save_state: scheduler.bin read (statically), random_states_0.pkl (a
    plain pickle) listed and never opened."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from analyzer.ingest import safeio
    from analyzer.ingest.discover import find_runs

    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True))
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=10)
    model, opt, sched = acc.prepare(model, opt, sched)
    for _ in range(3):
        acc.backward(model(torch.randn(2, 4)).sum())
        opt.step()
        sched.step()
        opt.zero_grad()
    acc.save_state()
    (run,) = find_runs([str(tmp_path)])
    opened: list[str] = []
    real_open = safeio.open_regular

    def spy(path: str) -> Any:
        opened.append(path)
        return real_open(path)

    monkeypatch.setattr(safeio, "open_regular", spy)
    import analyzer.ingest.ckpt.ranges as ranges

    monkeypatch.setattr(ranges, "open_regular", spy)
    meta = read_run_metadata(run.metadata_files)
    assert meta is not None
    by_kind = {f.kind: f for f in meta.files}
    assert by_kind["rng_state"].framework == "accelerate"
    assert by_kind["rng_state"].status == "listed"
    assert by_kind["scheduler"].fields["base_lr"] == pytest.approx(2e-3)
    assert meta.settings["learning_rate"].key == "base_lrs"
    assert opened and not any("random_states" in p for p in opened)


def test_regression_scheduled_learning_rate_is_not_called_steady(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """hf_nan warms up to 30 and decays linearly. Before: the evidence said "learning rate
    1.5, steady until the failure", the rate logged at the last step, 15 steps after the
    failure. Now the rate at the failure, and the range it moved in before."""
    from analyzer import pipeline
    from tests.frameworks import corpus

    run = corpus.get("hf_nan", tmp_path_factory)
    report = pipeline.analyze([str(run)], replay=False)
    result = next(r for r in report.results if r.failed)
    inc = result.incident
    assert inc is not None
    said = [e for f in result.findings if f.name == "learning-rate-too-high"
            for e in f.evidence if e.subject == "lr"]
    assert said and "steady" not in said[0].text
    assert said[0].step is not None and said[0].step <= inc.earliest_step
    assert said[0].value is not None and 1.5 < said[0].value < 30.0


def test_regression_cut_trainer_state_reported_once(tmp_path: Path, tmp_path_factory: pytest.
                                                    TempPathFactory) -> None:
    """Before: a trainer_state.json cut short gave two issues, the log reader's and the
    metadata reader's, for one damage."""
    from analyzer import pipeline
    from tests.frameworks import corpus

    source = corpus.get("hf_nan", tmp_path_factory) / "checkpoint-24" / "trainer_state.json"
    save = tmp_path / "run" / "checkpoint-24"
    save.mkdir(parents=True)
    (save / "trainer_state.json").write_bytes(source.read_bytes()[:3000])
    report = pipeline.analyze([str(tmp_path / "run")], replay=False)
    (result,) = report.results
    assert [i.location.file for i in result.run.issues] == [str(save / "trainer_state.json")]
    meta = result.run.metadata
    assert meta is not None and meta.files[0].status == "partial"
    assert meta.integer("global_step") == 24  # its top-level fields before the log history


def test_regression_absurd_configured_lr_does_not_override_a_replayed_bad_batch(
        tmp_path: Path, args_file: Path) -> None:
    """The nan_in_batch sample with a training_args.bin saying learning_rate=5.0 beside it.
    Before: learning-rate-too-high (high, score 1.0) ranked above nan-in-batch, which the
    replay of the failing step proves."""
    import shutil

    from analyzer import pipeline
    from tests.conftest import SAMPLE_RUNS

    run = tmp_path / "nan_in_batch"
    shutil.copytree(os.path.join(SAMPLE_RUNS, "nan_in_batch"), run)
    shutil.copy(args_file, run / "training_args.bin")
    (result,) = pipeline.analyze([str(run)]).results
    assert result.replay is not None and result.replay.verdict.kind == "bad-input"
    assert result.findings[0].name == "nan-in-batch"
    lr = [f for f in result.findings if f.name == "learning-rate-too-high"]
    assert lr and lr[0].confidence == "medium"  # still said: the rate is wrong too
