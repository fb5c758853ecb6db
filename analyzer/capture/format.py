"""What the recorder writes into meta.json: factories, class paths, dtype names, strict JSON.

The folder's names, its discovery and the reader of meta.json are
:mod:`analyzer.capture.folder`'s.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal["every_step", "every_n"]


@dataclass(frozen=True)
class Factory:
    """An importable ``module:function`` and the JSON keyword arguments to call it with."""

    path: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"factory": self.path, "kwargs": dict(self.kwargs)}

    def target(self) -> Any:
        """The function or class the path names, imported (the recorder's own process)."""
        module_name, _, attr = self.path.partition(":")
        if not module_name or not attr:
            raise ValueError(f"factory {self.path!r} is not of the form 'module:function'")
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
        return target

    def build(self) -> Any:
        return self.target()(**dict(self.kwargs))


class NoConfigClass(ValueError):
    """A model class given a config that has no ``config_class`` to read it with."""


def from_config(cls: Any, config: Mapping[str, Any]) -> Any:
    """A Hugging Face model class built from a config dict, as the recorder checks it and a
    replay rebuilds it: ``cls(cls.config_class.from_dict(config))``. NoConfigClass when the
    class has no ``config_class`` (it is no PreTrainedModel)."""
    config_class = getattr(cls, "config_class", None)
    if config_class is None:
        raise NoConfigClass("has no config_class (a Hugging Face PreTrainedModel has)")
    return cls(config_class.from_dict(dict(config)))


def dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    return {"half": "float16", "float": "float32", "double": "float64"}.get(name, name)


def class_path(obj: Any) -> str:
    cls = type(obj)
    # Prefer the public alias (torch.optim.Adam) over the defining module (torch.optim.adam).
    public = cls.__module__.rsplit(".", 1)[0]
    with contextlib.suppress(ImportError):
        if getattr(importlib.import_module(public), cls.__qualname__, None) is cls:
            return f"{public}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def hparams_json(value: Any) -> Any:
    """Optimizer hyperparameters as JSON: tuples become lists, tensors numbers."""
    if isinstance(value, Mapping):
        return {str(k): hparams_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [hparams_json(v) for v in value]
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        return hparams_json(value.item())
    return repr(value)


def write_json(path: str, data: Mapping[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=False, allow_nan=False)
        fh.write("\n")

