"""The environment snapshot a run writes as env.json and a capture keeps in meta.json."""

from __future__ import annotations

import os
import platform
import warnings
from collections.abc import Mapping
from typing import Any

from analyzer.capture.folder import ENV_FILE, ENV_FORMAT
from analyzer.capture.format import write_json


def environment(seed: int | None = None) -> dict[str, Any]:
    """A snapshot of the software and numerics settings a run's numbers depend on."""
    import numpy as np
    import torch

    config = torch.__config__.show()
    cuda_ok = torch.cuda.is_available()
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(),
        "numpy": np.__version__,
        "blas": _config_value(config, "BLAS_INFO"),
        "lapack": _config_value(config, "LAPACK_INFO") or _config_value(config, "BLAS_INFO"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "num_threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()).removeprefix("torch."),
        "anomaly_detection": torch.is_anomaly_enabled(),
        "cuda_available": cuda_ok,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda_ok
        else [],
        "seed": seed,
    }
    return env


def _cudnn_version() -> int | None:
    import torch

    backend: Any = torch.backends.cudnn
    return backend.version() if backend.is_available() else None


def _config_value(config: str, key: str) -> str | None:
    # torch.__config__.show() prints "BLAS_INFO=mkl, BUILD_TYPE=..." on one line.
    marker = key + "="
    start = config.find(marker)
    if start < 0:
        return None
    value = config[start + len(marker) :].split(",", 1)[0].strip()
    return value or None


def write_env(run_dir: str | os.PathLike[str], seed: int | None = None,
              recorder: Mapping[str, Any] | None = None) -> str | None:
    """Write ``env.json`` into ``run_dir``; return its path, or None if it could not.

    ``recorder`` (added by the flight recorder) says how the run's model, loss and step are
    rebuilt: the same "model", "loss", "step_call" and "code" keys as a capture's meta.json,
    so that a run that died without a capture can still be replayed from a checkpoint."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        path = os.path.join(run_dir, ENV_FILE)
        data = {"format": ENV_FORMAT, "version": 1, **environment(seed)}
        if recorder is not None:
            data["recorder"] = dict(recorder)
        write_json(path, data)
        return path
    except Exception as exc:  # the run matters more than its environment record
        warnings.warn(f"flight recorder: could not write {ENV_FILE}: {exc}", stacklevel=2)
        return None
