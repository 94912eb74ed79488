"""Exercise 09 — GRPO for diffusion: the per-step Gaussian log-prob, and the loss over recorded chains."""

from __future__ import annotations

import math

import torch

from minigrpo.course.grading.core import Case, Item, WrongAnswer, checked_by

TITLE = "GRPO for diffusion"

# --------------------------------------------------------------------------- 09.1 gaussian_step_logprob


def _check_step(x_prev, mean, std, reduction):
    if x_prev.shape != mean.shape or x_prev.ndim < 2:
        raise ValueError(f"x_prev and mean must both be [B, C, H, W], got {tuple(x_prev.shape)} and {tuple(mean.shape)}")
    if std.shape != (x_prev.shape[0],):
        raise ValueError(f"std must hold one σ per row, shape [B] = [{x_prev.shape[0]}], got {tuple(std.shape)}")
    if (std <= 0).any():
        raise ValueError("std must be > 0: a step with σ = 0 is deterministic and has no density")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")


def _rows(std, x):
    return std.view(-1, *([1] * (x.ndim - 1)))


def _reduce(per_pixel, reduction):
    flat = per_pixel.flatten(1)
    return flat.mean(1) if reduction == "mean" else flat.sum(1)


def gaussian_step_logprob(x_prev, mean, std, reduction="mean"):
    """Reference: log N(x_prev; mean, σ²) per pixel, σ = std[b] for row b, reduced over C, H, W."""
    _check_step(x_prev, mean, std, reduction)
    s = _rows(std, x_prev)
    per_pixel = -((x_prev - mean) ** 2) / (2 * s**2) - torch.log(s) - 0.5 * math.log(2 * math.pi)
    return _reduce(per_pixel, reduction)


def _lp_no_constant(x_prev, mean, std, reduction="mean"):
    s = _rows(std, x_prev)
    return _reduce(-((x_prev - mean) ** 2) / (2 * s**2), reduction)


def _lp_std_as_variance(x_prev, mean, std, reduction="mean"):
    s = _rows(std, x_prev)
    return _reduce(-((x_prev - mean) ** 2) / (2 * s) - 0.5 * torch.log(2 * math.pi * s), reduction)


def _lp_log_variance(x_prev, mean, std, reduction="mean"):
    s = _rows(std, x_prev)
    return _reduce(-((x_prev - mean) ** 2) / (2 * s**2) - torch.log(s**2) - 0.5 * math.log(2 * math.pi), reduction)


def _lp_swapped_reduction(x_prev, mean, std, reduction="mean"):
    return gaussian_step_logprob(x_prev, mean, std, "sum" if reduction == "mean" else "mean")


def _lp_negated(x_prev, mean, std, reduction="mean"):
    return -gaussian_step_logprob(x_prev, mean, std, reduction)


def _step_batch(seed, B=3, C=1, H=4, W=4, stds=None):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(B, C, H, W, generator=g, dtype=torch.float64)
    std = torch.tensor(stds, dtype=torch.float64) if stds is not None else \
        torch.rand(B, generator=g, dtype=torch.float64) * 0.8 + 0.05
    x_prev = mean + _rows(std, mean) * torch.randn(B, C, H, W, generator=g, dtype=torch.float64)
    return x_prev, mean, std


def _lp_case(seed, reduction=None, **kw):
    def run(f):
        x, m, s = _step_batch(seed, **kw)
        return f(x, m, s) if reduction is None else f(x, m, s, reduction=reduction)
    return run


def _lp_hand(f):
    # one row, 2 pixels: x − μ = (0.5, −1.0), σ = 0.5 → per pixel −½·(1)² − log 0.5 − ½ log 2π and −½·(2)² − …
    x = torch.tensor([[[[0.5, -1.0]]]], dtype=torch.float64)
    return f(x, torch.zeros_like(x), torch.tensor([0.5], dtype=torch.float64), reduction="sum")


def _lp_zero_std(f):
    x, m, _ = _step_batch(0)
    return f(x, m, torch.tensor([0.3, 0.0, 0.2], dtype=torch.float64))


LP_CASES = [
    Case("by hand: x − μ = (0.5, −1.0), σ = 0.5, summed", "x_prev [[[[0.5, -1.0]]]], mean 0, std [0.5], reduction='sum' "
         "→ −0.5·(1² + 2²) − 2·log 0.5 − log 2π", _lp_hand),
    Case("three rows, three σ's, mean over pixels", "x_prev, mean [3, 1, 4, 4] (seed 0), std [0.1, 0.5, 1.0]",
         _lp_case(0, stds=[0.1, 0.5, 1.0])),
    Case("the same batch summed over pixels", "as above, reduction='sum'", _lp_case(0, "sum", stds=[0.1, 0.5, 1.0])),
    Case("a σ of 0 is refused with a ValueError", "std [0.3, 0.0, 0.2]", _lp_zero_std,
         hint="raise ValueError when a σ is <= 0: a deterministic step has no density (the log-prob would be ±inf/NaN)."),
    Case("two channels, 6×6, mean", "x_prev, mean [4, 2, 6, 6] (seed 1), random σ in [0.05, 0.85]",
         _lp_case(1, B=4, C=2, H=6, W=6), quick=False, rtol=1e-9, atol=1e-12),
    Case("small σ (the last steps of a chain), sum", "[5, 1, 8, 8] (seed 2), σ = 0.01 … 0.05, reduction='sum'",
         _lp_case(2, "sum", B=5, H=8, W=8, stds=[0.01, 0.02, 0.03, 0.04, 0.05]), quick=False, rtol=1e-9, atol=1e-9),
]

GAUSSIAN_STEP_LOGPROB = Item(
    exercise="09", number=1, function="gaussian_step_logprob", title="the per-step Gaussian log-prob",
    reference=gaussian_step_logprob, cases=LP_CASES,
    wrong_answers=[
        WrongAnswer("normalising constant forgotten", checked_by(gaussian_step_logprob, _lp_no_constant),
                    "you kept only −(x − μ)²/(2σ²). The density also has −log σ − ½ log 2π per pixel: σ differs from "
                    "step to step, so the constant does not cancel between steps (it does cancel in a ratio at the "
                    "same step, which is why this bug can hide)."),
        WrongAnswer("std used as the variance", checked_by(gaussian_step_logprob, _lp_std_as_variance),
                    "`std` is the standard deviation σ, not the variance: divide (x − μ)² by 2σ², and the constant is "
                    "−log σ − ½ log 2π (= −½ log(2πσ²))."),
        WrongAnswer("log σ² instead of log σ", checked_by(gaussian_step_logprob, _lp_log_variance),
                    "the constant is −½ log(2πσ²) = −log σ − ½ log 2π: you wrote −log σ², twice too much."),
        WrongAnswer("mean and sum swapped", checked_by(gaussian_step_logprob, _lp_swapped_reduction),
                    "reduction='sum' adds the D per-pixel log-densities (the true log-density of the image); 'mean' "
                    "divides that by D (DDPO's choice). You have them the wrong way round."),
        WrongAnswer("sign", checked_by(gaussian_step_logprob, _lp_negated),
                    "a log-density is −(x − μ)²/(2σ²) − log σ − ½ log 2π: you returned its negative (a negative "
                    "log-likelihood)."),
    ],
)

# --------------------------------------------------------------------------- 09.2 diffusion_grpo_loss


def _ratio(logp, old_logp):
    return torch.exp(logp - old_logp.detach())


def _clipped(ratio, a, epsilon, pick=torch.min):
    return pick(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a)


def diffusion_grpo_loss(logp, old_logp, advantages, kl, epsilon=0.2, beta=0.0):
    """Reference: mean over (chain, step) of −min(ρA, clip(ρ, 1 ± ε)A) + β·KL, ρ = exp(logp − old) per step."""
    if logp.ndim != 2 or old_logp.shape != logp.shape or kl.shape != logp.shape:
        raise ValueError(f"logp, old_logp and kl must all be [B, K], got {tuple(logp.shape)}, {tuple(old_logp.shape)} "
                         f"and {tuple(kl.shape)}")
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be one per chain, [B] = [{logp.shape[0]}], got {tuple(advantages.shape)}")
    return (-_clipped(_ratio(logp, old_logp), advantages.detach().unsqueeze(1), epsilon) + beta * kl).mean()


def _gl_unclipped(logp, old_logp, advantages, kl, epsilon=0.2, beta=0.0):
    return (-_ratio(logp, old_logp) * advantages.unsqueeze(1) + beta * kl).mean()


def _gl_sign(logp, old_logp, advantages, kl, epsilon=0.2, beta=0.0):
    return (_clipped(_ratio(logp, old_logp), advantages.unsqueeze(1), epsilon) + beta * kl).mean()


def _gl_wrong_axis(logp, old_logp, advantages, kl, epsilon=0.2, beta=0.0):
    # broadcast along the steps axis instead of the chains axis
    return (-_clipped(_ratio(logp, old_logp), advantages.unsqueeze(0), epsilon) + beta * kl).mean()


def _gl_last_step_only(logp, old_logp, advantages, kl, epsilon=0.2, beta=0.0):
    return -_clipped(_ratio(logp, old_logp)[:, -1], advantages, epsilon).mean() + beta * kl.mean()


def _gl_chain_logprob(logp, old_logp, advantages, kl, epsilon=0.2, beta=0.0):
    ratio = torch.exp((logp - old_logp.detach()).sum(1))  # one ratio for the whole chain
    return -_clipped(ratio, advantages, epsilon).mean() + beta * kl.mean()


def _gl_max(logp, old_logp, advantages, kl, epsilon=0.2, beta=0.0):
    return (-_clipped(_ratio(logp, old_logp), advantages.unsqueeze(1), epsilon, torch.max) + beta * kl).mean()


def _loss_grad(f, logp, old, adv, kl, **kw):
    logp = logp.clone().requires_grad_(True)
    loss = f(logp, old, adv, kl, **kw)
    loss.backward()
    return {"loss": loss.detach(), "grad": logp.grad if logp.grad is not None else torch.zeros_like(logp)}


def _chains(seed, B=4, K=5, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, K, generator=g, dtype=torch.float64) * 2 - 0.5
    logp = old + torch.randn(B, K, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    kl = torch.rand(B, K, generator=g, dtype=torch.float64) * 0.1
    return logp, old, adv, kl


# 2 chains × 3 steps; ratios ρ: chain 0 (A = +1): 1.5, 1.0, 0.5; chain 1 (A = −1): 0.5, 1.1, 1.0
_H_OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], dtype=torch.float64)
_H_LOGP = _H_OLD + torch.log(torch.tensor([[1.5, 1.0, 0.5], [0.5, 1.1, 1.0]], dtype=torch.float64))
_H_ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)
_H_KL = torch.tensor([[0.0, 0.1, 0.2], [0.3, 0.0, 0.1]], dtype=torch.float64)


def _gl_bad_adv(f):
    return f(_H_LOGP, _H_OLD, torch.ones(3, dtype=torch.float64), _H_KL)


GL_CASES = [
    Case("by hand: 2 chains × 3 steps, ratios 1.5, 1.0, 0.5 (A = +1) and 0.5, 1.1, 1.0 (A = −1)",
         "logp = old + log ρ, old = [[-1, -0.5, -2], [-0.3, -1.2, -0.7]], advantages [1, -1], kl = [[0, .1, .2], [.3, 0, .1]], "
         "epsilon=0.2, beta=0; compared: the loss and d loss / d logp",
         lambda f: _loss_grad(f, _H_LOGP, _H_OLD, _H_ADV, _H_KL)),
    Case("the same with beta = 0.5 (the KL term added per step)", "as above, beta=0.5",
         lambda f: _loss_grad(f, _H_LOGP, _H_OLD, _H_ADV, _H_KL, beta=0.5)),
    Case("a square batch (4 chains × 4 steps): each chain's advantage goes to all its steps",
         "random float64 logp, old [4, 4] (seed 1), advantages [4], kl [4, 4], epsilon=0.2",
         lambda f: _loss_grad(f, *_chains(1, B=4, K=4))),
    Case("μ = 1 (old_logp = logp): ratio 1 everywhere, gradient −A/(B·K)",
         "random [3, 6] (seed 2) with old_logp = logp", lambda f: _loss_grad(
             f, _chains(2, B=3, K=6)[0], _chains(2, B=3, K=6)[0].clone(), *_chains(2, B=3, K=6)[2:])),
    Case("advantages of the wrong shape are refused with a ValueError", "logp [2, 3], advantages [3]", _gl_bad_adv,
         hint="raise ValueError unless advantages is [B] (one per chain): a silent broadcast would pair chains "
              "with the wrong advantages."),
    Case("small ε (DDPO's 1e-4 scale) and larger ratios", "random [6, 10] (seed 3), log-ratio spread 0.5, epsilon=1e-3, beta=0.1",
         lambda f: _loss_grad(f, *_chains(3, B=6, K=10, spread=0.5), epsilon=1e-3, beta=0.1),
         quick=False, rtol=1e-9, atol=1e-12),
]

DIFFUSION_GRPO_LOSS = Item(
    exercise="09", number=2, function="diffusion_grpo_loss", title="the GRPO loss over recorded chains",
    reference=diffusion_grpo_loss, cases=GL_CASES,
    wrong_answers=[
        WrongAnswer("unclipped ratio", checked_by(diffusion_grpo_loss, _gl_unclipped),
                    "you used ρ·A alone. Take −min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A): without the clip nothing stops a "
                    "minibatch from moving the policy far from the one that sampled the chains."),
        WrongAnswer("sign", checked_by(diffusion_grpo_loss, _gl_sign),
                    "the loss is the *negative* of the clipped objective (we minimise it to maximise the reward); "
                    "the KL term keeps its + sign."),
        WrongAnswer("advantages on the wrong axis", checked_by(diffusion_grpo_loss, _gl_wrong_axis),
                    "advantages is [B], one per chain; broadcast it over the K steps of its chain with "
                    "advantages[:, None] (advantages[None, :] pairs step k with chain k's advantage)."),
        WrongAnswer("only the last step", checked_by(diffusion_grpo_loss, _gl_last_step_only),
                    "every step of a chain is an action that led to the final image, so every step gets the chain's "
                    "advantage: the loss is a mean over all (chain, step) pairs, not only the final step."),
        WrongAnswer("one ratio per chain", checked_by(diffusion_grpo_loss, _gl_chain_logprob),
                    "the ratio is per step, ρ_k = exp(logp_k − old_k), clipped one step at a time; the product over "
                    "the whole chain explodes or vanishes and would be clipped almost always."),
        WrongAnswer("max instead of min", checked_by(diffusion_grpo_loss, _gl_max),
                    "take the *min* of ρ·A and clip(ρ)·A (the pessimistic bound) before negating it."),
    ],
)

ITEMS = [GAUSSIAN_STEP_LOGPROB, DIFFUSION_GRPO_LOSS]
