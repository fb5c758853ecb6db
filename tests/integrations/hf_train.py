"""A Hugging Face Trainer run whose model is defined here, in the script (``__main__``).

``python hf_train.py OUT`` trains a one-block language model of its own (a
``PreTrainedModel`` with its own config class) with ``FlightRecorderTrainer``: 16 rows of
synthetic tokens in order, 4 a batch. Row 13 is an empty sequence (its attention mask is
all zeros), so the step holding it (the Trainer's optimizer step 4, counted from 1) masks
every key of that row and the attention's softmax returns NaN: the loss is NaN and the
recorder writes ``OUT/capture/step_4/``. The Trainer itself goes on to the end, as it does.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel, TrainingArguments
from transformers.modeling_outputs import CausalLMOutput

ROWS, LENGTH, VOCAB, EMPTY_ROW = 16, 8, 24, 13


class TinyConfig(PretrainedConfig):  # type: ignore[no-untyped-call]
    model_type = "tiny-masked-lm"

    def __init__(self, vocab_size: int = VOCAB, hidden: int = 16, **kwargs: Any) -> None:
        self.vocab_size = vocab_size
        self.hidden = hidden
        super().__init__(**kwargs)


class Attention(nn.Module):
    """Single-head attention over the keys the mask keeps (-inf for the others)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~mask[:, None, :].bool(), float("-inf"))
        return self.out(scores.softmax(dim=-1) @ v)  # type: ignore[no-any-return]


class TinyLM(PreTrainedModel):  # type: ignore[no-untyped-call]
    config_class = TinyConfig
    base_model_prefix = "tiny"

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.attn = Attention(config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab_size)
        self.post_init()  # type: ignore[no-untyped-call]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor | None = None) -> CausalLMOutput:
        h = self.embed(input_ids)
        h = h + self.attn(h, attention_mask)
        logits = self.head(h)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return CausalLMOutput(loss=loss, logits=logits)


def rows() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=gen)
    mask = torch.ones_like(ids)
    mask[EMPTY_ROW] = 0
    return [{"input_ids": i, "attention_mask": m, "labels": i}
            for i, m in zip(ids, mask, strict=True)]


def main(out: str) -> None:
    from analyzer.capture.hf import FlightRecorderTrainer

    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=out, max_steps=5, per_device_train_batch_size=4, learning_rate=1e-3,
        use_cpu=True, seed=0, report_to=["tensorboard"], logging_steps=1,
        save_strategy="no", train_sampling_strategy="sequential", disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = FlightRecorderTrainer(model=TinyLM(TinyConfig()), args=args,
                                    train_dataset=rows())
    trainer.train()
    print("captured:", trainer.flight_recorder.capture_path)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(sys.argv[1])
