"""A loop written with Hugging Face Accelerate, recorded by two lines: ``recorder_for`` and
``recorder.step``. ``python tests/integrations/accelerate_train.py OUT [bf16]`` trains it;
the tests call :func:`train` in their own process.

The model (``loop_models.Net``, a module beside this script) takes log(softmax) of its
logits; batch ``bad`` holds a row a thousand times too large, so its softmax underflows and
log(0) = -inf.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset


def train(out: str, *, mixed_precision: str = "no", accumulation: int = 1,
          clip: float | None = None, batches: int = 5, bad: int = 3, bad_epoch: int = 0,
          epochs: int = 2, every_n: int = 1, kind: str = "loss_fn", guard: Any = None,
          models: ModuleType) -> Any:
    """Train until the recorder captures; returns the recorder. Batch ``bad`` goes bad from
    epoch ``bad_epoch`` on. ``models`` is the module of the model and loss (the tests import
    loop_models.py as a project module of their own). ``kind``: ``loss_fn`` (NLL over the
    model's output), ``model_loss`` (the model returns its own loss from a dict batch, as a
    Hugging Face model does) or ``step_fn`` (``embed_step``: a loss term computed outside
    the model). ``guard``: recorder_for's guarded step option."""
    from accelerate import Accelerator

    from analyzer.capture.accelerate import recorder_for

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, mixed_precision=mixed_precision,
                              gradient_accumulation_steps=accumulation)
    make = {"loss_fn": models.make_net, "model_loss": models.make_self_loss_net,
            "step_fn": models.make_embed_net}[kind]
    model = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    data = models.batches(batches)
    inputs = torch.cat([x for x, _ in data])
    loader = DataLoader(TensorDataset(inputs, torch.cat([y for _, y in data])), batch_size=4)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader,
                                                              scheduler)
    loss_fn, step_fn = models.nll(), models.embed_step()
    how: dict[str, Any] = {"loss_fn": {"loss_factory": models.nll},
                           "model_loss": {"step_kind": "model_loss"},
                           "step_fn": {"step_factory": models.embed_step}}[kind]
    recorder = recorder_for(accelerator, out, model, optimizer, model_factory=make, seed=0,
                            check_params=True, every_n=every_n, guard=guard, **how)
    for epoch in range(epochs):
        if epoch == bad_epoch:
            inputs[4 * bad] *= 1e3  # the loader reads the tensor as it is now
        for x, y in loader:
            # The loss_fn kind takes an (inputs, targets) pair as its batch.
            batch: Any = {"x": x, "labels": y} if kind == "model_loss" else (
                {"x": x, "y": y} if kind == "step_fn" else (x, y))
            with accelerator.accumulate(model), recorder.step(batch):
                if kind == "model_loss":
                    loss = model(**batch)["loss"]
                else:
                    loss = step_fn(model, batch) if kind == "step_fn" else loss_fn(model(x), y)
                accelerator.backward(loss)
                if clip is not None and accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if recorder.captured:
                break
        if recorder.captured:
            break
    recorder.close()
    return recorder


if __name__ == "__main__":
    import loop_models  # beside this script (sys.path[0]), as a user's own module would be

    args = sys.argv[1:]
    rec = train(args[0], mixed_precision="bf16" if "bf16" in args else "no",
                accumulation=2, clip=1.0, models=loop_models)
    print(rec.capture_path)
