"""Lesson 05's length-bias toy: which completion length does GRPO's loss aggregation favour?

A completion is an *answer token* then a continuation. Whether the answer is right is decided by a coin
the policy does not control (p = 0.5: "the reasoning worked or it did not"), and the policy knows which:
it continues with probability ``σ(c_right)`` after a right answer, ``σ(c_wrong)`` after a wrong one, and
stops (or is cut at ``max_len``). Reward = 1 for a right answer, whatever the length. The length is then
irrelevant to the expected reward, so the true policy gradient of ``c`` is zero in expectation: any drift
of the lengths comes from the aggregation. DeepSeekMath's per-sequence mean (``seq_mean``) weights each
token of completion i by ``1/|o_i|``; Dr. GRPO's constant normaliser (``sum_norm``) and DAPO's token mean
(``mean``) do not.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from minigrpo.advantages import group_advantages
from minigrpo.losses import clipped_surrogate_loss


def expected_length(continue_logit: torch.Tensor | float, max_len: int) -> torch.Tensor:
    """E[continuation tokens] when each step continues with prob q = σ(logit), at least 1, at most max_len:
    ``Σ_{k<max_len} q^k = (1 − q^max_len) / (1 − q)``."""
    q = torch.sigmoid(torch.as_tensor(continue_logit, dtype=torch.float64))
    return ((q[..., None] ** torch.arange(max_len, dtype=torch.float64)).sum(-1))


def sample_group(logits: torch.Tensor, n: int, max_len: int, gen: torch.Generator):
    """``n`` completions: rewards ``[n]`` (1 = right answer), token log-probs ``[n, 1 + max_len]`` (with grad
    through ``logits = [c_right, c_wrong]``) and the mask of real tokens (answer token included)."""
    right = torch.bernoulli(torch.full((n,), 0.5), generator=gen)
    q = torch.sigmoid(logits.detach())[(1 - right).long()]                  # continue prob of each completion
    cont = torch.rand(n, max_len - 1, generator=gen) < q[:, None]
    length = 1 + torch.cumprod(cont.long(), 1).sum(1)                      # continuation tokens, 1..max_len
    pos = torch.arange(max_len)[None, :]
    c = logits[(1 - right).long()][:, None]
    step = torch.where(pos < length[:, None] - 1, torch.nn.functional.logsigmoid(c),   # continue
                       torch.nn.functional.logsigmoid(-c))                            # stop
    step = torch.where(pos == max_len - 1, torch.zeros_like(step), step)   # cut at max_len: no stop token
    answer = torch.full((n, 1), math.log(0.5))                              # the coin: no parameter
    logp = torch.cat([answer, step], 1)
    mask = torch.cat([torch.ones(n, 1, dtype=torch.bool), pos < length[:, None]], 1)
    return right, logp, mask


def train_lengths(agg: str, seed: int, steps: int = 300, n_prompts: int = 16, G: int = 8, max_len: int = 64,
                  lr: float = 0.02, init_continue: float = 0.9) -> np.ndarray:
    """One Adam step per batch of ``n_prompts × G`` completions with ``clipped_surrogate_loss(agg=...)``
    (``sum_norm``: norm = batch size × (1 + max_len)). Returns ``[steps + 1, 2]``: the exact expected
    continuation length after a right answer and after a wrong one, before each step and at the end."""
    gen = torch.Generator().manual_seed(seed)
    logit0 = math.log(init_continue / (1 - init_continue))
    logits = torch.full((2,), logit0, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=lr)
    n = n_prompts * G
    history = [expected_length(logits.detach(), max_len).numpy()]
    for _ in range(steps):
        right, logp, mask = sample_group(logits, n, max_len, gen)
        adv = group_advantages(right, G)
        norm = n * (1 + max_len) if agg == "sum_norm" else None
        loss, _ = clipped_surrogate_loss(logp, logp.detach(), adv, 0.2, mask=mask, agg=agg, norm=norm)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(expected_length(logits.detach(), max_len).numpy())
    return np.stack(history)
