"""Policy-gradient losses. Every one is a *surrogate*: a scalar whose gradient is the estimator.

- ``reinforce_loss``: −mean(log π(a|s) · weight), the vanilla policy-gradient surrogate (lesson 01).
- ``clipped_surrogate_loss``: PPO's (and GRPO's) pessimistic clipped objective, with statistics.
- ``value_loss``: squared error of V, optionally clipped around the old values.
- ``kl_estimate``: per-sample estimators k1, k2, k3 of KL(π ‖ π_ref) from samples of π.
- ``aggregate``: masked reductions (global token mean, per-sequence mean, constant normaliser).
- ``token_logprobs``: log-probabilities of the next tokens of a sequence under a language model.
"""

from __future__ import annotations

from typing import Literal

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


AGGREGATIONS = ("mean", "seq_mean", "sum_norm")


def aggregate(values: torch.Tensor, mask: torch.Tensor | None = None, mode: str = "mean",
              norm: float | None = None) -> torch.Tensor:
    """Reduce per-element values (e.g. per-token losses ``[B, T]``) to a scalar, counting only ``mask``.

    - ``"mean"``: Σ mask·x / Σ mask — every valid element weighs the same (PPO; DAPO's token mean).
    - ``"seq_mean"``: the mean over rows of each row's masked mean — every sequence weighs the same
      (DeepSeekMath's GRPO). Needs ``[B, T]`` values.
    - ``"sum_norm"``: Σ mask·x / ``norm`` with a constant ``norm`` (Dr. GRPO), so the weight of a
      token does not depend on how long its sequence or batch happened to be.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"mode must be one of {AGGREGATIONS}, got {mode!r}")
    if mask is None:
        mask = torch.ones_like(values, dtype=torch.bool)
    check_same_shape(values, mask, "values", "mask")
    m = mask.to(values.dtype)
    if mode == "mean":
        count = m.sum()
        if count == 0:
            raise ValueError("aggregate: the mask selects no element")
        return (values * m).sum() / count
    if mode == "seq_mean":
        if values.ndim != 2:
            raise ValueError(f"seq_mean needs [B, T] values, got shape {tuple(values.shape)}")
        lengths = m.sum(-1)
        if (lengths == 0).any():
            raise ValueError("seq_mean: a sequence has no valid element (empty mask row)")
        return ((values * m).sum(-1) / lengths).mean()
    if norm is None or norm <= 0:
        raise ValueError("sum_norm needs a positive constant norm (e.g. batch size × max length)")
    return (values * m).sum() / norm


def clipped_surrogate_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    mask: torch.Tensor | None = None,
    agg: str = "mean",
    norm: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate as a loss to minimise (Schulman et al. 2017, arXiv:1707.06347, eq. 7).

    ``ratio = exp(logp − old_logp)`` and, per element,
    ``loss = −min(ratio·A, clip(ratio, 1 − ε_low, 1 + ε_high)·A)``. The min makes it a pessimistic
    bound: once the ratio has moved past the clip in the direction the advantage rewards (A > 0 and
    ratio > 1 + ε_high, or A < 0 and ratio < 1 − ε_low), the gradient is exactly zero; moves that
    make the objective worse are never clipped.

    Args:
        logp: log π_θ(a|s) under the current parameters, e.g. ``[N]`` or ``[B, T]`` (tokens).
        old_logp: log-probs under the policy that sampled the data (no gradient needed), same shape.
        advantages: same shape as ``logp``, or one per row (``[B]`` for ``[B, T]``), broadcast over T.
        clip_eps: ε_low; ``clip_eps_high`` defaults to it (DAPO's "clip-higher" raises it).
        mask: which elements count (e.g. completion tokens), same shape as ``logp``.
        agg, norm: how to reduce, see :func:`aggregate`.

    Returns:
        ``(loss, stats)``, stats being floats over the valid elements: ``clip_frac`` (share of
        elements whose gradient the clip removed), ``clip_frac_low``, ``clip_frac_high``,
        ``ratio_mean``, ``ratio_min``, ``ratio_max`` and ``approx_kl`` (k3 estimate of KL(old ‖ new)).
    """
    check_same_shape(logp, old_logp, "logp", "old_logp")
    if advantages.ndim == logp.ndim - 1 and advantages.shape == logp.shape[:-1]:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    check_same_shape(logp, advantages, "logp", "advantages")
    check_finite(advantages, "advantages")
    if mask is not None:
        check_same_shape(logp, mask, "logp", "mask")
        mask = mask.to(torch.bool)
    eps_low = float(clip_eps)
    eps_high = eps_low if clip_eps_high is None else float(clip_eps_high)
    if eps_low < 0 or eps_high < 0 or eps_low >= 1:
        raise ValueError(f"clip ranges must satisfy 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")

    per_element, ratio = clipped_surrogate_terms(logp, old_logp, advantages, eps_low, eps_high)
    loss = aggregate(per_element, mask, agg, norm)
    stats = clip_statistics(ratio, advantages, eps_low, eps_high, mask)
    return loss, stats


def clipped_surrogate_terms(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                            eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element ``−min(ratio·A, clip(ratio, 1 − ε_low, 1 + ε_high)·A)`` and the ratio (no checks;
    :func:`clipped_surrogate_loss` validates). Trainers that weight elements themselves use this."""
    advantages = advantages.detach()
    ratio = torch.exp(logp - old_logp.detach())
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    return -torch.min(unclipped, clipped), ratio


@torch.no_grad()
def clip_statistics(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float,
                    mask: torch.Tensor | None = None) -> dict[str, float]:
    """Clip fractions, ratio min/mean/max and the k3 approx KL(old ‖ new) over the valid elements."""
    r, a = ratio.detach(), advantages.detach().expand_as(ratio)
    if mask is not None:
        r, a = r[mask.to(torch.bool)], a[mask.to(torch.bool)]
    lr = torch.log(r)
    low = ((r < 1.0 - eps_low) & (a < 0)).float().mean()
    high = ((r > 1.0 + eps_high) & (a > 0)).float().mean()
    # one host sync for all statistics (they are logged every minibatch)
    values = torch.stack([low, high, r.mean(), r.min(), r.max(), ((r - 1.0) - lr).mean()]).tolist()
    names = ("clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_min", "ratio_max", "approx_kl")
    stats = dict(zip(names, values))
    stats["clip_frac"] = stats["clip_frac_low"] + stats["clip_frac_high"]
    return stats


def value_loss(values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor | None = None,
               clip_eps: float | None = None) -> torch.Tensor:
    """``0.5 · mean((V − R)²)``; with ``old_values`` and ``clip_eps``, PPO's clipped variant
    ``0.5 · mean(max((V − R)², (old + clip(V − old, ±ε) − R)²))`` (as in OpenAI baselines' ppo2)."""
    check_same_shape(values, returns, "values", "returns")
    returns = returns.detach()
    err = (values - returns) ** 2
    if clip_eps is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values")
        check_same_shape(values, old_values, "values", "old_values")
        old = old_values.detach()
        clipped = old + torch.clamp(values - old, -clip_eps, clip_eps)
        err = torch.max(err, (clipped - returns) ** 2)
    return 0.5 * err.mean()


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: Literal["k1", "k2", "k3"] = "k3") -> torch.Tensor:
    """Per-sample estimates of KL(π ‖ π_ref) from actions sampled from π (J. Schulman, "Approximating
    KL divergence", 2020). With ``log ρ = ref_logp − logp``:

    - ``k1 = −log ρ``: unbiased, high variance, negative for some samples.
    - ``k2 = ½ (log ρ)²``: biased (exact to second order), low variance, ≥ 0.
    - ``k3 = (ρ − 1) − log ρ``: unbiased and ≥ 0 for every sample (GRPO's choice).
    """
    check_same_shape(logp, ref_logp, "logp", "ref_logp")
    log_rho = ref_logp - logp
    if kind == "k1":
        return -log_rho
    if kind == "k2":
        return 0.5 * log_rho**2
    if kind == "k3":
        return torch.expm1(log_rho) - log_rho
    raise ValueError(f"kind must be 'k1', 'k2' or 'k3', got {kind!r}")


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each next token: ``out[:, t] = log softmax(logits[:, t] / T)[input_ids[:, t + 1]]``.

    A causal LM's logits at position t predict token t + 1, so the last position has no target and
    the first token has no log-prob: the result is ``[B, T − 1]``. ``temperature`` must be the one
    used for sampling, or the "same" policy scores its own samples differently (lesson 07).

    Computed as ``gathered logit − logsumexp`` to avoid materialising a full ``[B, T, V]``
    log-softmax next to the logits.
    """
    if logits.ndim != 3 or input_ids.ndim != 2 or logits.shape[:2] != input_ids.shape:
        raise ValueError(f"token_logprobs expects logits [B, T, V] and input_ids [B, T]; got "
                         f"{tuple(logits.shape)} and {tuple(input_ids.shape)}")
    if input_ids.shape[1] < 2:
        raise ValueError("token_logprobs needs sequences of at least 2 tokens (nothing to predict otherwise)")
    return aligned_logprobs(logits[:, :-1], input_ids[:, 1:], temperature)


def aligned_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``out[:, t] = log softmax(logits[:, t] / T)[targets[:, t]]``: logits already aligned with their targets."""
    if logits.ndim != 3 or targets.ndim != 2 or logits.shape[:2] != targets.shape:
        raise ValueError(f"aligned_logprobs expects logits [B, T, V] and targets [B, T]; got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scaled = logits
    if scaled.dtype in (torch.float16, torch.bfloat16):
        scaled = scaled.float()  # log-softmax in at least float32; float64 stays float64
    scaled = scaled / temperature
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
