"""Policy-gradient losses. Every one is a *surrogate*: a scalar whose gradient is the estimator.

- ``reinforce_loss``: −mean(log π(a|s) · weight), the vanilla policy-gradient surrogate (lesson 01).
"""

from __future__ import annotations

import torch

from minigrpo._checks import check_finite, check_same_shape


def reinforce_loss(logp: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The REINFORCE surrogate loss ``−mean_t(log π(a_t|s_t) · w_t)``.

    Minimising it takes a step along the policy-gradient estimate ``mean_t ∇log π(a_t|s_t) · w_t``.
    The weights (reward-to-go, or reward-to-go minus a baseline) are **detached**: they score the
    actions, they are not something to differentiate (a learned baseline is trained by its own loss).

    Args:
        logp: log-probabilities of the taken actions, any shape (typically ``[N]`` for N steps).
        weights: same shape as ``logp``.

    Returns:
        A scalar tensor. Its value is not the return; only its gradient means something.
    """
    if not isinstance(logp, torch.Tensor) or not isinstance(weights, torch.Tensor):
        raise TypeError("reinforce_loss expects two tensors: logp and weights")
    check_same_shape(logp, weights, "logp", "weights")
    if logp.numel() == 0:
        raise ValueError("reinforce_loss got empty tensors: there is no step to learn from")
    check_finite(weights, "weights")
    return -(logp * weights.detach()).mean()
