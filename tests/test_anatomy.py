"""The anatomy (analyzer/rules/anatomy.py) from what real frameworks write about a model:
Lightning's model summary, a printed module, a Hugging Face config.json, and the names of
tags and checkpoint tensors. Every fixture comes from the real writer (torch's repr,
Lightning's summary callbacks, transformers' save_pretrained, torch.save)."""

from __future__ import annotations

import functools
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from analyzer.api import analyze
from analyzer.ingest.logs import read_log
from analyzer.model import RunResult
from analyzer.rules.anatomy import Anatomy, anatomy, class_kinds, kinds_of
from tests.frameworks import corpus
from tests.fuzz.budget import fuzz_settings
from tests.test_logs_safety import snapshot

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

STEPS = [f"step {i} loss {v}" for i, v in enumerate([1.0, 0.9, 0.8, "nan"])]


class Mixed(nn.Module):
    """A module of every kind, one normalisation with eps 0, and a Linear called norm."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 16)
        self.ln = nn.LayerNorm(16, eps=0.0)
        self.attn = nn.MultiheadAttention(16, 2)
        self.rnn = nn.LSTM(16, 16, batch_first=True)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv = nn.Conv2d(1, 4, 3)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(16, 2, 32) for _ in range(2)])
        self.norm = nn.Linear(16, 16)


def _run(folder: Path) -> RunResult:
    results = analyze([str(folder)]).results
    assert len(results) == 1
    return results[0]


def _anatomy(folder: Path) -> Anatomy:
    return anatomy(_run(folder))


def _write_log(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "train.log"
    log.write_text("\n".join(lines) + "\n")
    return log


def _line_of(log: Path, text: str) -> int:
    return next(i for i, line in enumerate(log.read_text().splitlines(), 1) if text in line)


def test_a_printed_module_names_classes_epsilons_and_lines(tmp_path: Path) -> None:
    log = _write_log(tmp_path / "run", [STEPS[0], repr(Mixed()), *STEPS[1:]])
    before = snapshot(tmp_path / "run")
    a = _anatomy(tmp_path / "run")
    assert snapshot(tmp_path / "run") == before
    assert a.kinds() == ("attention", "normalisation", "recurrent", "convolution", "embedding")
    (zero,) = a.eps_zero()
    assert (zero.name, zero.module_class, zero.eps, zero.detail) == ("ln", "LayerNorm", 0.0,
                                                                     "LayerNorm, eps=0")
    assert zero.source == f"log train.log:{_line_of(log, '(ln): LayerNorm')}"
    bn = next(c for c in a.of("normalisation") if c.name == "bn1")
    assert bn.eps == 1e-05 and bn.module_class == "BatchNorm2d"
    # The collapsed repeats of a ModuleList keep their range in the name.
    assert {c.name for c in a.of("attention")} == {"attn", "layers.0-1.self_attn"}
    assert [c.name for c in a.of("recurrent")] == ["rnn"]


def test_regression_a_linear_called_norm_is_no_normalisation(tmp_path: Path) -> None:
    """The checkpoint's ``norm.weight`` made ``norm`` a normalisation by its name alone;
    the printed model says it is a Linear, and the class decides."""
    folder = tmp_path / "run"
    _write_log(folder, [repr(Mixed()), *STEPS])
    torch.save(Mixed().state_dict(), folder / "model.pt")
    a = _anatomy(folder)
    assert "norm" not in {c.name for c in a.of("normalisation")}
    # Modules the class confirms are the description's, not listed again by name.
    assert [c.name for c in a.of("normalisation")] == ["ln", "bn1", "layers.0-1.norm1",
                                                       "layers.0-1.norm2"]
    # Without the description the name is all there is, and it stands.
    bare = tmp_path / "bare"
    _write_log(bare, STEPS)
    torch.save(Mixed().state_dict(), bare / "model.pt")
    names = {c.name: c.source for c in _anatomy(bare).of("normalisation")}
    assert names["norm"] == "checkpoint model.pt"


def test_a_rank_prefixed_print_is_read_per_rank(tmp_path: Path) -> None:
    text = repr(nn.Sequential(nn.Linear(2, 2), nn.GroupNorm(1, 2, eps=0.0)))
    lines = [f"[rank{r}]:{line}" for line in text.splitlines() for r in (0, 1)]
    log = _write_log(tmp_path, lines)
    described = [e for e in read_log(str(log)).events if e.kind == "model_description"]
    assert [e.detail["modules"][1]["eps"] for e in described] == [0.0, 0.0]
    assert sorted(e.detail.get("rank") for e in described) == [0, 1]


class _Tiny:
    """A LightningModule with a Linear called norm, a LayerNorm of eps 0 and a GRU."""

    @staticmethod
    def make() -> Any:
        import lightning.pytorch as pl

        class Tiny(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.norm = nn.Linear(4, 4)
                self.block = nn.Sequential(nn.LayerNorm(4, eps=0.0), nn.GRU(4, 4))
                self.head = nn.Linear(4, 1)

            def training_step(self, batch: Any, index: int) -> torch.Tensor:
                x, y = batch
                out, _ = self.block[1](self.block[0](self.norm(x)))
                return nn.functional.mse_loss(self.head(out), y)

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Tiny()


def _fit_with_summary(folder: Path) -> Path:
    """A real two-step fit with Lightning's plain ModelSummary (every depth), its logger's
    output in train.log as a console would show it."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelSummary

    folder.mkdir(parents=True)
    log = folder / "train.log"
    handler = logging.FileHandler(log)
    handler.setFormatter(logging.Formatter("%(message)s"))
    summary_logger = logging.getLogger("lightning.pytorch.callbacks.model_summary")
    summary_logger.addHandler(handler)
    try:
        torch.manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
        trainer = pl.Trainer(max_steps=2, callbacks=[ModelSummary(max_depth=-1)],
                             enable_progress_bar=False, logger=False, accelerator="cpu",
                             enable_checkpointing=False, default_root_dir=str(folder / "pl"))
        module = _Tiny.make()
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    finally:
        summary_logger.removeHandler(handler)
        handler.close()
    with log.open("a") as out:
        out.write("\n".join(STEPS) + "\n")
    torch.save(module.state_dict(), folder / "model.pt")
    return log


def test_lightning_plain_summary_of_a_real_fit(tmp_path: Path) -> None:
    log = _fit_with_summary(tmp_path / "run")
    assert "| Name" in log.read_text()  # the plain table, not rich's box
    a = _anatomy(tmp_path / "run")
    assert [(c.kind, c.name, c.module_class) for c in a.components] == [
        ("normalisation", "block.0", "LayerNorm"), ("recurrent", "block.1", "GRU")]
    assert a.components[0].source == f"log train.log:{_line_of(log, '| block.0')}"
    # Lightning's table gives no eps: nothing says it is 0.
    assert a.eps_zero() == ()


def test_lightning_rich_summary_from_the_corpus(tmp_path_factory: pytest.TempPathFactory
                                                ) -> None:
    """The corpus' Lightning runs print RichModelSummary's box (rich is installed): one
    ``net`` of class Sequential, which shows no kind; their linear layers show none either."""
    run = corpus.get("lightning_nan", tmp_path_factory)
    described = [e for e in read_log(str(run / "train.log")).events
                 if e.kind == "model_description"]
    assert [(m["name"], m["class"], m["leaf"]) for e in described
            for m in e.detail["modules"]] == [("net", "Sequential", False)]
    assert _anatomy(run).components == ()


def test_hf_config_from_the_corpus(tmp_path_factory: pytest.TempPathFactory) -> None:
    a = _anatomy(corpus.get("hf_nan", tmp_path_factory))
    config = [c for c in a.components if c.source.startswith("config ")]
    assert [(c.kind, c.name, c.detail) for c in config] == [
        ("attention", "n_head", "n_head=2"),
        ("normalisation", "layer_norm_epsilon", "eps=1e-05"),
        ("embedding", "vocab_size", "vocab_size=32")]
    assert all(re.fullmatch(r"config checkpoint-\d+/config\.json", c.source) for c in config)
    assert a.eps_zero() == ()


@pytest.mark.parametrize("make, key", [
    (lambda: __import__("transformers").GPT2Config(n_layer=1, n_embd=16, n_head=2,
                                                   layer_norm_epsilon=0.0), "layer_norm_epsilon"),
    (lambda: __import__("transformers").LlamaConfig(
        hidden_size=16, num_attention_heads=2, num_hidden_layers=1, intermediate_size=32,
        rms_norm_eps=0.0), "rms_norm_eps"),
    (lambda: __import__("transformers").PretrainedConfig(norm_eps=0.0), "norm_eps"),
])
def test_a_config_epsilon_of_zero_is_evidence(tmp_path: Path, make: Any, key: str) -> None:
    folder = tmp_path / "run"
    _write_log(folder, STEPS)
    make().save_pretrained(str(folder))
    zero = _anatomy(folder).eps_zero()
    assert [(c.name, c.detail, c.eps) for c in zero] == [(key, "eps=0", 0.0)]
    assert zero[0].source == "config config.json"


def test_attention_from_the_model_type_alone(tmp_path: Path) -> None:
    import transformers

    folder = tmp_path / "run"
    _write_log(folder, STEPS)
    transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(str(folder))
    config = folder / "config.json"
    text = config.read_text().replace('"n_head": 2,', "")
    config.write_text(text)
    (att,) = _anatomy(folder).of("attention")
    assert att.detail == "model_type=gpt2 (a transformers model)"


def test_class_names_give_kinds() -> None:
    assert class_kinds("LayerNorm") == ("normalisation",)
    assert class_kinds("LlamaRMSNorm") == ("normalisation",)
    assert class_kinds("FrozenBatchNorm2d") == ("normalisation",)
    assert class_kinds("GPT2Attention") == ("attention",)
    assert class_kinds("MultiheadAttention") == ("attention",)
    assert class_kinds("LSTM") == ("recurrent",)
    assert class_kinds("ConvTranspose2d") == ("convolution",)
    assert class_kinds("Conv1D") == ()  # transformers' linear layer
    assert class_kinds("Linear") == () and class_kinds("GeneralizedRCNN") == ()
    assert kinds_of("encoder.norm1.weight") == ("normalisation",)


def _described(text: str, tmp_path: Path) -> list[Any]:
    log = tmp_path / "t.log"
    log.write_text(text)
    return [e for e in read_log(str(log)).events if e.kind == "model_description"]


def test_a_cut_or_garbled_description_yields_nothing(tmp_path: Path) -> None:
    lines = repr(Mixed()).splitlines()
    assert len(_described("\n".join(lines) + "\n", tmp_path)) == 1
    assert _described("\n".join(lines[:-1]) + "\n", tmp_path) == []  # cut before its ")"
    garbled = [*lines[:3], "   " + lines[3], *lines[4:]]  # one module indented wrong
    assert _described("\n".join(garbled) + "\n", tmp_path) == []
    gap = [*lines[:3], *["x"] * 20, *lines[3:]]
    assert _described("\n".join(gap) + "\n", tmp_path) == []


def test_a_truncated_lightning_table_yields_nothing(tmp_path: Path) -> None:
    from lightning.pytorch.utilities.model_summary import summarize

    table = str(summarize(_Tiny.make(), max_depth=-1)).splitlines()
    assert len(_described("\n".join(table) + "\n", tmp_path)) == 1
    closing = max(i for i, line in enumerate(table) if line.startswith("---"))
    assert _described("\n".join(table[:closing]) + "\n", tmp_path) == []
    bad_row = [*table[:3], table[3].replace(" | ", " ", 1), *table[4:]]
    assert _described("\n".join(bad_row) + "\n", tmp_path) == []


def test_regression_a_model_printed_before_the_first_record_keeps_the_logs_series(
    tmp_path: Path,
) -> None:
    """A step-less event at the top of a log whose records are on their own numbering made
    the run's global series empty: the event's axis looked placed, the records' did not."""
    records = [f"{{'loss': {v}, 'grad_norm': 1.0, 'learning_rate': 0.001, 'epoch': {i / 10}}}"
               for i, v in enumerate([1.0, 0.9, 0.8, "nan"])]
    _write_log(tmp_path, [repr(nn.Sequential(nn.Linear(2, 2))), *records])
    run = _run(tmp_path).run
    assert any(e.kind == "model_description" for e in run.events)
    assert {s.tag for s in run.global_series} >= {"loss", "grad_norm"}


@functools.cache
def _source() -> bytes:
    from lightning.pytorch.utilities.model_summary import summarize

    table = str(summarize(_Tiny.make(), max_depth=-1)).splitlines()
    return "\n".join([STEPS[0], repr(Mixed()), *table, *STEPS[1:]]).encode()


@fuzz_settings(150)
@given(cut=st.floats(0, 1), flips=st.lists(
    st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=4))
def test_fuzz_damaged_descriptions_never_raise(tmp_path: Path, cut: float,
                                               flips: list[tuple[float, int]]) -> None:
    source = _source()
    data = bytearray(source[:int(cut * len(source))])
    for at, byte in flips:
        if data:
            data[int(at * (len(data) - 1))] = byte
    log = tmp_path / "f.log"
    log.write_bytes(bytes(data))
    for e in read_log(str(log)).events:
        if e.kind == "model_description":
            assert all(isinstance(m["name"], str) and m["name"] for m in e.detail["modules"])


def test_a_description_cut_by_another_keeps_only_the_second(tmp_path: Path) -> None:
    first = repr(Mixed()).splitlines()[:4]  # printed, then cut by a restart
    second = repr(nn.Sequential(nn.BatchNorm1d(3, eps=0.0)))
    (event,) = _described("\n".join([*first, second]) + "\n", tmp_path)
    assert [(m["name"], m["class"]) for m in event.detail["modules"]] == [("0", "BatchNorm1d")]


def test_a_class_rich_cut_short_is_no_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """RichModelSummary on a narrow console crops cells (``Multihea…``): a cut class would
    show no kind and rule out the name; such rows are left out, the whole ones kept."""
    import io

    import lightning.pytorch as pl
    import rich
    from lightning.pytorch.callbacks import RichModelSummary
    from lightning.pytorch.utilities.model_summary import summarize
    from rich.console import Console

    class Wide(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.attention_block_with_long_name = nn.MultiheadAttention(4, 2)
            self.norm = nn.LayerNorm(4, eps=0.0)

    out = io.StringIO()
    monkeypatch.setattr(rich, "_console", Console(file=out, width=84))
    s = summarize(Wide(), max_depth=-1)
    RichModelSummary.summarize(s._get_summary_data(), s.total_parameters,
                               s.trainable_parameters, s.model_size, s.total_training_modes, 0)
    assert "Multihea…" in out.getvalue()
    (event,) = _described(out.getvalue(), tmp_path)
    assert [(m["name"], m["class"]) for m in event.detail["modules"]] == [("norm", "LayerNorm")]


def test_a_repr_after_a_logging_header_is_read(tmp_path: Path) -> None:
    """fairseq logs the model with ``logger.info(model)``: its first line after the
    logging header, the rest bare; detectron2 logs ``Model:`` and the repr under it."""
    lines = repr(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2, eps=0.0))).splitlines()
    text = "\n".join([f"2024-01-01 10:00:00 | INFO | fairseq_cli.train | {lines[0]}",
                      *lines[1:], "[01/01 10:00:00 d2.engine.defaults]: Model:", *lines])
    events = _described(text + "\n", tmp_path)
    assert [[(m["class"], m.get("eps")) for m in e.detail["modules"]] for e in events] == [
        [("Linear", None), ("LayerNorm", 0.0)]] * 2


def test_a_lone_value_head_is_no_attention_but_paired_projections_are() -> None:
    from analyzer.rules.anatomy import _paired_projections, kinds_of

    assert kinds_of("critic.value.weight") == ()  # an actor-critic's value head
    found = list(_paired_projections([("blocks.0.mix.query.weight", "tag q", ""),
                                      ("blocks.0.mix.key.weight", "tag k", ""),
                                      ("critic.value.weight", "tag v", "")]))
    assert [(c.kind, c.name) for c in found] == [("attention", "blocks.0.mix")]
