"""The flight recorder in a plain PyTorch loop, end to end.

Each test trains a tiny model that fails from its own numerics (log of a softmax that
underflows, 0/0 in a normalisation), then runs ``forensics analyze`` on the run folder with
no flag: the replay must name the producing layer and op. The factories are found by
``module:function`` (tests/integrations/loop_models.py, copied out of this tool's tree as a
user's project module) or defined in the training script itself
(tests/integrations/loop_train.py, run as a subprocess); the recorder registers their code as
trusted in the test's private configuration folder (tests/conftest.py).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from analyzer.capture import FlightRecorder
from analyzer.capture.recorder import CaptureSetupError
from analyzer.cli import main
from analyzer.cli.exit import EXIT_FOUND
from tests.integrations.loop_models import batches, project_module
from tests.readonly import analyse_replayed as analyse
from tests.readonly import layer_and_op as names
from tests.readonly import snapshot

ROOT = Path(__file__).resolve().parent.parent
MODELS = "loop_project"


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """tests/integrations/loop_models.py as the user's project module ``loop_project``."""
    with project_module(tmp_path_factory.mktemp("project"), MODELS) as module:
        yield module






def meta_of(run: Path, step: int) -> dict[str, Any]:
    folder = run / "capture" / f"step_{step}"
    assert folder.is_dir(), sorted(p.name for p in (run / "capture").iterdir())
    data: dict[str, Any] = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    return data


def train(recorder: FlightRecorder, optimizers: list[torch.optim.Optimizer],
          epochs: Iterable[list[Any]], step_fn: Callable[[Any], torch.Tensor], *,
          counter: Iterable[int] | None = None, scheduler: Any = None,
          loss_fn_kind: bool = False) -> None:
    """The plain loop: ``step=None`` (the recorder counts) unless ``counter`` is given; the
    loss_fn kind hands the batch over as ``inputs, targets``."""
    steps = iter(counter) if counter is not None else None
    for data in epochs:
        for batch in data:
            step = next(steps) if steps is not None else None
            ctx = (recorder.step(step, batch[0], batch[1]) if loss_fn_kind
                   else recorder.step(step, batch=batch))
            with ctx as rec:
                for opt in optimizers:
                    opt.zero_grad()
                loss = step_fn(batch)
                loss.backward()
                for opt in optimizers:
                    opt.step()
                rec.loss(loss)
            if scheduler is not None:
                scheduler.step()
            if recorder.captured:
                return


def net_recorder(run: Path, model: torch.nn.Module, optimizer: Any,
                 **options: Any) -> FlightRecorder:
    # check_grads: a batch whose outlier row's target is the class the softmax keeps has a
    # finite loss; the NaN gradient of log(0) then shows the step.
    options.setdefault("loss_factory", f"{MODELS}:nll")
    options.setdefault("check_grads", True)
    return FlightRecorder(run, model, optimizer, model_factory=f"{MODELS}:make_net", seed=0,
                          **options)


@pytest.mark.parametrize(("start", "failing"), [(None, 4), (0, 4), (1000, 1004)])
def test_the_global_step_survives_epochs(tmp_path: Path, lm: ModuleType, start: int | None,
                                         failing: int) -> None:
    """step=None: the recorder counts optimizer steps across epochs; or the loop's own
    itertools.count(start), e.g. a resumed run's."""
    torch.manual_seed(0)
    model = lm.make_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = net_recorder(tmp_path, model, opt)
    fn = lm.nll()
    # Three batches an epoch; the second epoch's middle batch underflows the softmax.
    train(rec, [opt], [batches(3), batches(3, bad=1, seed=1)],
          lambda b: fn(model(b[0]), b[1]), loss_fn_kind=True,
          counter=None if start is None else itertools.count(start))
    assert rec.capture_path == str(tmp_path / "capture" / f"step_{failing}")
    assert rec.global_step == failing
    meta = meta_of(tmp_path, failing)
    assert meta["step"] == failing and meta["trigger"]["what"] in ("loss", "grad")
    assert names(analyse(tmp_path)) == ("head", ("log",))


def test_a_step_function_over_dict_batches_replays_the_zero_row(tmp_path: Path,
                                                               lm: ModuleType) -> None:
    torch.manual_seed(0)
    model = lm.make_net(normalise=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = FlightRecorder(tmp_path, model, opt, model_factory=f"{MODELS}:make_net",
                         model_kwargs={"normalise": True},
                         step_factory=f"{MODELS}:dict_step", seed=0)
    fn = lm.dict_step()
    data = [{"x": x, "y": y, "weight": 0.5} for x, y in batches(4, bad=2, outlier=0)]
    train(rec, [opt], [data], lambda b: fn(model, b))
    meta = meta_of(tmp_path, 2)
    assert meta["step_call"]["kind"] == "step_fn" and meta["batch_dropped"] == []
    assert meta["step_call"]["factory"] == {"factory": f"{MODELS}:dict_step", "kwargs": {}}
    layer, ops = names(analyse(tmp_path))
    assert layer == "norm" and "div" in ops


def test_a_step_function_over_pairs_sums_two_losses(tmp_path: Path, lm: ModuleType) -> None:
    torch.manual_seed(0)
    model = lm.make_pair_net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rec = FlightRecorder(tmp_path, model, opt, model_factory=f"{MODELS}:make_pair_net",
                         step_factory=f"{MODELS}:pair_step", step_kwargs={"aux": 0.25},
                         seed=0)
    fn = lm.pair_step(0.25)
    data = [((x, x.flip(0)), y) for x, y in batches(4, bad=1)]
    train(rec, [opt], [data], lambda b: fn(model, b))
    assert meta_of(tmp_path, 1)["step_call"]["factory"]["kwargs"] == {"aux": 0.25}
    assert names(analyse(tmp_path)) == ("net.head", ("log",))


def test_param_groups_with_their_own_lrs_and_a_scheduler(tmp_path: Path, lm: ModuleType) -> None:
    torch.manual_seed(0)
    model = lm.make_net()
    opt = torch.optim.Adam([{"params": model.body[0].parameters(), "lr": 1e-2},
                            {"params": model.body[2].parameters(), "lr": 1e-3}])
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    rec = net_recorder(tmp_path, model, opt)
    fn = lm.nll()
    train(rec, [opt], [batches(3), batches(3, bad=0, seed=1)],
          lambda b: fn(model(b[0]), b[1]), scheduler=sched, loss_fn_kind=True)
    meta = meta_of(tmp_path, 3)
    # Three scheduler steps before step 3 halved both groups' lrs three times.
    assert meta["lrs"] == [[1e-2 / 8, 1e-3 / 8]]
    assert names(analyse(tmp_path)) == ("head", ("log",))


def test_two_optimizers(tmp_path: Path, lm: ModuleType) -> None:
    torch.manual_seed(0)
    model = lm.make_net()
    first = torch.optim.SGD(model.body[0].parameters(), lr=0.1, momentum=0.9)
    second = torch.optim.Adam(model.body[2].parameters(), lr=1e-3)
    rec = net_recorder(tmp_path, model, [first, second])
    fn = lm.nll()
    train(rec, [first, second], [batches(4, bad=2)], lambda b: fn(model(b[0]), b[1]),
          loss_fn_kind=True)
    meta = meta_of(tmp_path, 2)
    assert [o["class"] for o in meta["optimizers"]] == ["torch.optim.SGD", "torch.optim.Adam"]
    assert meta["lrs"] == [[0.1], [1e-3]]
    assert names(analyse(tmp_path)) == ("head", ("log",))


def test_a_step_that_raised_is_captured(tmp_path: Path, lm: ModuleType) -> None:
    torch.manual_seed(0)
    model = lm.make_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = net_recorder(tmp_path, model, opt)
    fn = lm.nll()
    with pytest.raises(FloatingPointError):
        for step, (x, y) in enumerate(batches(4, bad=2)):
            with rec.step(step, x, y) as r:
                loss = fn(model(x), y)
                r.loss(loss)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss.item()} at step {step}")
                opt.zero_grad()
                loss.backward()
                opt.step()
    assert rec.capture_path == str(tmp_path / "capture" / "step_2")
    assert names(analyse(tmp_path)) == ("head", ("log",))


def test_a_wrong_factory_path_fails_at_step_0(tmp_path: Path, lm: ModuleType) -> None:
    model = lm.make_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CaptureSetupError, match=f"{MODELS}:make_nett"):
        FlightRecorder(tmp_path, model, opt, model_factory=f"{MODELS}:make_nett",
                       loss_factory=f"{MODELS}:nll")
    with pytest.raises(CaptureSetupError, match="no_such_module"):
        FlightRecorder(tmp_path, model, opt, model_factory=f"{MODELS}:make_net",
                       loss_factory="no_such_module.losses:nll")
    # A factory that builds another architecture than the live model is caught too.
    with pytest.raises(CaptureSetupError, match=f"{MODELS}:make_pair_net"):
        FlightRecorder(tmp_path, model, opt, model_factory=f"{MODELS}:make_pair_net",
                       loss_factory=f"{MODELS}:nll")
    assert not (tmp_path / "capture").exists()


def test_a_model_defined_in_the_training_script_replays(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    script = ROOT / "tests" / "integrations" / "loop_train.py"
    # The subprocess registers its code in the same private configuration folder.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), str(run)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    meta = meta_of(run, 4)  # epoch 1, batch 1: the global step counts across epochs
    assert meta["model"]["factory"] == "__main__:make_model"
    assert meta["step_call"]["factory"]["factory"] == "__main__:make_step"
    assert meta["lrs"] == [[0.05 / 4, 0.01 / 4]]
    before = snapshot(run)
    assert main(["analyze", str(run)]) == EXIT_FOUND  # `forensics analyze RUN`, no flag
    assert snapshot(run) == before
    out = capsys.readouterr().out
    assert "FIRST NON-FINITE  step 4  train/loss = nan" in out, out
    assert "replay: forward, layer norm, aten.div.Tensor" in out, out
    assert "source: return x / x.norm(dim=-1, keepdim=True)" in out  # the script's line


def test_the_replay_runs_the_steps_as_the_loop_did(tmp_path: Path, lm: ModuleType) -> None:
    """every_n mode: replay re-runs steps 0..2 from the state kept at step 0 (two optimizers,
    one with two param groups whose lrs a scheduler moves), then step 3, whose loss is
    finite (the outlier row's target is the class its softmax keeps) while log(0) makes the
    gradients NaN: the replayed loss is the run's only if each step ran as the loop ran it."""
    from analyzer.replayer import replay

    torch.manual_seed(0)
    model = lm.make_net()
    first = torch.optim.SGD(model.body[0].parameters(), lr=0.1, momentum=0.9)
    second = torch.optim.Adam([{"params": [model.body[2].weight], "lr": 1e-2},
                               {"params": [model.body[2].bias], "lr": 1e-3}])
    sched = torch.optim.lr_scheduler.StepLR(second, step_size=1, gamma=0.7)
    rec = FlightRecorder(tmp_path, model, [first, second], model_factory=f"{MODELS}:make_net",
                         step_factory=f"{MODELS}:dict_step", check_params=True, every_n=10)
    fn = lm.dict_step()
    epochs = [[{"x": x, "y": y, "weight": 0.5} for x, y in batches(3, seed=s, bad=bad,
                                                                    outlier=1e3)]
              for s, bad in ((0, None), (2, 0))]
    train(rec, [first, second], epochs, lambda b: fn(model, b), scheduler=sched)
    meta = meta_of(tmp_path, 3)
    assert meta["history_steps"] == [0, 1, 2] and meta["trigger"]["what"] == "param"
    assert meta["lrs"] == [[0.1], [pytest.approx(1e-2 * 0.7**3), pytest.approx(1e-3 * 0.7**3)]]
    result = replay(str(tmp_path))
    assert result.passes[0].loss == pytest.approx(meta["loss_value"], rel=1e-6)
    assert (result.layer, result.op.names if result.op else None) == ("head", ("log",))


def test_regression_param_groups_out_of_model_order_replay_their_own_parameters(
        tmp_path: Path, lm: ModuleType) -> None:
    """One optimizer whose first group is the model's last layer: replaying steps 0..2 and
    step 3 (finite loss, NaN gradients) must give the run's loss of step 3. torch numbers an
    optimizer's parameters 0..n-1 in the order of its own groups; read as indices into
    model.parameters() they gave this group the first layer's tensors (0.7607 for 0.7501)."""
    from analyzer.replayer import replay

    torch.manual_seed(0)
    model = lm.make_net()
    opt = torch.optim.Adam([{"params": model.body[2].parameters(), "lr": 1e-2},
                            {"params": model.body[0].parameters(), "lr": 1e-3}])
    rec = net_recorder(tmp_path, model, opt, check_grads=False, check_params=True,
                       every_n=10)
    fn = lm.nll()
    train(rec, [opt], [batches(3), batches(3, bad=0, seed=2, outlier=1e3)],
          lambda b: fn(model(b[0]), b[1]), loss_fn_kind=True)
    meta = meta_of(tmp_path, 3)
    assert meta["trigger"]["what"] == "param" and meta["history_steps"] == [0, 1, 2]
    assert replay(str(tmp_path)).passes[0].loss == pytest.approx(meta["loss_value"], rel=1e-6)
