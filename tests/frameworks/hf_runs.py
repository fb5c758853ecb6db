"""transformers 5 Trainer runs: a one-layer GPT-2 built from its config, synthetic tokens,
``report_to=["tensorboard"]`` (events under ``output_dir/runs/<date>_<host>/``) and
``checkpoint-N/`` folders as ``save_steps`` leaves them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.frameworks._common import offline, seed


class _Tokens:
    """Repeating token patterns: a language a one-layer model learns quickly."""

    def __init__(self, n: int, length: int = 16, vocab: int = 32) -> None:
        import torch

        gen = torch.Generator().manual_seed(0)
        starts = torch.randint(0, vocab, (n, 1), generator=gen)
        self.ids = (starts + torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _train(root: Path, *, lr: float, steps: int, save_steps: int, **kwargs: Any) -> Path:
    offline()
    seed(0)
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=str(root), report_to=["tensorboard"], logging_steps=1,
        save_steps=save_steps, max_steps=steps, learning_rate=lr,
        per_device_train_batch_size=4, use_cpu=True, seed=0, dataloader_num_workers=0,
        disable_tqdm=False, **kwargs)
    Trainer(model=model, args=args, train_dataset=_Tokens(64)).train()
    return root


def make_hf_nan(root: Path) -> Path:
    """An absurd learning rate (SGD warming up to lr=30, no gradient clipping) blows the
    weights up until the gradient norm is NaN. The Trainer goes on, logging ``loss`` 0.0
    from then on (its ``logging_nan_inf_filter`` drops non-finite losses) and saving
    checkpoints of the NaN model."""
    return _train(root, lr=30.0, steps=24, save_steps=8, max_grad_norm=0.0, warmup_steps=4,
                  optim="sgd")


def make_hf_healthy(root: Path) -> Path:
    """A sane learning rate; ``checkpoint-10/`` and ``checkpoint-20/`` each hold
    trainer_state.json, training_args.bin, scheduler.pt, rng_state.pth, optimizer.pt,
    model.safetensors, config.json and generation_config.json."""
    return _train(root, lr=5e-3, steps=20, save_steps=10)
