"""The flight recorder in a real Hugging Face Trainer (analyzer.capture.hf), end to end.

Each test trains a tiny model built from its config on the CPU until it really fails,
then ``analyze`` on ``output_dir``, with no flag, must replay the captured step and name
the layer and the op that made the first non-finite value.

The library model is a one-layer Llama with ``rms_norm_eps=0``: its padding token's
embedding row is zero from initialisation on and never trained (``padding_idx``), so the
first RMSNorm of a padded position computes rsqrt(0) = inf, and the loss is NaN at the
first step whose batch holds padding. Rows are taken in order, so which step that is is
known.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch

from tests.conftest import ROOT
from tests.readonly import snapshot

ROWS, LENGTH, VOCAB = 16, 8, 32
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_DISABLED": "true"}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


def tiny_llama() -> Any:
    """A one-layer Llama whose RMSNorm has eps 0: a zero row (the padding token's
    embedding) gives rsqrt(0)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
        rms_norm_eps=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2))


def _rows(padded: int | None) -> list[dict[str, torch.Tensor]]:
    """Token rows with no padding but row ``padded``, whose last three tokens are padding."""
    ids = torch.randint(3, VOCAB, (ROWS, LENGTH), generator=torch.Generator().manual_seed(0))
    if padded is not None:
        ids[padded, LENGTH - 3:] = 0
    return [{"input_ids": r, "attention_mask": (r != 0).long(),
             "labels": torch.where(r == 0, -100, r)} for r in ids]


def _args(out: Path, **overrides: Any) -> Any:
    from transformers import TrainingArguments

    options: dict[str, Any] = {
        "output_dir": str(out), "max_steps": 5, "per_device_train_batch_size": 4,
        "use_cpu": True, "seed": 0, "report_to": ["tensorboard"], "logging_steps": 1,
        "save_strategy": "no", "train_sampling_strategy": "sequential",
        "disable_tqdm": True, "dataloader_num_workers": 0}
    return TrainingArguments(**(options | overrides))


def _train_llama(out: Path, padded: int, eval_dataset: Any = None, **overrides: Any) -> Any:
    from analyzer.capture.hf import FlightRecorderTrainer

    trainer = FlightRecorderTrainer(model=tiny_llama(), args=_args(out, **overrides),
                                    train_dataset=_rows(padded), eval_dataset=eval_dataset)
    trainer.train()
    return trainer


def _meta(out: Path, step: int) -> dict[str, Any]:
    assert sorted(os.listdir(out / "capture")) == [f"step_{step}"]
    loaded: dict[str, Any] = json.loads((out / "capture" / f"step_{step}" / "meta.json")
                                        .read_text(encoding="utf-8"))
    return loaded


def _replayed(out: Path) -> Any:
    """analyze with no flag: the replay, checking nothing was written into ``out``."""
    from analyzer.api import analyze

    before = snapshot(out)
    results = analyze(str(out)).results
    assert snapshot(out) == before
    # The training folder is the run the capture belongs to (its runs/<date>_<host>/ of
    # event files may be listed beside it until discovery joins them).
    (result,) = [r for r in results if os.path.samefile(r.run.path, out)]
    assert result.replay is not None, result.replay_error
    return result.replay


def _assert_rmsnorm_of_the_padding(replay: Any) -> None:
    assert replay.forward.producer is not None
    assert replay.forward.producer.name == "model.layers.0.input_layernorm"
    assert replay.forward_op is not None and replay.forward_op.op.startswith("rsqrt")
    assert replay.forward_op.module == "model.layers.0.input_layernorm"


def test_a_library_model_is_captured_by_its_class_and_config_and_replays(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Rows 12..15 are the Trainer's optimizer step 4 (it counts from 1). Evaluating after
    # every step calls compute_loss too: those batches are not the training step's.
    trainer = _train_llama(out, padded=13, eval_dataset=_rows(None)[:4],
                           eval_strategy="steps", eval_steps=1)
    assert trainer.flight_recorder.capture_path == str(out / "capture" / "step_4")
    meta = _meta(out, 4)
    assert meta["step"] == 4 and meta["trigger"]["what"] == "loss"
    # The step the Trainer logs the failure at (its log_history, its tensorboard events).
    logged = [h["step"] for h in trainer.state.log_history if "grad_norm" in h
              and h["grad_norm"] != h["grad_norm"]]
    assert logged[0] == 4
    assert meta["accumulation"]["micro_batches"] == 1
    assert meta["model"]["factory"] == "transformers:LlamaForCausalLM"
    assert meta["step_call"]["kind"] == "model_loss"
    assert meta["grad_clip"] == 1.0  # the Trainer's max_grad_norm
    assert meta["optimizer"]["class"] == "torch.optim.AdamW"
    # The Trainer's two groups (weight decay or not) are not in the model's order.
    assert len(meta["optimizers"][0]["params"]) == 2
    _assert_rmsnorm_of_the_padding(_replayed(out))


def test_bf16_autocast_is_recorded_and_replayed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _train_llama(out, padded=9, bf16=True)  # rows 8..11: step 3
    meta = _meta(out, 3)
    assert meta["amp"]["autocast_dtype"] == "bfloat16"
    assert meta["amp"]["grad_scaler"] is False
    replay = _replayed(out)
    assert replay.autocast == "bfloat16"
    _assert_rmsnorm_of_the_padding(replay)


def test_gradient_accumulation_records_the_micro_batches_of_the_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # 2 rows a micro-batch, 2 micro-batches a step: row 14 is step 4's second micro-batch.
    _train_llama(out, padded=14, per_device_train_batch_size=2,
                 gradient_accumulation_steps=2)
    meta = _meta(out, 4)
    accumulation = meta["accumulation"]
    assert accumulation["micro_batches"] == 2 and accumulation["failing"] == 1
    # Llama takes num_items_in_batch: the Trainer does not divide its loss again.
    assert accumulation["divide"] is False
    _assert_rmsnorm_of_the_padding(_replayed(out))


def test_a_step_that_raised_is_captured(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Anomaly mode raises in the backward pass of step 2, which never reaches the
    # optimizer step (nor on_optimizer_step): the exception ends the recorded step.
    with torch.autograd.detect_anomaly(), pytest.raises(RuntimeError, match="nan"):
        _train_llama(out, padded=5)
    meta = _meta(out, 2)
    assert meta["step"] == 2
    _assert_rmsnorm_of_the_padding(_replayed(out))


def test_a_resumed_run_is_captured_at_the_trainers_global_step(tmp_path: Path) -> None:
    from analyzer.capture.hf import FlightRecorderTrainer

    out = tmp_path / "out"
    # 4 steps an epoch; the first training saves checkpoint-4 and stops, healthy.
    FlightRecorderTrainer(model=tiny_llama(), args=_args(out, max_steps=4, save_strategy="steps",
                                                     save_steps=4),
                          train_dataset=_rows(None)).train()
    assert not (out / "capture").exists()
    # Resumed after step 4 (epoch 1) on rows of which row 5 is padded: step 6 fails.
    resumed = FlightRecorderTrainer(model=tiny_llama(), args=_args(out, max_steps=7),
                                    train_dataset=_rows(5))
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    meta = _meta(out, 6)
    assert meta["step"] == 6 and meta["state_step"] == 6
    _assert_rmsnorm_of_the_padding(_replayed(out))


def test_every_n_keeps_the_steps_since_the_last_copy(tmp_path: Path) -> None:
    from analyzer.capture.hf import FlightRecorderTrainer

    out = tmp_path / "out"
    trainer = FlightRecorderTrainer(model=tiny_llama(), args=_args(out), train_dataset=_rows(13),
                                    flight_recorder={"every_n": 2})
    trainer.train()
    meta = _meta(out, 4)  # copies at steps 1 and 3
    assert meta["mode"] == "every_n" and meta["state_step"] == 3
    assert meta["history_steps"] == [3]
    replay = _replayed(out)
    assert any("replayed steps 3..3 first" in n for n in replay.notes)
    _assert_rmsnorm_of_the_padding(replay)


def test_a_model_defined_in_the_training_script_replays(tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = os.path.join(ROOT, "tests", "integrations", "hf_train.py")
    env = os.environ | OFFLINE | {"PYTHONPATH": ROOT}  # FORENSICS_CONFIG_DIR passes on
    done = subprocess.run([sys.executable, script, str(out)], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = _meta(out, 4)
    assert meta["model"]["factory"] == "__main__:TinyLM"
    assert meta["step_call"]["kind"] == "model_loss"
    replay = _replayed(out)
    assert replay.forward_op is not None and replay.forward_op.op.startswith("_softmax")
    assert replay.forward_op.module == "attn"


def test_a_trainer_with_a_loss_of_its_own_stops_in_its_first_step(tmp_path: Path) -> None:
    from analyzer.capture.hf import HFSetupError

    def smoothed(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
        return outputs.logits.mean()

    from analyzer.capture.hf import FlightRecorderTrainer

    trainer = FlightRecorderTrainer(model=tiny_llama(), args=_args(tmp_path / "out"),
                                    train_dataset=_rows(13), compute_loss_func=smoothed)
    for _ in range(2):  # and again when train() is called again
        with pytest.raises(HFSetupError, match="compute_loss_func"):
            trainer.train()
    assert trainer.state.global_step == 0


STEP_MODULE = """
import torch


def smoothed_step():
    def step(model, batch):
        batch = dict(batch)
        labels = batch.pop("labels")
        batch.pop("num_items_in_batch", None)
        logits = model(**batch).logits[:, :-1]
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels[:, 1:].flatten(), label_smoothing=0.1)
    return step
"""


def _smoothing_trainer() -> type:
    from transformers import Trainer

    class Smoothing(Trainer):
        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            inputs = dict(inputs)
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            loss = torch.nn.functional.cross_entropy(
                outputs.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                label_smoothing=0.1)
            return (loss, outputs) if return_outputs else loss

    return Smoothing


def test_a_compute_loss_of_its_own_needs_a_step_factory_and_replays_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from analyzer.capture.hf import HFSetupError, with_flight_recorder

    cls = with_flight_recorder(_smoothing_trainer())
    bare = cls(model=tiny_llama(), args=_args(tmp_path / "bare"), train_dataset=_rows(13))
    with pytest.raises(HFSetupError, match=r"Smoothing\.compute_loss"):
        bare.train()
    assert bare.state.global_step == 0
    code = tmp_path / "code"
    code.mkdir()
    (code / "lm_steps.py").write_text(STEP_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(code))
    out = tmp_path / "out"
    trainer = cls(model=tiny_llama(), args=_args(out), train_dataset=_rows(13),
                  flight_recorder={"step_factory": "lm_steps:smoothed_step"})
    trainer.train()
    meta = _meta(out, 4)
    assert meta["step_call"]["kind"] == "step_fn"
    assert meta["step_call"]["factory"]["factory"] == "lm_steps:smoothed_step"
    _assert_rmsnorm_of_the_padding(_replayed(out))


def test_only_the_main_process_records(tmp_path: Path) -> None:
    from analyzer.capture.hf import FlightRecorderTrainer

    out = tmp_path / "out"
    trainer = FlightRecorderTrainer(model=tiny_llama(), args=_args(out), train_dataset=_rows(13))
    # What TrainingArguments.process_index says on a second process of a distributed run.
    trainer.is_world_process_zero = lambda: False
    trainer.train()
    assert trainer.flight_recorder is None
    assert not (out / "capture").exists() and not (out / "env.json").exists()


def test_options_that_are_not_the_recorders_are_refused_with_the_trainer(
        tmp_path: Path) -> None:
    from analyzer.capture.hf import FlightRecorderTrainer, HFSetupError

    for options, word in (({"nonsense": 1}, "nonsense"), ({"run_dir": "x"}, "run_dir")):
        with pytest.raises(HFSetupError, match=word):
            FlightRecorderTrainer(model=tiny_llama(), args=_args(tmp_path / "out"),
                                  flight_recorder=options)


def test_with_flight_recorder_keeps_the_trainer_subclass(tmp_path: Path) -> None:
    from transformers import Trainer

    from analyzer.capture.hf import FlightRecorderTrainer, with_flight_recorder

    class Mine(Trainer):
        pass

    wrapped = with_flight_recorder(Mine)
    assert issubclass(wrapped, Mine) and wrapped is with_flight_recorder(Mine)
    assert with_flight_recorder(wrapped) is wrapped
    assert issubclass(FlightRecorderTrainer, Trainer)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 in the Trainer needs CUDA")
def test_fp16_with_the_trainers_grad_scaler(tmp_path: Path) -> None:
    out = tmp_path / "out"
    trainer = _train_llama(out, padded=9, fp16=True, use_cpu=False)
    assert trainer.accelerator.scaler is not None
    meta = _meta(out, 3)
    assert meta["amp"]["autocast_dtype"] == "float16" and meta["amp"]["grad_scaler"] is True
    _assert_rmsnorm_of_the_padding(_replayed(out))


def test_importing_the_module_does_not_import_transformers() -> None:
    code = ("import sys, analyzer.capture.hf as hf; "
            "assert 'transformers' not in sys.modules and 'torch' not in sys.modules; "
            "hf.FlightRecorderTrainer; assert 'transformers' in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
