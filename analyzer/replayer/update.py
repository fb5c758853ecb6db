"""Why an optimizer step turned finite parameters non-finite.

The explanations follow the update rules: the adaptive optimizers divide by a
running second moment plus ``eps``, so the usual culprits are an ``eps`` that
rounds to zero in the parameter's dtype, a second moment that is zero (or has
underflowed) where the first moment is not, and a step that leaves the dtype's
range. Anything else is reported as what was observed.
"""

from __future__ import annotations

from typing import Any

import torch

# State slots holding the denominator's running average, per optimizer family.
_SECOND_MOMENT = ("exp_avg_sq", "square_avg", "sum", "exp_inf")


def _group_of(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, Any]:
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            return group
    return {}


def explain(optimizer: torch.optim.Optimizer, param: torch.Tensor, before: torch.Tensor,
            grad: torch.Tensor | None) -> str:
    """One sentence on why ``param`` went non-finite in the step just taken."""
    group = _group_of(optimizer, param)
    state = optimizer.state.get(param, {})
    dtype = param.dtype
    finfo = torch.finfo(dtype)
    bad = ~torch.isfinite(param.detach())
    kind = type(optimizer).__name__
    reasons: list[str] = []
    lr = group.get("lr")
    if isinstance(lr, float | int) and not abs(float(lr)) < float("inf"):
        reasons.append(f"the learning rate is {lr}")
    eps = group.get("eps")
    slot = next((s for s in _SECOND_MOMENT if isinstance(state.get(s), torch.Tensor)), None)
    if isinstance(eps, float) and slot is not None:
        denom = state[slot].detach()[bad]
        eps_cast = float(torch.tensor(eps, dtype=dtype))
        zeros = int((denom == 0).sum())
        if eps_cast == 0.0 and eps != 0.0:
            reasons.append(f"{kind}'s eps={eps:g} rounds to 0 in {_name(dtype)} (smallest "
                           f"positive {_name(dtype)} is {finfo.smallest_normal:.3g} normal, "
                           f"{_tiny(dtype):.3g} subnormal)")
        if zeros:
            reasons.append(f"{slot} is 0 at {zeros} of the {int(bad.sum())} elements that "
                           f"went non-finite, so the step divides by sqrt({slot}) + eps "
                           f"= {eps_cast:g}")
        elif denom.numel():
            smallest = float(denom.abs().to(torch.float64).min())
            reasons.append(f"the smallest {slot} there is {smallest:.3g}: the step "
                           f"lr*m/(sqrt(v)+eps) exceeds the {_name(dtype)} maximum {finfo.max:.3g}")
    if not reasons and grad is not None and bool(torch.isfinite(grad).all()):
        step = (param.detach().to(torch.float64) - before.to(torch.float64))
        reasons.append(
            f"parameters and gradients were finite (|p| max {_absmax(before):.3g}, |g| max "
            f"{_absmax(grad):.3g}); the update left the {_name(dtype)} range "
            f"(max {finfo.max:.3g})" if not bool(torch.isfinite(step).all()) else
            "the step produced non-finite values from finite inputs")
    return "; ".join(reasons) or "the step produced non-finite values"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tiny(dtype: torch.dtype) -> float:
    info = torch.finfo(dtype)
    return float(info.smallest_normal) * float(info.eps)


def _absmax(t: torch.Tensor) -> float:
    x = t.detach().to(torch.float64)
    x = x[torch.isfinite(x)]
    return float(x.abs().max()) if x.numel() else float("nan")
