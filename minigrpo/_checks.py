"""Input validation shared by the package: clear errors instead of silent NaNs or broadcasting."""

from __future__ import annotations

from typing import Any

import torch


def as_float_tensor(x: Any, name: str) -> torch.Tensor:
    """``x`` as a floating tensor (keeps float64; ints, bools, lists and arrays become float32)."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    if not t.is_floating_point():
        t = t.to(torch.float32)
    return t


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise a ValueError naming the first NaN/inf entry of ``t``."""
    bad = ~torch.isfinite(t)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} contains NaN or inf (first at index {idx}: {t[idx].item()})")


def check_same_shape(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_gamma(gamma: float, name: str = "gamma") -> float:
    gamma = float(gamma)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {gamma}")
    return gamma
