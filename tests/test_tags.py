"""The tag vocabulary: every role on tag names real runs log, and one copy of its rules."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import analyzer
from analyzer import tags
from analyzer.ingest.tb import read_event_file
from analyzer.model import Run, Series
from analyzer.onset import locate
from analyzer.rules.evidence import RunEvidence
from analyzer.tags import TIE_ORDER, TagRole, is_validation, layer_from_tag, role, tie_rank
from app.views import tag_roles
from tests.conftest import only_event_file

ROOT = Path(__file__).resolve().parent.parent

ROLES = [
    # the sample runs (sample_runs/: their event files and logs)
    ("train/loss", TagRole.LOSS), ("loss", TagRole.LOSS), ("lm loss", TagRole.LOSS),
    ("train/grad_norm", TagRole.GRAD_NORM), ("grad_norm", TagRole.GRAD_NORM),
    ("grad_norm/fc1.weight", TagRole.LAYER_GRAD), ("grads/rnn.weight_hh_l0", TagRole.LAYER_GRAD),
    ("weight_norm/backbone.fc1.bias", TagRole.LAYER_WEIGHT),
    ("weights/conv1.weight", TagRole.LAYER_WEIGHT),
    ("amp/loss_scale", TagRole.LOSS_SCALE), ("loss_scale", TagRole.LOSS_SCALE),
    ("train/lr", TagRole.LEARNING_RATE), ("lr", TagRole.LEARNING_RATE),
    ("skipped_iterations", TagRole.OTHER), ("train_samples_per_second", TagRole.OTHER),
    # Lightning: self.log(..., on_step=True, on_epoch=True), LearningRateMonitor,
    # grad_norm() tracking, and the Lightning event files under tests' real fixtures
    ("train_loss_step", TagRole.LOSS), ("train_loss_epoch", TagRole.LOSS),
    ("RegLoss", TagRole.LOSS), ("val_loss", TagRole.LOSS), ("hp_metric", TagRole.OTHER),
    ("lr-Adam", TagRole.LEARNING_RATE), ("lr-AdamW/pg1", TagRole.LEARNING_RATE),
    ("lr-SGD-momentum", TagRole.OTHER),
    ("grad_2.0_norm/decoder.proj.weight", TagRole.LAYER_GRAD),
    ("grad_2.0_norm_total", TagRole.GRAD_NORM), ("epoch", TagRole.OTHER),
    # Hugging Face Trainer
    ("train/learning_rate", TagRole.LEARNING_RATE), ("learning_rate", TagRole.LEARNING_RATE),
    ("eval/loss", TagRole.LOSS), ("train/epoch", TagRole.OTHER),
    # fairseq, DeepSpeed, mmengine, detectron2 (tests/fixtures/logs)
    ("loss_rpn_cls", TagRole.LOSS), ("decode.loss_ce", TagRole.LOSS),
    ("Train/Samples/loss_scale", TagRole.LOSS_SCALE), ("base_lr", TagRole.LEARNING_RATE),
    ("wps", TagRole.OTHER), ("clip", TagRole.OTHER),
    # a PyTorch GradScaler's scale, logged by hand
    ("amp/grad_scale", TagRole.LOSS_SCALE), ("scaler/scale", TagRole.LOSS_SCALE),
    ("amp/scale", TagRole.LOSS_SCALE),
    # what the onset names incidents that come from log lines
    ("gradients", TagRole.GRAD_NORM), ("autograd:LogBackward0", TagRole.GRAD_NORM),
]


@pytest.mark.parametrize(("tag", "want"), ROLES)
def test_role(tag: str, want: TagRole) -> None:
    assert role(tag) is want


@pytest.mark.parametrize(("tag", "layer"), [
    ("grad_norm/encoder.layer.3.attn", "encoder.layer.3.attn"),
    ("grads/fc1.weight", "fc1"),
    ("weights/conv1/max", "conv1"),
    ("grad_norm/fc1.bias", "fc1"),
    ("weight_norm/rnn.weight_hh_l0", "rnn"),
    ("grad_2.0_norm/decoder.proj.weight", "decoder.proj"),
    ("train/loss", None),
    ("train/grad_norm", None),
    ("grad_norm/total", None),
    ("loss", None),
    ("lr-Adam", None),
])
def test_layer_from_tag(tag: str, layer: str | None) -> None:
    assert layer_from_tag(tag) == layer


def test_layer_from_tag_is_the_public_one() -> None:
    assert analyzer.layer_from_tag is tags.layer_from_tag


@pytest.mark.parametrize(("tag", "validation"), [
    ("val_loss", True), ("valid_nll_loss", True), ("eval/loss", True), ("test/acc1", True),
    ("avg/test/loss", True), ("valLoss", True), ("VAL_LOSS", True), ("validation/loss", True),
    ("train/loss", False), ("train_loss_step", False), ("train/value_loss", False),
    ("loss_interval", False), ("loss/latest", False), ("evaluation_time", True),
])
def test_is_validation(tag: str, validation: bool) -> None:
    assert is_validation(tag) is validation


def test_tie_order_is_loss_then_total_gradient_norm_then_per_layer_then_the_rest() -> None:
    assert TIE_ORDER == (TagRole.LOSS, TagRole.GRAD_NORM, TagRole.LAYER_GRAD)
    ranked = sorted(["lr", "grad_norm/fc1.weight", "acc", "train/grad_norm", "train/loss",
                     "loss_scale"], key=lambda t: (tie_rank(t), t))
    assert ranked == ["train/loss", "train/grad_norm", "grad_norm/fc1.weight", "acc", "loss_scale",
                      "lr"]


def test_roles_of_tags_as_the_writers_store_them(tmp_path: Path) -> None:
    """The names go through torch's SummaryWriter and tensorboardX unchanged, and the
    roles are those of the names written."""
    from torch.utils.tensorboard import SummaryWriter

    names = {t: want for t, want in ROLES if " " not in t and ":" not in t}
    writers = [SummaryWriter]
    try:
        import tensorboardX
        writers.append(tensorboardX.SummaryWriter)
    except ImportError:
        pass
    for k, make in enumerate(writers):
        folder = tmp_path / str(k)
        writer = make(str(folder))
        for tag in names:
            writer.add_scalar(tag, 1.0, 0)
        writer.close()
        read = read_event_file(only_event_file(str(folder)))
        assert {s.tag: role(s.tag) for s in read.series} == names


def _series(tag: str, values: list[float]) -> Series:
    n = len(values)
    return Series(tag=tag, steps=np.arange(n, dtype=np.int64),
                  values=np.asarray(values, dtype=np.float64), wall_times=np.zeros(n),
                  source="events", positions=np.arange(n, dtype=np.int64) * 40)


def _evidence(*series: Series) -> RunEvidence:
    return RunEvidence(locate(Run(path="r", name="r", files=("events",), series=series)))


def test_regression_grad_scale_is_the_loss_scale_not_the_gradient_norm() -> None:
    """A GradScaler's scale logged as ``train/grad_scale`` was the rules' total gradient
    norm (it outranked ``train/grad_norm`` by name) while the dashboard called it the loss
    scale."""
    ev = _evidence(_series("train/grad_norm", [1.0, 2.0, 3.0]),
                   _series("train/grad_scale", [65536.0, 32768.0, 16384.0]))
    assert ev.grad_norm is not None and ev.grad_norm.tag == "train/grad_norm"
    assert ev.loss_scale is not None and ev.loss_scale.tag == "train/grad_scale"
    assert tag_roles(["train/grad_scale"]).roles == {"train/grad_scale": TagRole.LOSS_SCALE}


def test_regression_value_loss_is_no_validation_tag() -> None:
    """``val`` anywhere in a name made it a validation tag: a PPO ``train/value_loss``, a
    ``loss_interval`` had no loss curve for the rules."""
    assert _evidence(_series("train/value_loss", [1.0, 2.0])).loss is not None
    assert _evidence(_series("val_loss", [1.0, 2.0])).loss is None


def test_regression_lightning_param_group_lr_is_a_learning_rate() -> None:
    """Lightning's LearningRateMonitor names one rate per parameter group ``lr-Adam/pg1``:
    only the last component was looked at, so the run had no learning rate."""
    ev = _evidence(_series("lr-Adam/pg1", [0.1, 0.1]))
    assert ev.lr is not None and ev.lr.tag == "lr-Adam/pg1"


def test_regression_lightning_momentum_is_no_learning_rate() -> None:
    """The same monitor logs a momentum as ``lr-SGD-momentum``: it was read as a rate."""
    assert _evidence(_series("lr-SGD-momentum", [0.9, 0.9])).lr is None


def test_dashboard_roles_are_the_vocabulary() -> None:
    got = tag_roles([t for t, _ in ROLES])
    assert dict(got.roles) == {t: r for t, r in ROLES if r is not TagRole.OTHER}
    assert got.layers["grad_norm/fc1.weight"] == "fc1"


def _sources() -> list[Path]:
    return sorted(p for folder in ("analyzer", "app") for p in (ROOT / folder).rglob("*.py"))


def _patterns() -> list[str]:
    """The sources of the vocabulary's regexes, and pieces of them a near copy keeps."""
    compiled = [v.pattern for v in vars(tags).values() if hasattr(v, "pattern")]
    return [*compiled, "learning[_ ]?rate", "weight_norms", "val|test|eval", "grad[_\\-]?scale"]


def _offences(rel: str, source: str) -> list[str]:
    """Where a module classifies tag names itself instead of asking analyzer.tags."""
    patterns = _patterns()
    found = []
    for node in ast.walk(ast.parse(source)):
        name = getattr(node, "id", None) or getattr(node, "attr", None) \
            or getattr(node, "name", None)
        if name == "tag_priority":
            found.append(f"{rel}:{node.lineno}: tag_priority")  # type: ignore[attr-defined]
        if rel == "analyzer/tags.py":
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [f"{rel}:{node.lineno}: {p!r}" for p in patterns if p in node.value]
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
                and node.left.value == "tfevents" and rel != "analyzer/ingest/tb.py"):
            found.append(f"{rel}:{node.lineno}: 'tfevents' in ... (use is_event_file)")
    return found


def test_no_other_module_holds_the_tag_vocabulary() -> None:
    """Tag names are classified in analyzer/tags.py only: a copied regex, the old numeric
    priority or an inline event-file test cannot come back."""
    found = []
    for path in _sources():
        found += _offences(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
    assert not found, found


def test_the_vocabulary_check_sees_a_copy() -> None:
    copy = (f"import re\n_LR = re.compile({tags._LR.pattern!r})\n"
            "def f(name):\n    return 'tfevents' in name or tag_priority(name) == 0\n")
    found = _offences("app/copy.py", copy)
    assert {f.split(": ", 1)[0] for f in found} == {"app/copy.py:2", "app/copy.py:4"}, found
    assert any("is_event_file" in f for f in found) and any("tag_priority" in f for f in found)
    assert _offences("analyzer/tags.py", copy) == ["analyzer/tags.py:4: tag_priority"]
