"""The flight recorder itself: keeps each step's state, writes the first bad step."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analyzer.capture.env import environment, write_env
from analyzer.capture.folder import (
    BATCH_FILE,
    CAPTURE_DIR,
    ENV_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    HISTORY_FILE,
    META_FILE,
    RNG_FILE,
    STATE_FILE,
    step_dir_name,
    temporary_prefix,
)
from analyzer.capture.format import (
    Factory,
    Mode,
    class_path,
    dtype_name,
    hparams_json,
    write_json,
)
from analyzer.capture.rng import raw_rng, safe_rng

if TYPE_CHECKING:
    import torch


@dataclass
class _Snapshot:
    """State at the start of one step; tensors are reused between steps to save allocation."""

    step: int = -1
    model: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    scaler: dict[str, Any] | None = None


@dataclass(frozen=True)
class _StepInputs:
    """What a single step needs besides the state: its batch, RNG states and lr."""

    step: int
    inputs: Any
    targets: Any
    rng: tuple[Any, ...]
    lr: float


class FlightRecorder:
    """Keeps the start-of-step state of a training loop and writes the first bad step.

    ``mode="every_step"`` copies model and optimizer state before every step, so the
    capture is the failing step alone. ``mode="every_n"`` copies it only every
    ``every_n`` steps and keeps the batches, RNG states and learning rates of the steps
    since; replay then re-runs those steps before the failing one. Both modes cost
    nothing once a capture is written. Without ``mode``, ``every_n=K`` with K > 1 means
    ``mode="every_n"``; ``mode="every_step"`` with K > 1 is a contradiction and raises
    ``ValueError``, as an invalid mode does.

    ``check_grads`` and ``check_params`` add a check of every gradient (after the step,
    skipped when a GradScaler is used: skipped overflow steps are its normal business)
    and of every parameter (after the update).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        model_factory: str,
        model_kwargs: Mapping[str, Any] | None = None,
        loss_factory: str,
        loss_kwargs: Mapping[str, Any] | None = None,
        scaler: Any = None,
        autocast_dtype: torch.dtype | None = None,
        grad_clip: float | None = None,
        seed: int | None = None,
        mode: Mode | None = None,
        every_n: int = 1,
        check_grads: bool = False,
        check_params: bool = False,
        loss_tag: str = "train/loss",
        write_env_file: bool = True,
    ) -> None:
        if every_n < 1:
            raise ValueError(f"every_n must be at least 1, not {every_n}")
        if mode is None:
            mode = "every_n" if every_n > 1 else "every_step"
        if mode not in ("every_step", "every_n"):
            raise ValueError(f"mode must be 'every_step' or 'every_n', not {mode!r}")
        if mode == "every_step" and every_n > 1:
            # Silently copying every step would cost K times what was asked for.
            raise ValueError(f'every_n={every_n} needs mode="every_n" (or no mode): '
                             'mode="every_step" copies the state before every step')
        self.run_dir = os.fspath(run_dir)
        self.model = model
        self.optimizer = optimizer
        self.model_factory = Factory(model_factory, dict(model_kwargs or {}))
        self.loss_factory = Factory(loss_factory, dict(loss_kwargs or {}))
        self.scaler = scaler
        self.autocast_dtype = autocast_dtype
        self.grad_clip = grad_clip
        self.seed = seed
        self.mode: Mode = mode
        self.every_n = every_n
        self.check_grads = check_grads
        self.check_params = check_params
        self.loss_tag = loss_tag
        self.capture_path: str | None = None
        self.errors: list[str] = []
        self._snapshot = _Snapshot()
        self._history: list[_StepInputs] = []
        self._current: _StepInputs | None = None
        self._loss: Any = None
        self._env: dict[str, Any] | None = None
        self._stopped = False
        self._warned = False
        self._cuda = _cuda_available()
        if write_env_file and write_env(self.run_dir, seed) is None:
            self.errors.append(f"could not write {ENV_FILE}")

    @property
    def captured(self) -> bool:
        return self.capture_path is not None

    @property
    def active(self) -> bool:
        """False once a capture is written or writing one failed: then it costs nothing."""
        return self.capture_path is None and not self._stopped

    @contextlib.contextmanager
    def step(self, step: int, inputs: Any, targets: Any = None) -> Iterator[FlightRecorder]:
        """Record one training step; the body runs the loop's own step."""
        self._loss = None
        self._current = None
        if self.active:
            self._guard("keep state", self._before, step, inputs, targets)
        try:
            yield self
        finally:
            # Checked even when the body raised: a loop that raises FloatingPointError
            # on a NaN loss is exactly the case worth capturing.
            if self.active and self._current is not None:
                self._guard("check step", self._after)

    def loss(self, value: Any) -> None:
        """Hand the step's loss to the recorder (a tensor or a float)."""
        self._loss = value

    # The three lines above are the whole API a loop needs; the rest is the machinery.

    def _guard(self, what: str, func: Any, *args: Any) -> None:
        try:
            func(*args)
        except Exception as exc:
            message = f"{what}: {type(exc).__name__}: {exc}"
            if not self._warned:
                warnings.warn(f"flight recorder: {message}", stacklevel=4)
                self._warned = True
            self.errors.append(message)
            if what == "check step":
                # A recorder that failed to write should not retry, and slow, every step.
                self._stopped = True

    def _before(self, step: int, inputs: Any, targets: Any) -> None:
        import torch

        with torch.no_grad():
            since = step - self._snapshot.step
            # A step counter going backwards (a resumed run) also starts a new snapshot.
            if self._snapshot.step < 0 or since >= self.every_n or since <= 0:
                self._snapshot.model = _copy_into(self._snapshot.model, self.model.state_dict())
                self._snapshot.optimizer = _copy_into(
                    self._snapshot.optimizer, self.optimizer.state_dict()
                )
                self._snapshot.scaler = _scaler_state(self.scaler)
                self._snapshot.step = step
                self._history.clear()
            self._current = _StepInputs(
                step=step,
                inputs=_detach(inputs),
                targets=_detach(targets),
                rng=raw_rng(self._cuda),
                lr=float(self.optimizer.param_groups[0]["lr"]),
            )

    def _after(self) -> None:
        current = self._current
        assert current is not None
        trigger = self._find_trigger()
        if trigger is None:
            if self.mode == "every_n":
                self._history.append(current)
            return
        self.capture_path = self._write(current, trigger)

    def _find_trigger(self) -> dict[str, str] | None:

        if self._loss is not None:
            kind = _kind_of(self._loss)
            if kind is not None:
                return {"what": "loss", "name": self.loss_tag, "kind": kind}
        named = list(self.model.named_parameters())
        if self.check_grads and self.scaler is None:
            grads = [(n, p.grad) for n, p in named if p.grad is not None]
            found = _first_nonfinite(grads)
            if found is not None:
                return {"what": "grad", "name": found[0], "kind": found[1]}
        if self.check_params:
            found = _first_nonfinite(named)
            if found is not None:
                return {"what": "param", "name": found[0], "kind": found[1]}
        return None

    def _write(self, current: _StepInputs, trigger: dict[str, str]) -> str:
        import torch

        final = os.path.join(self.run_dir, CAPTURE_DIR, step_dir_name(current.step))
        parent = os.path.dirname(final)
        os.makedirs(parent, exist_ok=True)
        # Written aside and renamed, so a crash mid-write never leaves a half capture: the
        # readers take no folder of the temporary name (analyzer.capture.folder).
        tmp = tempfile.mkdtemp(prefix=temporary_prefix(current.step), dir=parent)
        try:
            torch.save(
                {
                    "model": self._snapshot.model,
                    "optimizer": self._snapshot.optimizer,
                    "scaler": self._snapshot.scaler,
                },
                os.path.join(tmp, STATE_FILE),
            )
            torch.save(
                {"inputs": current.inputs, "targets": current.targets},
                os.path.join(tmp, BATCH_FILE),
            )
            torch.save(safe_rng(current.rng), os.path.join(tmp, RNG_FILE))
            if self.mode == "every_n":
                torch.save(
                    {"steps": [_history_entry(h) for h in self._history]},
                    os.path.join(tmp, HISTORY_FILE),
                )
            # meta.json last: a folder that holds it is complete.
            write_json(os.path.join(tmp, META_FILE), self._meta(current, trigger))
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._history.clear()
        self._snapshot = _Snapshot()
        return final

    def _meta(self, current: _StepInputs, trigger: dict[str, str]) -> dict[str, Any]:
        if self._env is None:
            self._env = environment(self.seed)
        params = list(self.model.parameters())
        dtype = dtype_name(params[0].dtype) if params else "float32"
        device = str(params[0].device) if params else "cpu"
        meta: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "step": current.step,
            "trigger": trigger,
            "model": self.model_factory.to_json(),
            "loss": self.loss_factory.to_json(),
            "optimizer": {
                "class": class_path(self.optimizer),
                "hyperparameters": hparams_json(
                    {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
                ),
                "param_groups": len(self.optimizer.param_groups),
            },
            "lr": current.lr,
            "grad_clip": self.grad_clip,
            "dtype": dtype,
            "amp": {
                "autocast_dtype": dtype_name(self.autocast_dtype) if self.autocast_dtype else None,
                "device_type": device.split(":")[0],
                "grad_scaler": self.scaler is not None,
            },
            "device": device,
            "seed": self.seed,
            "env": self._env,
            "mode": self.mode,
            "state_step": self._snapshot.step,
            "loss_value": _float_or_none(self._loss),
            "files": [META_FILE, STATE_FILE, BATCH_FILE, RNG_FILE]
            + ([HISTORY_FILE] if self.mode == "every_n" else []),
        }
        if self.mode == "every_n":
            meta["every_n"] = self.every_n
            meta["history_steps"] = [h.step for h in self._history]
        return meta


def _copy_into(previous: Any, new: Any) -> Any:
    """Deep-copy ``new``, writing tensors into ``previous``'s buffers where shapes match.

    The matching tensors are copied by one ``_foreach_copy_`` call rather than one call
    per tensor: this runs before every training step.
    """
    import torch

    dst: list[torch.Tensor] = []
    src: list[torch.Tensor] = []

    def walk(old: Any, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if (
                isinstance(old, torch.Tensor)
                and old.shape == value.shape
                and old.dtype == value.dtype
                and old.device == value.device
            ):
                dst.append(old)
                src.append(value.detach())
                return old
            return value.detach().clone()
        if isinstance(value, Mapping):
            prev = old if isinstance(old, Mapping) else {}
            return {k: walk(prev.get(k), v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            seq = old if isinstance(old, list | tuple) else ()
            items = [walk(seq[i] if i < len(seq) else None, v) for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return value

    result = walk(previous, new)
    if dst:
        with torch.no_grad():
            torch._foreach_copy_(dst, src)
    return result


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _first_nonfinite(named: list[tuple[str, Any]]) -> tuple[str, str] | None:
    """The first tensor holding NaN/Inf and its kind, or None.

    One norm per tensor and a single synchronisation in the common all-finite case; a
    non-finite norm may only mean that finite values overflowed when squared, so the
    tensors are then checked exactly.
    """
    import torch

    if not named:
        return None
    with torch.no_grad():
        tensors = [t.detach() for _, t in named]
        norms = torch._foreach_norm(tensors)
        if bool(torch.stack([n.float() for n in norms]).isfinite().all()):
            return None
        for (name, tensor), norm in zip(named, norms, strict=True):
            if bool(norm.isfinite()):
                continue
            kind = _kind_of(tensor)
            if kind is not None:
                return name, kind
    return None


def _detach(batch: Any) -> Any:
    """A CPU copy of a batch: a tensor, or a list of tensors (tuples become lists)."""
    import torch

    if batch is None:
        return None
    if isinstance(batch, torch.Tensor):
        return batch.detach().to("cpu", copy=True)
    if isinstance(batch, Sequence) and not isinstance(batch, str | bytes):
        return [_detach(b) for b in batch]
    if isinstance(batch, Mapping):
        return {str(k): _detach(v) for k, v in batch.items()}
    return batch


def _scaler_state(scaler: Any) -> dict[str, Any] | None:
    if scaler is None or not scaler.is_enabled():
        return None
    return dict(scaler.state_dict())


def _history_entry(h: _StepInputs) -> dict[str, Any]:
    return {
        "step": h.step,
        "inputs": h.inputs,
        "targets": h.targets,
        "rng": safe_rng(h.rng),
        "lr": h.lr,
    }


def _kind_of(value: Any) -> str | None:
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        if bool(t.isfinite().all()):
            return None
        if bool(t.isnan().any()):
            return "nan"
        return "+inf" if bool((t == float("inf")).any()) else "-inf"
    x = float(value)
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "+inf" if x > 0 else "-inf"
    return None


def _float_or_none(value: Any) -> float | str | None:
    if value is None:
        return None
    try:
        x = float(value.detach().float().mean()) if hasattr(value, "detach") else float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    # JSON has no NaN/Infinity; the strings keep the meta.json strict JSON.
    return x if x == x and abs(x) != float("inf") else repr(x)
