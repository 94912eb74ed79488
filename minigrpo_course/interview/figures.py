"""Exact numbers behind the interview answers, computed with the package's own functions.

The bank quotes figures (how much the group std up-weights a hard prompt, where attention's share of
a layer's FLOPs passes one half, how large a KV cache is); the tests recompute each one here and
check that the text says the same thing. The derivation drills reuse these functions as their
answer key. torch is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from math import comb


def group_weight(p: float, group_size: int, scale: str = "group") -> float:
    """w_G(p): the expected GRPO update of one prompt, in units of ∇p (lesson 05, §4a).

    With a 0/1 reward and success probability ``p``, the expected update of a prompt at ratio 1 is
    ``w_G(p)·∇p`` with ``w_G(p) = E[Â_1 | r_1 = 1] − E[Â_1 | r_1 = 0]``. Computed exactly: for every
    count m of successes among the other G − 1 answers (binomial), the advantage of answer 1 from
    :func:`minigrpo.advantages.group_advantages`.
    """
    import torch

    from minigrpo.advantages import group_advantages

    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
    G = group_size
    total = 0.0
    for r1 in (0.0, 1.0):
        for m in range(G):
            rewards = torch.tensor([r1] + [1.0] * m + [0.0] * (G - 1 - m), dtype=torch.float64)
            a1 = group_advantages(rewards, G, scale=scale)[0].item()
            total += (1.0 if r1 else -1.0) * comb(G - 1, m) * p**m * (1 - p) ** (G - 1 - m) * a1
    return total


def group_weight_ratio(p: float, group_size: int) -> float:
    """How much a prompt solved with probability ``p`` weighs against a p = 0.5 prompt (group std)."""
    return group_weight(p, group_size) / group_weight(0.5, group_size)


def group_weight_ceiling_ratio(group_size: int) -> float:
    """The largest weight ratio at any p: (G − 1)/√G (a lone success, p → 0) against w_G(0.5)."""
    return (group_size - 1) / math.sqrt(group_size) / group_weight(0.5, group_size)


def group_weight_limit_ratio(p: float) -> float:
    """The G → ∞ limit of :func:`group_weight_ratio`: 1/√(p(1 − p)) against 2."""
    return 1.0 / math.sqrt(p * (1 - p)) / 2.0


def lone_success_advantages(group_size: int) -> tuple[float, float]:
    """(advantage of the success, advantage of each failure) in a group with exactly one success."""
    import torch

    from minigrpo.advantages import group_advantages

    rewards = torch.tensor([1.0] + [0.0] * (group_size - 1), dtype=torch.float64)
    adv = group_advantages(rewards, group_size)
    return adv[0].item(), adv[1].item()


def p_mixed(p: float, group_size: int) -> float:
    """Probability that a group of 0/1 rewards holds both a success and a failure."""
    return 1.0 - p**group_size - (1.0 - p) ** group_size


#: per token and layer, the projections (4·d²) and a 4×-wide MLP (8·d²) cost 2·12·d² FLOPs
MATMUL_FLOPS_PER_TOKEN = 24


def attention_flops_per_token(n: int, d_model: int) -> int:
    """Causal attention per token and layer: scores and weighted sum over about n/2 keys, 2 FLOPs
    per multiply-add: 2·n·d_model (lesson 10, §5)."""
    return 2 * n * d_model


def attention_half_length(d_model: int) -> int:
    """The context length at which causal attention costs as much as the rest of the layer:
    2·n·d = 24·d² gives n = 12·d_model."""
    return MATMUL_FLOPS_PER_TOKEN * d_model // 2


def trpo_step_size(x, Fx, max_kl: float) -> float:
    """β = √(2δ / xᵀFx): the step length along x = F⁻¹g that puts the quadratic KL model on the
    trust-region boundary ½(βx)ᵀF(βx) = δ."""
    import torch

    x, Fx = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(Fx, dtype=torch.float64)
    xFx = float(x @ Fx)
    if xFx <= 0:
        raise ValueError(f"xᵀFx must be > 0 (F is positive definite), got {xFx}")
    return math.sqrt(2 * max_kl / xFx)
