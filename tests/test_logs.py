"""Text-log ingest: one fixture per framework, written in that framework's own format."""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from analyzer.ingest.logs import LogRead, is_log_file, read_log, sniff_framework

FIXTURES = Path(__file__).parent / "fixtures" / "logs"


@dataclass(frozen=True)
class First:
    """The first non-finite report of a log: a point or a ``nonfinite`` event."""

    line: int
    step: int | None
    tag: str
    rank: int | None = None


def first_nonfinite(read: LogRead) -> First | None:
    found: list[First] = []
    for s in read.series:
        for step, value, line in zip(s.steps, s.values, s.positions, strict=True):
            if not math.isfinite(float(value)):
                found.append(First(int(line), int(step), s.tag, s.rank))
                break
    for e in read.events:
        if e.kind == "nonfinite":
            assert e.location.line is not None
            rank = e.detail.get("rank")
            found.append(
                First(e.location.line, e.step, str(e.detail["tag"]), rank)  # type: ignore[arg-type]
            )
    # Same line: prefer the numeric point, then the tag name, for a stable answer.
    return min(found, key=lambda f: (f.line, f.step is None, f.tag), default=None)


def kinds(read: LogRead, kind: str) -> list[int | None]:
    return [e.step for e in read.events if e.kind == kind]


FAILING = [
    ("hf_trainer_nan_filter.log", "transformers", First(9, 40, "grad_norm")),
    ("hf_state/trainer_state.json", "transformers", First(27, 30, "grad_norm")),
    ("lightning_nan.log", "lightning", First(11, 5, "loss")),
    ("megatron_nan.log", "megatron", First(7, 40, "lm loss")),
    ("detectron2_fpe.log", "detectron2", First(11, 66, "total_loss")),
    ("mmengine_nan.log", "mmengine", First(4, 150, "grad_norm")),
    ("mmcv_nan.log", "mmengine", First(2, 100, "grad_norm")),
    ("fairseq_json.log", "fairseq", First(5, 200, "grad_norm")),
    ("fairseq_simple.log", "fairseq", First(4, 200, "grad_norm")),
    ("keras2_glued_epoch.log", "keras", First(4, 2487, "loss")),
    ("keras3_terminate_on_nan.log", "keras", First(5, 2288, "loss")),
    ("tf_estimator_diverged.log", "tensorflow", First(9, None, "loss")),
    ("nanogpt_nan.log", "nanogpt", First(9, 30, "loss")),
    ("yolov5_nan.log", "yolo", First(9, 155, "box_loss")),
    ("autograd_anomaly.err", "pytorch", First(19, None, "autograd:LogBackward0")),
    ("detr_loss_stop.log", "metric_logger", First(6, None, "loss")),
    ("torchvision_classification_nan.log", "metric_logger", First(12, 30, "loss")),
    ("hf_deepspeed.log", "transformers+deepspeed", First(27, 100, "grad_norm")),
    ("timm_nan.log", "timm", First(29, 462, "loss")),
    ("imagenet_example_nan.log", "progress_meter", First(14, 60, "loss")),
    ("generic_loop.txt", "generic", First(6, 400, "loss")),
    ("torchrun_ranks.log", "generic", First(5, 30, "grad_norm", rank=1)),
]

HEALTHY = [
    ("hf_trainer_healthy.log", "transformers"),
    ("lightning_healthy.log", "lightning"),
    ("megatron_healthy.log", "megatron"),
    ("detectron2_healthy.log", "detectron2"),
    ("mmengine_iter_healthy.log", "mmengine"),
    ("deit_healthy.log", "metric_logger"),
    ("timm_healthy.log", "timm"),
]


@pytest.mark.parametrize(("name", "framework", "expected"), FAILING)
def test_first_nonfinite_line_of_each_format(name: str, framework: str, expected: First) -> None:
    read = read_log(str(FIXTURES / name))
    assert read.issues == ()
    assert read.framework == framework
    assert read.confidence > 0
    assert first_nonfinite(read) == expected


@pytest.mark.parametrize(("name", "framework"), HEALTHY)
def test_healthy_logs_report_nothing(name: str, framework: str) -> None:
    read = read_log(str(FIXTURES / name))
    assert read.framework == framework
    assert read.series
    assert first_nonfinite(read) is None
    assert not [e for e in read.events if e.kind in ("nonfinite", "error", "min_loss_scale")]


PLACED_AFTER = {"tf_estimator_diverged.log": 200, "detr_loss_stop.log": 20}
"""Lines that name no step: the analysis places them at the last step logged before."""


def _only_the_log(tmp_path: Path, name: str) -> str:
    source = FIXTURES / name
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(source, folder / source.name)
    return str(folder)


@pytest.mark.parametrize(("name", "framework", "expected"), FAILING)
def test_analyze_a_folder_holding_only_the_log(
    tmp_path: Path, name: str, framework: str, expected: First
) -> None:
    from analyzer.api import analyze

    (result,) = analyze(_only_the_log(tmp_path, name), replay=False).results
    inc = result.incident
    assert inc is not None and inc.origin == "log"
    assert inc.location.line == expected.line
    assert inc.step == PLACED_AFTER.get(name, expected.step)
    # Several tags can go non-finite on one line; the stated tie rule picks among them.
    read = read_log(str(FIXTURES / name))
    on_line = {
        s.tag
        for s in read.series
        for value, line in zip(s.values, s.positions, strict=True)
        if line == expected.line and not math.isfinite(float(value))
    }
    assert inc.tag == expected.tag or inc.tag in on_line
    assert inc.rank == expected.rank
    assert [log.framework for log in result.run.logs] == [framework]


@pytest.mark.parametrize(("name", "framework"), HEALTHY)
def test_analyze_a_folder_holding_only_a_healthy_log(
    tmp_path: Path, name: str, framework: str
) -> None:
    from analyzer.api import analyze

    (result,) = analyze(_only_the_log(tmp_path, name), replay=False).results
    assert result.incident is None
    assert [log.framework for log in result.run.logs] == [framework]


def test_a_stepless_log_error_is_still_the_failure(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # An anomaly error before any numbered step: the run failed, at no known step.
    from analyzer.cli import main

    folder = _only_the_log(tmp_path, "autograd_anomaly.err")
    assert main(["analyze", folder, "--no-replay"]) == 1
    out = capsys.readouterr().out
    assert "FIRST NON-FINITE  no step  autograd:LogBackward0 = nan" in out
    assert "the line names no step and the log numbered none before it" in out
    assert "autograd_anomaly.err:19" in out


def test_series_are_line_positioned_with_unknown_wall_times() -> None:
    read = read_log(str(FIXTURES / "nanogpt_nan.log"))
    loss = next(s for s in read.series if s.tag == "loss")
    assert loss.position_unit == "line"
    assert loss.steps.tolist() == [0, 10, 20, 30, 40]
    assert loss.positions.tolist() == [6, 7, 8, 9, 10]
    assert all(math.isnan(t) for t in loss.wall_times)
    assert str(loss.location(3)).endswith("nanogpt_nan.log:9")


def test_hugging_face_nan_filter_is_explained() -> None:
    read = read_log(str(FIXTURES / "hf_trainer_nan_filter.log"))
    loss = next(s for s in read.series if s.tag == "loss")
    assert all(math.isfinite(v) for v in loss.values)
    assert loss.steps.tolist() == [10, 20, 30, 40, 50]  # from the tqdm bar before each dict
    assert any("logging_nan_inf_filter" in n and ":9:" in n for n in read.notes)
    assert {s.tag for s in read.series} == {"loss", "grad_norm", "lr"}


def test_hugging_face_lines_without_a_bar_are_numbered_in_order(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("{'loss': 1.5, 'epoch': 0.1}\n{'loss': nan, 'epoch': 0.2}\n")
    read = read_log(str(log))
    assert first_nonfinite(read) == First(2, 2, "loss")
    assert any("record's position (1, 2, ...) is their number" in n for n in read.notes)
    assert all(s.axis.kind == "record" for s in read.series)


def test_trainer_state_cut_mid_write_keeps_complete_records(tmp_path: Path) -> None:
    text = (FIXTURES / "hf_state" / "trainer_state.json").read_text()
    cut = text[: text.index('"grad_norm": NaN')]
    folder = tmp_path / "checkpoint-40"
    folder.mkdir()
    (folder / "trainer_state.json").write_text(cut)
    read = read_log(str(folder / "trainer_state.json"))
    grad = next(s for s in read.series if s.tag == "grad_norm")
    assert grad.steps.tolist() == [10, 20, 30]
    assert [i.kind for i in read.issues] == ["truncated"]


def test_compact_trainer_state_goes_through_json(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text('{"log_history": [{"loss": 1.0, "step": 5}, {"loss": NaN, "step": 10}]}')
    assert first_nonfinite(read_log(str(path))) == First(1, 10, "loss")
    path.write_text('{"log_history": [{"loss": 1.0, "st')
    read = read_log(str(path))
    (issue,) = read.issues
    assert read.series == () and issue.kind == "truncated"
    assert (issue.location.line, issue.location.offset) == (1, len('{"log_history": ['))
    path.write_text('{"log_history": [{"loss": 1.0 "step": 5}]}')
    assert [i.kind for i in read_log(str(path)).issues] == ["bad_json"]


def test_megatron_missing_loss_is_the_evidence() -> None:
    read = read_log(str(FIXTURES / "megatron_nan.log"))
    event = next(e for e in read.events if e.kind == "nonfinite")
    assert event.detail["nan_iterations"] == 3
    assert event.detail["kind"] == "nan-or-inf"
    assert kinds(read, "overflow_skip") == [30]
    scale = next(e for e in read.events if e.kind == "loss_scale")
    assert scale.detail == {"old_scale": 4096.0, "new_scale": 2048.0}
    assert any("missing loss" in n for n in read.notes)


def test_deepspeed_overflow_run_to_the_floor() -> None:
    read = read_log(str(FIXTURES / "deepspeed_overflow.log"))
    skips = [e for e in read.events if e.kind == "overflow_skip"]
    assert len(skips) == 17
    assert skips[0].detail["attempted_scale"] == 65536.0
    assert skips[-1].detail["new_scale"] == 1.0
    assert skips[-1].detail["after_step"] == 20
    assert len(kinds(read, "min_loss_scale")) == 1
    assert first_nonfinite(read) is None
    skipped = next(s for s in read.series if s.tag == "skipped")
    assert skipped.steps.tolist() == [10, 20]
    assert any("17 mixed-precision overflow" in n and "minimum" in n for n in read.notes)


def test_deepspeed_fused_optimizer_names_the_iteration() -> None:
    read = read_log(str(FIXTURES / "deepspeed_fused_overflow.log"))
    assert kinds(read, "overflow_skip") == [4]
    assert kinds(read, "loss_scale") == [4]


def test_fairseq_overflow_and_minimum_scale() -> None:
    read = read_log(str(FIXTURES / "fairseq_json.log"))
    assert [e.detail["new_scale"] for e in read.events if e.kind == "overflow_skip"] == [
        2.0,
        1.0,
        0.5,
    ]
    floor = next(e for e in read.events if e.kind == "min_loss_scale")
    assert floor.detail["min_scale"] == 0.0001
    assert floor.location.line == 10


def test_autograd_anomaly_keeps_the_user_frames() -> None:
    read = read_log(str(FIXTURES / "autograd_anomaly.err"))
    (event,) = read.events
    assert event.detail["function"] == "LogBackward0"
    assert event.detail["output"] == 0
    assert event.detail["user_frames"] == [
        "/home/user/proj/train.py:87",
        "/home/user/proj/train.py:71",
        "/home/user/proj/model.py:12",
    ]


def test_rank_prefixes_give_per_rank_series() -> None:
    read = read_log(str(FIXTURES / "torchrun_ranks.log"))
    assert {(s.tag, s.rank) for s in read.series} == {
        ("loss", 0),
        ("loss", 1),
        ("grad_norm", 0),
        ("grad_norm", 1),
    }
    clip = next(e for e in read.events if e.kind == "nonfinite")
    assert clip.detail["rank"] == 1 and clip.detail["tag"] == "grad_norm"


def test_detectron2_loss_dict_names_the_loss() -> None:
    read = read_log(str(FIXTURES / "detectron2_fpe.log"))
    cls = next(s for s in read.series if s.tag == "loss_cls")
    assert cls.steps.tolist()[-1] == 66 and math.isnan(cls.values[-1])
    assert "max_mem" not in {s.tag for s in read.series}


def test_keras_invalid_loss_names_batch_and_epoch() -> None:
    read = read_log(str(FIXTURES / "keras3_terminate_on_nan.log"))
    event = next(e for e in read.events if e.kind == "nonfinite")
    assert event.detail["batch"] == 412 and event.detail["epoch"] == 2


def test_generic_number_spellings() -> None:
    read = read_log(str(FIXTURES / "generic_loop.txt"))
    loss = next(s for s in read.series if s.tag == "loss")
    assert loss.steps.tolist() == [100, 200, 300, 400, 1500]
    assert loss.values[3] == -math.inf and math.isnan(loss.values[4])
    grad = next(s for s in read.series if s.tag == "grad_norm")
    assert grad.values[2] == 78.0
    # 'improved from inf' is prose, not a metric
    assert all(s.steps[0] != 1 for s in read.series)


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("nan", math.nan),
        ("NaN", math.nan),
        ("-nan", math.nan),
        ("NAN", math.nan),
        ("nan(ind)", math.nan),
        ("1.#IND", math.nan),
        ("1.#QNAN", math.nan),
        ("inf", math.inf),
        ("-inf", -math.inf),
        ("Infinity", math.inf),
        ("-Infinity", -math.inf),
        ("1.#INF", math.inf),
        ("-1.#INF00", -math.inf),
        ("2.3E+00", 2.3),
        ("1e-5", 1e-5),
        (".5", 0.5),
    ],
)
def test_number_spellings(tmp_path: Path, token: str, expected: float) -> None:
    log = tmp_path / "run.log"
    log.write_text(f"step 12,000 loss {token}\n")
    (series,) = read_log(str(log)).series
    assert series.steps.tolist() == [12000]
    value = float(series.values[0])
    assert (math.isnan(value) and math.isnan(expected)) or value == expected


def test_is_log_file() -> None:
    for name in ("train.log", "slurm-123.out", "stderr.err", "log.txt", "trainer_state.json"):
        assert is_log_file(f"runs/a/{name}"), name
    for name in (
        "README.md",
        "README.txt",
        "requirements.txt",
        "events.out.tfevents.1.x",
        "config.json",
        "LICENSE.txt",
    ):
        assert not is_log_file(f"runs/a/{name}"), name


def test_sniff_framework() -> None:
    assert sniff_framework((FIXTURES / "megatron_nan.log").read_text())[0] == "megatron"
    assert sniff_framework((FIXTURES / "deepspeed_overflow.log").read_text())[0] == "deepspeed"
    name, confidence = sniff_framework("hello world\n")
    assert name is None and confidence == 0.0
    name, confidence = sniff_framework((FIXTURES / "fairseq_json.log").read_text())
    assert name == "fairseq" and 0 < confidence <= 1


def test_overflow_glued_onto_a_progress_bar_is_found(tmp_path: Path) -> None:
    # DeepSpeed logs straight after tqdm's bar, with no newline in between.
    log = tmp_path / "train.log"
    log.write_text(
        "  0%|          | 0/2515 [00:00<?, ?it/s][2023-02-08 13:52:24,187] [INFO] "
        "[stage_1_and_2.py:1762:step] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
        "Attempted loss scale: 65536, reducing to 65536\n"
        "  0%|          | 1/2515 [00:14<10:00:14, 14.33s/it][2023-02-08 13:52:33,452] [INFO] "
        "[stage_1_and_2.py:1762:step] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
        "Attempted loss scale: 65536, reducing to 32768.0\n"
    )
    read = read_log(str(log))
    skips = [e for e in read.events if e.kind == "overflow_skip"]
    assert [e.detail["new_scale"] for e in skips] == [65536.0, 32768.0]
    assert [e.location.line for e in skips] == [1, 2]


def test_apex_overflow_message(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        "step 10 loss 2.0\n"
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0\n"
    )
    (skip,) = read_log(str(log)).events
    assert skip.kind == "overflow_skip"
    assert skip.detail == {"new_scale": 32768.0, "scaler": 0, "after_step": 10}


def test_lightning_rich_progress_bar(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        "Epoch 3/9  ━━━━━━━━━━━━━━━━━━━━ 40/50 0:00:12 • 0:00:03 3.21it/s v_num: 0 "
        "train_loss: 0.512\n"
        "Epoch 3/9  ━━━━━━━━━━━━━━━━━━━━ 41/50 0:00:12 • 0:00:03 3.21it/s v_num: 0 "
        "train_loss: nan\n"
    )
    read = read_log(str(log))
    assert read.framework == "lightning"
    assert first_nonfinite(read) == First(2, 3 * 50 + 41 - 1, "train_loss")


def test_mixed_frameworks_pick_the_dominant_one() -> None:
    read = read_log(str(FIXTURES / "fairseq_json.log"))
    assert read.framework == "fairseq" and read.confidence > 0.5


def test_keras_one_line_per_epoch(tmp_path: Path) -> None:
    log = tmp_path / "fit.log"
    log.write_text(
        "Epoch 1/3\n1875/1875 - 4s - 2ms/step - accuracy: 0.8756 - loss: 0.4338\n"
        "Epoch 2/3\n1875/1875 - 4s - 2ms/step - accuracy: 0.0980 - loss: nan\n"
    )
    assert first_nonfinite(read_log(str(log))) == First(4, 3750, "loss")


def test_hugging_face_quoted_numbers(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        "{'loss': '2.3410', 'grad_norm': 'nan', 'learning_rate': '1e-05', 'epoch': '0.1'}\n"
    )
    read = read_log(str(log))
    assert first_nonfinite(read) == First(1, 1, "grad_norm")


def test_deepspeed_pipeline_progress_line_keeps_its_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "train.log"
    path.write_text("steps: 5 loss: 18.0082 iter time (s): 0.010 samples/sec: 3200.000\n"
                    "steps: 10 loss: nan iter time (s): 0.010 samples/sec: 3200.000\n")
    (loss,) = [s for s in read_log(str(path)).series if s.tag == "loss"]
    assert loss.steps.tolist() == [5, 10]
    assert loss.positions.tolist() == [1, 2]


def test_reference_loop_stop_message_bounds_its_step_and_names_the_term() -> None:
    read = read_log(str(FIXTURES / "detr_loss_stop.log"))
    stop, term = read.events
    assert stop.kind == "nonfinite" and stop.step is None
    # The last progress line before it is iteration 20 of epoch 0.
    assert stop.detail == {"tag": "loss", "kind": "nan", "after_step": 20}
    assert (term.kind, term.step, term.location.line) == ("nonfinite", None, 7)
    assert term.detail["tag"] == "loss_ce" and term.detail["kind"] == "nan"
    assert term.detail["after_step"] == 20
    terms = term.detail["terms"]
    assert math.isnan(terms.pop("loss_ce"))
    assert terms == {"class_error": 100.0, "loss_bbox": 0.9511, "loss_giou": 1.2133}
    assert any("loss_ce = nan" in note for note in read.notes)


def test_a_tensor_dict_far_from_a_stop_message_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(
        "{'loss_ce': tensor(nan, device='cuda:0'), 'loss_bbox': tensor(0.95)}\n"
        "Loss is nan, stopping training\n"
        "a\nb\nc\nd\n"
        "{'loss_ce': tensor(nan, device='cuda:0'), 'loss_bbox': tensor(0.95)}\n"
    )
    read = read_log(str(path))
    assert [e.detail["tag"] for e in read.events] == ["loss"]


def test_metric_logger_steps_passes_and_evaluation() -> None:
    read = read_log(str(FIXTURES / "deit_healthy.log"))
    by_tag = {s.tag: s for s in read.series}
    # Tab-delimited, 40 iterations a pass: epoch 1 iteration 10 is step 50.
    assert by_tag["loss"].steps.tolist() == [0, 10, 20, 30, 39, 40, 50, 60, 70, 79]
    # Evaluation lines sit at the last training step, under their header word.
    assert by_tag["test/loss"].steps.tolist() == [39, 39, 39, 79, 79, 79]
    assert by_tag["avg/loss"].steps.tolist() == [39, 79]
    assert by_tag["avg/test/acc1"].values.tolist() == [0.098, 0.098]
    assert "lr" in by_tag and "time" not in by_tag and "mem" not in by_tag


ML, TIMM, PM = "metric_logger", "timm", "progress_meter"


@pytest.mark.parametrize(
    ("framework", "line", "step", "tag"),
    [
        (ML, "Epoch: [2]  [ 30/100]  eta: 0:00:09  lr: 0.1  loss: nan (nan)  time: 0.1", 230,
         "loss"),
        (ML, "Epoch: [2/300]  [ 30/100]  eta: 0:00:09  loss: inf (inf)  time: 0.1", 230, "loss"),
        (ML, "[ 30/100]\teta: 0:00:09\tloss: nan (nan)\ttime: 0.1", 30, "loss"),
        (ML, "Test: EMA  [ 30/100]  eta: 0:00:09  loss: nan (nan)  time: 0.1", 30,
         "test_ema/loss"),
        (ML, "2024-05-02 10:11:12 INFO Epoch: [1]  [ 3/10]  eta: 0:00:09  loss: nan (3.1)", 13,
         "loss"),
        (TIMM, "Train: 2 [  30/100 ( 31%)]  Loss: nan (nan)  Time: 0.3s,  80.1/s  LR: 1e-4", 230,
         "loss"),
        (TIMM, "Test: [  10/48]  Time: 0.2 (0.2)  Loss:     nan (   nan)  Acc@1: 0 (0)", 10,
         "test/loss"),
        (TIMM, "Test (EMA): [  10/48]  Time: 0.2 (0.2)  Loss:   inf (inf)", 10, "test_ema/loss"),
        (PM, "Epoch: [2][ 30/100]\tTime  0.3 ( 0.4)\tLoss nan (nan)\tAcc@1   0.0 (  0.1)", 230,
         "loss"),
        (PM, "Test: [ 10/196]\tTime  0.2 ( 0.2)\tLoss 1.2e+00 (1.1e+00)\tAcc@1   nan (  0.1)", 10,
         "test/acc1"),
    ],
)
def test_line_variants(tmp_path: Path, framework: str, line: str, step: int, tag: str) -> None:
    path = tmp_path / "train.log"
    path.write_text(line + "\n")
    read = read_log(str(path))
    assert read.framework == framework
    assert first_nonfinite(read) == First(1, step, tag)


@pytest.mark.parametrize(
    ("line", "kind", "step"),
    [
        ("Loss is nan, stopping training", "nan", None),
        ("Loss is inf, stopping training", "+inf", None),
        ("Loss is -inf, stopping training", "-inf", None),
        ("Loss is nan at step 23, stopping training.", "nan", 23),
        ("Loss is NaN at iteration 1,200, stopping training!", "nan", 1200),
        ("[rank1]: Loss is nan, stopping training", "nan", None),
        ("2024-05-02 10:11:12 ERROR Loss is -nan, stopping training", "nan", None),
        (
            "Loss is tensor(inf, device='cuda:0', grad_fn=<AddBackward0>), stopping training",
            "+inf",
            None,
        ),
        ("step 7: loss is nan, Stopping training", "nan", 7),
    ],
)
def test_reference_loop_stop_message_variants(
    tmp_path: Path, line: str, kind: str, step: int | None
) -> None:
    log = tmp_path / "train.log"
    log.write_text(f"step 5 loss 2.5\n{line}\n")
    events = [e for e in read_log(str(log)).events if e.kind == "nonfinite"]
    assert [(e.step, e.detail["tag"], e.detail["kind"], e.location.line) for e in events] == [
        (step, "loss", kind, 2)
    ]
    assert events[0].detail.get("after_step") == (5 if step is None else None)


@pytest.mark.parametrize(
    "line",
    [
        "Loss is 0.5, stopping training",  # a finite loss stopped by another rule
        "Validation loss is nan",  # no stop message: not this format
        "Epoch 3: early stopping training at loss 0.2",
    ],
)
def test_other_stop_lines_are_not_nonfinite_events(tmp_path: Path, line: str) -> None:
    log = tmp_path / "train.log"
    log.write_text(f"{line}\n")
    assert not [e for e in read_log(str(log)).events if e.kind == "nonfinite"]


def test_a_loss_scaler_at_its_floor_is_the_failure(tmp_path: Path) -> None:
    # DeepSpeed gives up at its minimum loss scale: no NaN is ever printed, yet the
    # gradients overflowed at every step down to the floor.
    from analyzer.api import analyze

    (result,) = analyze(_only_the_log(tmp_path, "deepspeed_overflow.log"), replay=False).results
    inc = result.incident
    assert inc is not None
    assert (inc.tag, inc.kind, inc.step, inc.after, inc.location.line) == (
        "gradients", "nan-or-inf", 20, True, 28
    )
    assert result.findings[0].code == "NF302"
    assert any("17 mixed-precision overflow skip(s)" in n for log in result.run.logs
               for n in log.notes)


def test_overflow_skips_that_recover_are_not_a_failure(tmp_path: Path) -> None:
    from analyzer.api import analyze

    folder = _only_the_log(tmp_path, "deepspeed_fused_overflow.log")
    (result,) = analyze(folder, replay=False).results
    assert result.incident is None
    assert result.overflow_skips == (4,)




def test_mmengine_evaluation_lines_are_not_metric_logger_lines(tmp_path: Path) -> None:
    path = tmp_path / "test.log"
    path.write_text(
        "2024/06/19 01:21:51 - mmengine - INFO - Epoch(test) [ 50/500]    eta: 0:00:10  "
        "time: 0.1002  data_time: 0.0031  memory: 1024\n"
    )
    read = read_log(str(path))
    assert read.framework != "metric_logger"
    assert not [s for s in read.series if s.tag in ("memory", "data_time")]


def test_deepspeed_under_a_trainer_is_named_whoever_prints_more(tmp_path: Path) -> None:
    # One DeepSpeed message in a Hugging Face log: the run used DeepSpeed all the same.
    text = (FIXTURES / "hf_trainer_healthy.log").read_text() + (
        "[2024-03-11 10:02:31,378] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] "
        "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
    )
    path = tmp_path / "train.log"
    path.write_text(text)
    assert read_log(str(path)).framework == "transformers+deepspeed"


def test_hugging_face_values_printed_inside_their_type(tmp_path: Path) -> None:
    # numpy 2 prints scalars as np.float64(0.85); some releases log grad_norm as a tensor.
    path = tmp_path / "train.log"
    path.write_text(
        "  1%|1         | 10/1000 [00:02<02:40,  3.07it/s]{'loss': 2.31, 'grad_norm': "
        "tensor(nan, device='cuda:0'), 'learning_rate': 4.9e-05, 'epoch': 0.01}\n"
        "{'eval_loss': 2.1, 'eval_accuracy': np.float64(0.85), 'epoch': 0.01}\n"
        "  2%|2         | 20/1000 [00:04<02:40,  3.07it/s]{'loss': np.float32(nan), "
        "'grad_norm': tensor([inf]), 'learning_rate': 4.8e-05, 'epoch': 0.02}\n"
    )
    read = read_log(str(path))
    by_tag = {s.tag: s for s in read.series}
    assert first_nonfinite(read) == First(1, 10, "grad_norm")
    assert by_tag["eval_accuracy"].values.tolist() == [0.85]
    assert math.isnan(by_tag["loss"].values[1]) and math.isinf(by_tag["grad_norm"].values[1])
    assert any("logging_nan_inf_filter" in note for note in read.notes)
