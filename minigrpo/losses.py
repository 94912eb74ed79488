"""Policy-gradient losses. Every one is a *surrogate*: a scalar whose gradient is the estimator.

- ``reinforce_loss``: −mean(log π(a|s) · weight), the vanilla policy-gradient surrogate (lesson 01).
- ``clipped_surrogate_loss``: PPO's pessimistic clipped objective, with statistics.
- ``grpo_loss``: GRPO's objective, shared by the LLM trainer (per token), the diffusion trainer (per
  denoising step) and lesson 07's teaching step: the clipped surrogate, optionally importance-weighted,
  plus β·KL to a reference, reduced by ``loss_type`` (TRL's names) and returned with its statistics.
- ``value_loss``: squared error of V, optionally clipped around the old values.
- ``kl_estimate``: per-sample estimators k1, k2, k3 of KL(π ‖ π_ref) from samples of π.
- ``aggregate``: the masked reductions, the one place that knows them (``loss_weights`` for TRL's).
- ``token_logprobs``: log-probabilities of the next tokens of a sequence under a language model;
  ``selective_log_softmax``: the same per chunk of positions, with entropy, in bounded memory.
"""

from __future__ import annotations

from typing import Literal

import torch

from minigrpo.infra.checks import check_finite, check_same_shape


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
#: GRPO's reductions, with TRL's names (``GRPOConfig.loss_type``).
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def loss_weights(mask: torch.Tensor, loss_type: str, num_sequences: int | None = None, num_tokens: int | None = None,
                 max_completion_length: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-element weights ``mask / Z`` whose sum against per-token losses is a micro-batch's share of the loss.

    - ``"grpo"``: ``Z = (tokens of the row) × num_sequences``: each row's mean, then the mean over rows.
    - ``"dapo"``: ``Z = num_tokens``: one mean over every completion token of the batch.
    - ``"dr_grpo"``: ``Z = num_sequences × max_completion_length``, a constant (no length dependence).

    Pass ``num_sequences`` and ``num_tokens`` counted over the *whole* batch and the micro-batches' losses add up
    exactly to the full batch's: gradient accumulation changes nothing. Left ``None``, they are this mask's
    (rows, valid elements, columns). ``"bnpo"`` has no weights of its own: see :func:`aggregate`.
    """
    if loss_type not in ("grpo", "dapo", "dr_grpo"):
        raise ValueError(f"loss_weights: loss_type must be 'grpo', 'dapo' or 'dr_grpo', got {loss_type!r}")
    if mask.ndim != 2:
        raise ValueError(f"loss_weights: the mask must be [B, T], got shape {tuple(mask.shape)}")
    num_sequences = mask.shape[0] if num_sequences is None else num_sequences
    m = mask.to(dtype)
    if loss_type == "grpo":
        return m / m.sum(-1, keepdim=True).clamp(min=1) / num_sequences
    if loss_type == "dapo":
        num_tokens = int(mask.sum()) if num_tokens is None else num_tokens
        return m / max(num_tokens, 1)
    max_completion_length = mask.shape[1] if max_completion_length is None else max_completion_length
    return m / (num_sequences * max_completion_length)


def aggregate(values: torch.Tensor, mask: torch.Tensor | None = None, mode: str = "mean",
              norm: float | None = None, *, num_sequences: int | None = None, num_tokens: int | None = None,
              max_completion_length: int | None = None, gradient_accumulation_steps: int = 1) -> torch.Tensor:
    """Reduce per-element values (e.g. per-token losses ``[B, T]``) to a scalar, counting only ``mask``.

    One batch at a time (PPO, the lessons):

    - ``"mean"``: Σ mask·x / Σ mask — every valid element weighs the same (PPO; DAPO's token mean).
    - ``"seq_mean"``: the mean over rows of each row's masked mean — every sequence weighs the same
      (DeepSeekMath's GRPO). Needs ``[B, T]`` values.
    - ``"sum_norm"``: Σ mask·x / ``norm`` with a constant ``norm`` (Dr. GRPO), so the weight of a
      token does not depend on how long its sequence or batch happened to be.

    GRPO's ``loss_type`` with TRL's names, for a micro-batch of a batch split for gradient accumulation:

    - ``"grpo"``, ``"dapo"``, ``"dr_grpo"``: Σ x · :func:`loss_weights` — the same three reductions, with
      normalisers (``num_sequences``, ``num_tokens``, ``max_completion_length``) counted over the whole batch,
      so the micro-batches' losses sum to the full batch's.
    - ``"bnpo"``: the local ``"mean"`` (Σ mask·x / Σ mask over *this* micro-batch's tokens) divided by
      ``gradient_accumulation_steps``, as TRL does: exact only when every micro-batch has as many tokens.
    """
    if mode in ("grpo", "dapo", "dr_grpo"):
        if mask is None:
            mask = torch.ones_like(values, dtype=torch.bool)
        check_same_shape(values, mask, "values", "mask")
        return (values * loss_weights(mask, mode, num_sequences, num_tokens, max_completion_length,
                                      values.dtype)).sum()
    if mode == "bnpo":
        return aggregate(values, mask, "mean") / gradient_accumulation_steps
    if mode not in AGGREGATIONS:
        raise ValueError(f"mode must be one of {AGGREGATIONS + LOSS_TYPES}, got {mode!r}")
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


def _surrogate_inputs(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      mask: torch.Tensor | None) -> torch.Tensor:
    """Check the shapes of a clipped objective's inputs; return the advantages broadcast to ``logp``
    (one per row, ``[B]`` for ``[B, T]``, is spread over the row)."""
    check_same_shape(logp, old_logp, "logp", "old_logp")
    if advantages.ndim == logp.ndim - 1 and advantages.shape == logp.shape[:-1]:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    check_same_shape(logp, advantages, "logp", "advantages")
    check_finite(advantages, "advantages")
    if mask is not None:
        check_same_shape(logp, mask, "logp", "mask")
    return advantages


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
    advantages = _surrogate_inputs(logp, old_logp, advantages, mask)
    if mask is not None:
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


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    loss_type: str = "bnpo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    *,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: str = "k3",
    kl: torch.Tensor | None = None,
    importance_weights: torch.Tensor | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    max_completion_length: int | None = None,
    gradient_accumulation_steps: int = 1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's objective as a loss to minimise, per element (a token of a completion, a step of a denoising chain).

    ``ρ = exp(logp − old_logp)``; per element
    ``ℓ = −w · min(ρ·A, clip(ρ, 1 − ε, 1 + ε_high)·A) + β · KL``, reduced by ``loss_type`` (:func:`aggregate`).

    Args:
        logp: log π_θ with gradient, ``[B, T]`` (tokens) or ``[N]`` (denoising steps).
        old_logp: log π_old of the policy that sampled (detached here), same shape.
        advantages: same shape, or one per row (``[B]`` for ``[B, T]``), broadcast over the row.
        mask: which elements count, same shape as ``logp`` (None: all).
        loss_type: ``"grpo"``, ``"bnpo"``, ``"dr_grpo"`` or ``"dapo"`` (TRL's names; see :func:`aggregate`).
        epsilon, epsilon_high: the clip range ``[1 − ε, 1 + ε_high]`` (ε_high defaults to ε).
        ref_logp, beta, kl_estimator: a KL penalty ``β · k(logp, ref_logp)`` per element, the estimator
            ``k1``/``k2``/``k3`` of :func:`kl_estimate`; or ``kl``: a per-element KL computed by the caller
            (e.g. the exact KL of two Gaussians), used instead.
        importance_weights: detached per-element weights ``w`` of the surrogate only, not of the KL (truncated
            importance sampling of a sampler/trainer mismatch, TRL's ``token_truncate``).
        num_sequences, num_tokens, max_completion_length, gradient_accumulation_steps: the normalisers of the
            whole batch when this is one micro-batch of several (gradient accumulation stays exact).

    Returns:
        ``(loss, stats)`` with floats over the valid elements, named as TRL logs them where TRL has the quantity:
        ``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean`` (share of elements whose
        gradient the clip removed, below / above / either), ``ratio_mean``, ``ratio_min``, ``ratio_max``,
        ``approx_kl`` (k3 of KL(old ‖ new)), ``log_ratio_abs_max`` and, with a KL term, ``kl`` (its mean).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    advantages = _surrogate_inputs(logp, old_logp, advantages, mask)
    eps_high = epsilon if epsilon_high is None else epsilon_high
    if not (0 <= epsilon < 1 and eps_high >= 0):
        raise ValueError(f"epsilon must be in [0, 1) and epsilon_high >= 0, got {epsilon} and {eps_high}")
    if kl is None and ref_logp is not None:
        kl = kl_estimate(logp, ref_logp, kl_estimator)
    if kl is not None:
        check_same_shape(logp, kl, "logp", "kl")

    per_element, ratio = clipped_surrogate_terms(logp, old_logp, advantages, epsilon, eps_high)
    if importance_weights is not None:
        check_same_shape(logp, importance_weights, "logp", "importance_weights")
        per_element = per_element * importance_weights.detach()
    if kl is not None:
        per_element = per_element + beta * kl
    loss = aggregate(per_element, mask, loss_type, num_sequences=num_sequences, num_tokens=num_tokens,
                     max_completion_length=max_completion_length,
                     gradient_accumulation_steps=gradient_accumulation_steps)
    return loss, grpo_statistics(logp, old_logp, ratio, advantages, epsilon, eps_high, mask, kl)


@torch.no_grad()
def grpo_statistics(logp, old_logp, ratio, advantages, eps_low: float, eps_high: float, mask=None,
                    kl=None) -> dict[str, float]:
    """:func:`grpo_loss`'s statistics (TRL's names where TRL logs the quantity)."""
    s = clip_statistics(ratio, advantages, eps_low, eps_high, mask)
    stats = {"clip_ratio/low_mean": s["clip_frac_low"], "clip_ratio/high_mean": s["clip_frac_high"],
             "clip_ratio/region_mean": s["clip_frac"], "ratio_mean": s["ratio_mean"], "ratio_min": s["ratio_min"],
             "ratio_max": s["ratio_max"], "approx_kl": s["approx_kl"]}
    log_ratio = (logp - old_logp).abs()
    stats["log_ratio_abs_max"] = (log_ratio if mask is None else log_ratio[mask.to(torch.bool)]).max().item()
    if kl is not None:
        kl = kl.detach()
        if mask is None:
            stats["kl"] = kl.mean().item()
        else:
            m = mask.to(kl.dtype)
            stats["kl"] = ((kl * m).sum() / m.sum().clamp(min=1)).item()
    return stats


def truncated_importance_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor,
                                 clip_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, log_w)``: ``w = min(exp(trainer_logp − sampler_logp), clip_max)``, detached, and the log-ratio.

    The weight that turns tokens sampled by another engine (μ) into an estimate under the trainer's π_old,
    truncated at ``clip_max`` to bound its variance (lesson 07)."""
    log_w = trainer_logp.detach() - sampler_logp.detach()
    return torch.exp(log_w).clamp(max=clip_max), log_w


IS_LEVELS = ("sum", "mean")


def sequence_importance_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                                level: str = "sum", clip_max: float | None = None,
                                band: tuple[float, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence-level importance weights of a sampler/trainer mismatch: ``(w [B], log_w [B])``, detached.

    ``log_w`` is the completion's summed token log-ratio ``Σ_t m_t (trainer_t − sampler_t)`` (``level="sum"``: the
    ratio of the two sequence probabilities, the exact importance weight of a sequence-level objective) or its mean
    over the completion's tokens (``level="mean"``: the geometric mean of the token ratios, which does not grow
    with length; GSPO's normalisation). ``w = exp(log_w)``, then:

    - ``clip_max``: truncated at ``clip_max`` (sequence-level TIS);
    - ``band=(lo, hi)``: sequences whose untruncated ratio leaves ``[lo, hi]`` get weight 0 (masked importance
      sampling: such a sequence is dropped from the loss instead of down-weighted).

    Broadcast over the tokens (``w[:, None]``) it is ``grpo_loss``'s ``importance_weights``. A row with no token
    gets ``log_w = 0`` (weight 1)."""
    if level not in IS_LEVELS:
        raise ValueError(f"sequence_importance_weights: level must be one of {IS_LEVELS}, got {level!r}")
    check_same_shape(trainer_logp, sampler_logp, "trainer_logp", "sampler_logp")
    check_same_shape(trainer_logp, mask, "trainer_logp", "mask")
    if trainer_logp.ndim != 2:
        raise ValueError(f"sequence_importance_weights: the log-probs must be [B, T], got {tuple(trainer_logp.shape)}")
    if clip_max is not None and not clip_max > 0:
        raise ValueError(f"sequence_importance_weights: clip_max must be > 0, got {clip_max}")
    if band is not None and not (len(band) == 2 and 0 <= band[0] < band[1]):
        raise ValueError(f"sequence_importance_weights: band must be (lo, hi) with 0 <= lo < hi, got {band}")
    m = mask.to(trainer_logp.dtype)
    log_w = ((trainer_logp.detach() - sampler_logp.detach()) * m).sum(-1)
    if level == "mean":
        log_w = log_w / m.sum(-1).clamp(min=1)
    w = torch.exp(log_w)
    if band is not None:
        w = torch.where((w >= band[0]) & (w <= band[1]), w, torch.zeros_like(w))
    if clip_max is not None:
        w = w.clamp(max=clip_max)
    return w, log_w


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

    Computed as ``gathered logit − logsumexp``, chunk by chunk (:func:`selective_log_softmax`), so no full
    ``[B, T, V]`` log-softmax (or float32 copy of bf16 logits) is made next to the logits.
    """
    if logits.ndim != 3 or input_ids.ndim != 2 or logits.shape[:2] != input_ids.shape:
        raise ValueError(f"token_logprobs expects logits [B, T, V] and input_ids [B, T]; got "
                         f"{tuple(logits.shape)} and {tuple(input_ids.shape)}")
    if input_ids.shape[1] < 2:
        raise ValueError("token_logprobs needs sequences of at least 2 tokens (nothing to predict otherwise)")
    return aligned_logprobs(logits[:, :-1], input_ids[:, 1:], temperature)


def aligned_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``out[:, t] = log softmax(logits[:, t] / T)[targets[:, t]]``: logits already aligned with their targets.

    Computed by :func:`selective_log_softmax`, chunk by chunk: no ``[B, T, V]`` float32 tensor is made."""
    if logits.ndim != 3 or targets.ndim != 2 or logits.shape[:2] != targets.shape:
        raise ValueError(f"aligned_logprobs expects logits [B, T, V] and targets [B, T]; got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    return selective_log_softmax(logits, targets, temperature)


#: Elements of the float32 working copy that :func:`selective_log_softmax` makes per chunk (2^24: 64 MiB):
#: ~110 positions of a 152k vocabulary (Qwen2.5), the whole batch of a 55-token one.
LOGPROB_CHUNK_ELEMENTS = 2**24


def selective_log_softmax(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                          with_entropy: bool = False, chunk_elements: int = LOGPROB_CHUNK_ELEMENTS):
    """``log softmax(logits / T)[targets]`` per position, in bounded memory; optionally the entropy too.

    ``logits`` is ``[..., V]`` in any float dtype (bf16 from a bf16 model), ``targets`` ``[...]``. The positions
    are processed in chunks of ``chunk_elements // V``: each chunk is upcast to float32 (float64 stays float64)
    and its log-prob taken as *gathered logit − logsumexp*, so the only full-size tensor is the logits themselves
    (no ``[B, C, V]`` float32 log-softmax, the tens of GB of a 512-token, 150k-vocabulary batch).

    The gradient is written by hand (:class:`_SelectiveLogSoftmax`), chunk by chunk as well:
    ``∂ logp / ∂ logits = (onehot(target) − softmax(logits / T)) / T``; it saves only the logits and one
    logsumexp per position (autograd would keep every chunk's float32 copy alive until backward).

    Returns ``logp`` (``[...]``, float32 or float64), or ``(logp, entropy)`` with ``with_entropy``: the entropy
    of the temperature-scaled distribution per position, without gradient (a metric).

    Measured on an H100, bf16 logits ``[32, 256, 151936]`` (Qwen2.5's vocabulary), forward and backward: 2.6 GiB
    above the logits (2.5 of which is their bf16 gradient), against 13.9 GiB for ``log_softmax(logits.float())``.
    """
    if logits.ndim < 1 or logits.shape[:-1] != targets.shape:
        raise ValueError(f"selective_log_softmax expects logits [..., V] and targets [...]; got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rows = max(1, int(chunk_elements) // max(logits.shape[-1], 1))
    logp, entropy = _SelectiveLogSoftmax.apply(logits, targets, float(temperature), rows, with_entropy)
    return (logp, entropy) if with_entropy else logp


def _blocks(B: int, T: int, rows: int):
    """``(batch slice, position slice)`` blocks of a ``[B, T]`` grid, about ``rows`` positions each (whole rows of
    the batch when they fit), so a non-contiguous ``[B, T, V]`` view (``logits[:, :-1]``) is never copied whole."""
    if rows >= T:
        step = rows // max(T, 1)
        for b in range(0, B, step):
            yield slice(b, b + step), slice(None)
    else:
        for b in range(B):
            for t in range(0, T, rows):
                yield slice(b, b + 1), slice(t, t + rows)


class _SelectiveLogSoftmax(torch.autograd.Function):
    """Forward and backward of :func:`selective_log_softmax` over about ``rows`` positions at a time."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, rows, with_entropy):
        shape, V = targets.shape, logits.shape[-1]
        x3 = logits.reshape(-1, *logits.shape[-2:]) if logits.ndim >= 2 else logits.view(1, 1, V)  # [B, T, V]
        t3 = targets.reshape(x3.shape[:2]).unsqueeze(-1)  # [B, T, 1]
        work = torch.promote_types(logits.dtype, torch.float32)
        lse = torch.empty(x3.shape[:2], dtype=work, device=logits.device)
        logp, entropy = torch.empty_like(lse), (torch.empty_like(lse) if with_entropy else lse.new_empty(0))
        for b, t in _blocks(*x3.shape[:2], rows):
            x = x3[b, t].to(work) / temperature  # the block's float32 copy
            lse[b, t] = torch.logsumexp(x, -1)
            logp[b, t] = x.gather(-1, t3[b, t]).squeeze(-1) - lse[b, t]
            if with_entropy:  # H = logsumexp(x) − Σ softmax(x)·x
                entropy[b, t] = lse[b, t] - (torch.softmax(x, -1) * x).sum(-1)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        logp, entropy = logp.view(shape), (entropy.view(shape) if with_entropy else entropy)
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        logits, targets, lse = ctx.saved_tensors
        T = ctx.temperature
        x3 = logits.reshape(-1, *logits.shape[-2:]) if logits.ndim >= 2 else logits.view(1, 1, -1)
        t3, g3 = targets.reshape(lse.shape).unsqueeze(-1), grad_logp.reshape(lse.shape).unsqueeze(-1).to(lse.dtype)
        grad = torch.empty(x3.shape, dtype=logits.dtype, device=logits.device)
        for b, t in _blocks(*lse.shape, ctx.rows):
            p = torch.exp(x3[b, t].to(lse.dtype) / T - lse[b, t].unsqueeze(-1))  # softmax(x / T)
            d = (-p * g3[b, t]).scatter_add_(-1, t3[b, t], g3[b, t])  # g · (onehot(target) − p)
            grad[b, t] = (d / T).to(grad.dtype)
        return grad.view(logits.shape), None, None, None, None
