"""Hand-written loops: tensorboardX, AMP with a real GradScaler, and 2-rank gloo under
torchrun (``ddp_worker.py``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.frameworks._common import OFFLINE, offline, regression, seed


def make_tbx_nan(root: Path) -> Path:
    """A hand-written binary cross-entropy, ``y log p + (1 - y) log(1 - p)`` with
    ``p = sigmoid(z)`` and lr=5: the logits grow until p rounds to exactly 0 or 1, and
    0 * log(0) is NaN (step 29); the weights are NaN from then on.
    tensorboardX warns ``NaN or Inf found in input tensor.`` on each bad scalar."""
    offline()
    seed(0)
    import torch
    from tensorboardX import SummaryWriter

    data = regression(64, value=5)
    x, target = data.tensors[0], (data.tensors[1] > 0).float()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=5.0)
    writer = SummaryWriter(logdir=str(root / "runs" / "tbx"))
    for step in range(40):
        batch = slice((step * 8) % 64, (step * 8) % 64 + 8)
        p = torch.sigmoid(model(x[batch]))
        y = target[batch]
        loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        writer.add_scalar("loss", loss.item(), step)
        writer.add_scalar("weight_norm", model.weight.norm().item(), step)
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    writer.close()
    return root


def make_amp_benign(root: Path) -> Path:
    """fp16 autocast on CPU with ``torch.amp.GradScaler("cpu", init_scale=2**20)``: the first
    steps overflow in fp16, the scaler skips them and halves its scale, then it settles and
    training is healthy. The loop logs the grad norm (inf on skipped steps) and the scale,
    and prints an overflow line when a step is skipped."""
    offline()
    seed(0)
    import torch
    from torch.utils.tensorboard import SummaryWriter

    x, y = regression(128, value=6).tensors
    model = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
    writer = SummaryWriter(str(root / "tb"))
    for step in range(40):
        batch = slice((step * 16) % 128, (step * 16) % 128 + 16)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x[batch]).float(), y[batch])
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0).item()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        after = scaler.get_scale()
        writer.add_scalar("train/loss", loss.item(), step)
        writer.add_scalar("train/grad_norm", grad_norm, step)
        writer.add_scalar("train/loss_scale", after, step)
        if after < before:
            print(f"gradient overflow, skipping step, loss scale {before:g} -> {after:g}")
        print(f"step {step} loss {loss.item():.4f} grad_norm {grad_norm:.4f} scale {after:g}",
              flush=True)
    writer.close()
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_ddp_gloo(root: Path) -> Path:
    """``torchrun --nproc-per-node 2 --log-dir root/torchrun_logs --tee 3``: rank 1 is given
    a batch of zeros at step 5 that it normalises by its norm (0/0); it raises on its NaN
    loss while rank 0, which logs the all-reduced loss (NaN) to TensorBoard, waits in the
    gradient all-reduce and is then stopped by the agent. torchrun's console (rank-prefixed
    ``[default0]:`` lines and the elastic agent's error summary) is what ``train.log`` gets
    when this runs under ``generate``."""
    worker = Path(__file__).with_name("ddp_worker.py")
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(worker.parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", "ddp_gloo",
           "--log-dir", str(root / "torchrun_logs"), "--tee", "3", "--monitor-interval", "0.1",
           str(worker), str(root)]
    root.mkdir(parents=True, exist_ok=True)
    # torchrun's own console is the run's console: pass it through unchanged.
    done = subprocess.run(cmd, env=env, check=False, timeout=120)
    if done.returncode == 0:
        raise RuntimeError("torchrun exited 0: rank 1 was meant to fail")
    return root
