"""One rank of the 2-process gloo run that ``plain_runs.make_ddp_gloo`` starts."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

BAD_STEP = 5


@record
def main(root: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(root / "tb"))
    for step in range(20):
        x = torch.randn(8, 4, generator=gen)
        if rank == 1 and step == BAD_STEP:
            x = torch.zeros(8, 4)  # a corrupt shard: all-zero features
        x = x / x.norm(dim=1, keepdim=True)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        if writer is not None:
            writer.add_scalar("train/loss", mean.item(), step)
            writer.flush()
        print(f"[rank {rank}] step {step} loss {loss.item():.6f}", flush=True)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"rank {rank}: loss is {loss.item()} at step {step}")
        opt.zero_grad()
        loss.backward()
        opt.step()
    if writer is not None:
        writer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]))
