"""Text logs written the way common training frameworks print them.

Each writer receives the same per-step record and renders it in one framework's style:
plain prints, Hugging Face Trainer dict lines, a Lightning progress bar redrawn with
carriage returns, Megatron-LM iteration lines, DeepSpeed's logger lines and the
torchvision references' ``MetricLogger`` lines. Numbers keep
the run's real values; only the presentation differs, as it does between real runs.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class StepLog:
    step: int
    loss: float
    lr: float
    grad_norm: float
    epoch: float
    batch_size: int
    loss_scale: float | None = None
    skipped: bool = False


class LogStyle:
    """Base writer: plain ``print`` lines, one per step."""

    def __init__(self, fh: TextIO, total_steps: int, steps_per_epoch: int) -> None:
        self.fh = fh
        self.total = total_steps
        self.per_epoch = steps_per_epoch
        self.started = time.perf_counter()

    def write(self, text: str) -> None:
        self.fh.write(text)

    def begin(self, title: str) -> None:
        self.write(f"{title}\n")

    def step(self, s: StepLog) -> None:
        self.write(
            f"step {s.step:4d}/{self.total} | loss {s.loss:.4f} | lr {s.lr:.2e} | "
            f"grad_norm {s.grad_norm:.4f}\n"
        )

    def overflow(self, step: int, old: float, new: float) -> None:
        self.write(f"step {step}: gradient overflow, loss scale {old:g} -> {new:g}\n")

    def checkpoint(self, step: int, path: str) -> None:
        self.write(f"saved checkpoint {path}\n")

    def error(self, step: int, message: str) -> None:
        self.write("Traceback (most recent call last):\n")
        self.write('  File "train.py", line 1, in <module>\n')
        self.write(f"FloatingPointError: {message}\n")

    def stopped(self, step: int, reason: str) -> None:
        # Stopped by hand: what Ctrl-C leaves at the end of a script's output.
        self.write("^CTraceback (most recent call last):\n")
        self.write('  File "train.py", line 1, in <module>\n')
        self.write("KeyboardInterrupt\n")

    def end(self, steps_done: int, mean_loss: float) -> None:
        self.write(f"done: {steps_done} steps, mean loss {mean_loss:.4f}\n")


def _py(value: float) -> str:
    # Python's repr of a float, as a printed dict shows it (nan, inf).
    return repr(float(value))


class HuggingFaceStyle(LogStyle):
    """``Trainer`` prints the dict it logs every ``logging_steps`` steps; no step number."""

    def begin(self, title: str) -> None:
        self.write("***** Running training *****\n")
        self.write(f"  Num examples = {self.per_epoch * 32:,}\n")
        self.write(f"  Total optimization steps = {self.total:,}\n")

    def step(self, s: StepLog) -> None:
        self.write(
            f"{{'loss': {_py(round(s.loss, 4))}, 'grad_norm': {_py(s.grad_norm)}, "
            f"'learning_rate': {_py(s.lr)}, 'epoch': {_py(round(s.epoch, 2))}}}\n"
        )

    def checkpoint(self, step: int, path: str) -> None:
        self.write(f"Saving model checkpoint to {path}\n")

    def error(self, step: int, message: str) -> None:
        self.write(f"FloatingPointError: {message}\n")

    def end(self, steps_done: int, mean_loss: float) -> None:
        runtime = time.perf_counter() - self.started
        self.write(
            f"{{'train_runtime': {runtime:.4f}, 'train_samples_per_second': "
            f"{steps_done * 32 / max(runtime, 1e-9):.3f}, 'train_steps_per_second': "
            f"{steps_done / max(runtime, 1e-9):.3f}, 'train_loss': {_py(mean_loss)}, "
            f"'epoch': {_py(round(steps_done / self.per_epoch, 2))}}}\n"
        )


class LightningStyle(LogStyle):
    """A tqdm bar per epoch, redrawn in place with ``\\r``; metrics in the postfix."""

    def begin(self, title: str) -> None:
        self.write("GPU available: False, used: False\n")
        self.write("TPU available: False, using: 0 TPU cores\n")

    def step(self, s: StepLog) -> None:
        epoch, index = divmod(s.step, self.per_epoch)
        done = index + 1
        pct = 100 * done // self.per_epoch
        filled = 10 * done // self.per_epoch
        bar = "█" * filled + " " * (10 - filled)
        elapsed = time.perf_counter() - self.started
        rate = (s.step + 1) / max(elapsed, 1e-9)
        loss = "nan" if math.isnan(s.loss) else f"{s.loss:.3f}"
        self.write(
            f"\rEpoch {epoch}: {pct:3d}%|{bar}| {done}/{self.per_epoch} "
            f"[00:00<00:00, {rate:.2f}it/s, v_num=0, train_loss={loss}]"
        )
        if done == self.per_epoch:
            self.write("\n")

    def checkpoint(self, step: int, path: str) -> None:
        pass

    def error(self, step: int, message: str) -> None:
        self.write(f"\n{message}\n")

    def stopped(self, step: int, reason: str) -> None:
        # The EarlyStopping callback's message when its monitored metric is not finite.
        self.write(
            "\nMonitored metric train_loss = nan is not finite. Previous best value was "
            "inf. Signaling Trainer to stop.\n"
        )

    def end(self, steps_done: int, mean_loss: float) -> None:
        self.write("\n`Trainer.fit` stopped: `max_steps` reached.\n")


class MegatronStyle(LogStyle):
    """Megatron-LM's iteration lines; ``iteration`` counts from 1, and a NaN loss is
    left out of the line (its average is not > 0) but counted as a nan iteration."""

    def __init__(self, fh: TextIO, total_steps: int, steps_per_epoch: int) -> None:
        super().__init__(fh, total_steps, steps_per_epoch)
        self.last = time.perf_counter()

    def begin(self, title: str) -> None:
        self.write("> building train, validation, and test datasets ...\n")
        self.write("training ...\n")

    def step(self, s: StepLog) -> None:
        now = time.perf_counter()
        elapsed_ms, self.last = (now - self.last) * 1000.0, now
        line = f" iteration {s.step + 1:8d}/{self.total:8d} |"
        line += f" consumed samples: {(s.step + 1) * s.batch_size:12d} |"
        line += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
        line += f" learning rate: {s.lr:.3E} |"
        line += f" global batch size: {s.batch_size:5d} |"
        if s.loss > 0.0:
            line += f" lm loss: {s.loss:.6E} |"
        line += f" loss scale: {s.loss_scale if s.loss_scale is not None else 1.0:.1f} |"
        line += f" grad norm: {s.grad_norm:.3f} |"
        line += f" number of skipped iterations: {int(s.skipped):3d} |"
        line += f" number of nan iterations: {int(math.isnan(s.loss)):3d} |"
        self.write(line + "\n")

    def checkpoint(self, step: int, path: str) -> None:
        self.write(f"  successfully saved checkpoint at iteration {step + 1:8d} to {path}\n")

    def error(self, step: int, message: str) -> None:
        self.write(f"RuntimeError: {message}\n")


class DeepSpeedStyle(LogStyle):
    """DeepSpeed's logger: timestamped ``[INFO]`` lines, OVERFLOW lines from the loss
    scaler, and a ``log_dist`` summary every few steps."""

    def __init__(self, fh: TextIO, total_steps: int, steps_per_epoch: int) -> None:
        super().__init__(fh, total_steps, steps_per_epoch)
        self.skipped = 0

    def _info(self, where: str, text: str, level: str = "INFO") -> None:
        stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        self.write(f"[{stamp}] [{level}] [{where}] {text}\n")

    def begin(self, title: str) -> None:
        self._info("logging.py:96:log_dist", "[Rank 0] DeepSpeed info: version=0.14.0")
        self._info("config.py:1000:print", "fp16 enabled ................. True")

    def overflow(self, step: int, old: float, new: float) -> None:
        self.skipped += 1
        self._info(
            "loss_scaler.py:183:update_scale",
            f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {int(old)}, "
            f"reducing to {int(new)}",
        )

    def step(self, s: StepLog) -> None:
        if (s.step + 1) % 5 == 0:
            self._info(
                "logging.py:96:log_dist",
                f"[Rank 0] step={s.step + 1}, skipped={self.skipped}, lr=[{s.lr}], "
                f"mom=[(0.9, 0.999)]",
            )
            self.write(
                f"steps: {s.step + 1} loss: {s.loss:.4f} iter time (s): 0.010 "
                f"samples/sec: {s.batch_size / 0.010:.3f}\n"
            )

    def checkpoint(self, step: int, path: str) -> None:
        self._info("engine.py:3000:_save_checkpoint", f"Saving model checkpoint: {path}")

    def error(self, step: int, message: str) -> None:
        self.write("Traceback (most recent call last):\n")
        self.write('  File "train.py", line 1, in <module>\n')
        self.write(f"Exception: {message}\n")


class MetricLoggerStyle(LogStyle):
    """The torchvision reference scripts' ``MetricLogger.log_every`` (and DeiT's, MAE's,
    DETR's copies): a line every ``print_freq`` iterations and at the last one of the
    epoch, each meter as ``median (global average)`` over a window of 20 updates, the
    timers as averages; no ``max mem`` field on CPU. The loop's loss check prints
    ``Loss is nan, stopping training`` with no step, as DeiT's ``engine.py`` does."""

    print_freq = 10
    window = 20

    def __init__(self, fh: TextIO, total_steps: int, steps_per_epoch: int) -> None:
        super().__init__(fh, total_steps, steps_per_epoch)
        self.losses: list[float] = []
        self.loss_sum = 0.0
        self.count = 0
        self.iter_times: list[float] = []
        self.epoch_started = self.last = time.perf_counter()

    def begin(self, title: str) -> None:
        self.write("Not using distributed mode\n")
        epochs = math.ceil(self.total / self.per_epoch)
        self.write(
            f"Namespace(device='cpu', epochs={epochs}, output_dir='.', "
            f"print_freq={self.print_freq})\n"
        )
        self.write("Creating model\nStart training\n")

    def _median(self) -> float:
        # torch.median: NaN when the window holds one, else the lower of the middle two.
        window = self.losses[-self.window :]
        if any(math.isnan(v) for v in window):
            return math.nan
        return sorted(window)[(len(window) - 1) // 2]

    def step(self, s: StepLog) -> None:
        epoch, i = divmod(s.step, self.per_epoch)
        if i == 0:
            self.losses, self.loss_sum, self.count, self.iter_times = [], 0.0, 0, []
            self.epoch_started = time.perf_counter()
        now = time.perf_counter()
        self.iter_times.append(now - self.last)
        self.last = now
        self.losses.append(s.loss)
        self.loss_sum += s.loss
        self.count += 1
        if i % self.print_freq != 0 and i != self.per_epoch - 1:
            return
        per_iter = sum(self.iter_times) / len(self.iter_times)
        eta = dt.timedelta(seconds=int(per_iter * (self.per_epoch - i)))
        width = len(str(self.per_epoch))
        self.write(
            f"Epoch: [{epoch}]  [{i:{width}d}/{self.per_epoch}]  eta: {eta}  lr: {s.lr:.6f}  "
            f"loss: {self._median():.4f} ({self.loss_sum / self.count:.4f})  "
            f"time: {per_iter:.4f}  data: {per_iter / 10:.4f}\n"
        )
        if i == self.per_epoch - 1:
            spent = time.perf_counter() - self.epoch_started
            self.write(
                f"Epoch: [{epoch}] Total time: {dt.timedelta(seconds=int(spent))} "
                f"({spent / self.per_epoch:.4f} s / it)\n"
            )
            self.write(
                f"Averaged stats: lr: {s.lr:.6f}  loss: {self._median():.4f} "
                f"({self.loss_sum / self.count:.4f})\n"
            )

    def checkpoint(self, step: int, path: str) -> None:
        pass  # the reference scripts save without a word

    def error(self, step: int, message: str) -> None:
        if message.startswith("Loss is "):
            self.write(f"Loss is {message.split()[2]}, stopping training\n")
        else:
            super().error(step, message)

    def end(self, steps_done: int, mean_loss: float) -> None:
        spent = time.perf_counter() - self.started
        self.write(f"Training time {dt.timedelta(seconds=int(spent))}\n")


STYLES: dict[str, type[LogStyle]] = {
    "plain": LogStyle,
    "huggingface": HuggingFaceStyle,
    "lightning": LightningStyle,
    "megatron": MegatronStyle,
    "deepspeed": DeepSpeedStyle,
    "metric_logger": MetricLoggerStyle,
}
