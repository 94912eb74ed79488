"""Exercise 09 — GRPO for diffusion: the per-step Gaussian log-prob, and the loss over recorded chains."""

from __future__ import annotations

import math
from functools import partial

import torch

from minigrpo_course.grading.core import (Case, Item, Made, Spread, WrongAnswer, checked_by, f64, grads, randn,
                                          with_ratios)

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


def _lp_variant(x_prev, mean, std, reduction="mean", *, std_as_variance=False, constant="½ log 2πσ²"):
    """The step log-prob with one thing done wrong (each wrong answer below switches one knob)."""
    s = _rows(std, x_prev)
    var = s if std_as_variance else s**2
    const = {"½ log 2πσ²": 0.5 * torch.log(2 * math.pi * var), "none": 0.0,
             "log σ²": torch.log(var) + 0.5 * math.log(2 * math.pi)}[constant]
    return _reduce(-((x_prev - mean) ** 2) / (2 * var) - const, reduction)


_lp_mistake = partial(checked_by, gaussian_step_logprob)  # refuses what the reference refuses, then errs


def _lp_missing_check(x_prev, mean, std, reduction="mean", *, skip):
    """The right log-prob behind the reference's checks, all but the one named ``skip`` (a typical omission)."""
    if skip != "shapes" and (x_prev.shape != mean.shape or x_prev.ndim < 2):
        raise ValueError("x_prev and mean must both be [B, C, H, W]")
    if skip != "std shape" and std.shape != (x_prev.shape[0],):
        raise ValueError("std must be [B]")
    if skip == "σ = 0 only" and (std == 0).any():
        raise ValueError("std must not be 0")
    if skip != "σ = 0 only" and (std <= 0).any():
        raise ValueError("std must be > 0")
    if skip != "reduction" and reduction not in ("mean", "sum"):
        raise ValueError("reduction must be 'mean' or 'sum'")
    s = std.reshape(-1, *([1] * (x_prev.ndim - 1))) if std.ndim == 1 else std
    per_pixel = -((x_prev - mean) ** 2) / (2 * s**2) - torch.log(s) - 0.5 * math.log(2 * math.pi)
    return _reduce(per_pixel, "mean" if reduction == "mean" else "sum")


_SHAPES_HINT = ("compare x_prev.shape with mean.shape and raise ValueError when they differ: a mean of shape "
                "[B, C, H, 1] broadcasts silently over the width and gives a log-prob of the wrong image.")
_STD_SHAPE_HINT = ("check that std is [B], one σ per row (std.shape == (x_prev.shape[0],)), and raise ValueError "
                   "otherwise; a σ per row of the wrong length fails later with a RuntimeError that names no argument.")
_SIGMA_HINT = "raise ValueError when a σ is <= 0: a deterministic step has no density (the log-prob would be ±inf/NaN)."
_NEGATIVE_SIGMA_HINT = ("refuse every σ <= 0, not only σ = 0: a negative σ is no standard deviation, and log σ of it "
                        "is NaN (test (std <= 0).any()).")
_REDUCTION_HINT = ("raise ValueError for any reduction other than 'mean' or 'sum': a typo ('avg', 'none') must not "
                   "silently fall back to one of them.")


def step_batch(seed: int, B: int = 3, C: int = 1, H: int = 4, W: int = 4, stds=None):
    """Random float64 (x_prev, mean, std): mean ~ N(0, 1) of shape [B, C, H, W], one σ per row (``stds``, or
    uniform in [0.05, 0.85]), and x_prev = mean + σ·noise."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(B, C, H, W, generator=g, dtype=torch.float64)
    std = f64(stds) if stds is not None else torch.rand(B, generator=g, dtype=torch.float64) * 0.8 + 0.05
    x_prev = mean + _rows(std, mean) * torch.randn(B, C, H, W, generator=g, dtype=torch.float64)
    return x_prev, mean, std


_STDS = [0.1, 0.5, 1.0]

LP_CASES = [
    Case("by hand: x − μ = (0.5, −1.0), σ = 0.5, summed: −0.5·(1² + 2²) − 2·log 0.5 − log 2π",
         (f64([[[[0.5, -1.0]]]]), f64([[[[0.0, 0.0]]]]), f64([0.5])), {"reduction": "sum"}),
    Case("three rows, three σ's, mean over pixels", (Spread(step_batch, 0, stds=_STDS),)),
    Case("the same batch summed over pixels", (Spread(step_batch, 0, stds=_STDS),), {"reduction": "sum"}),
    Case("a σ of 0 is refused with a ValueError",
         (Made(randn, 3, 1, 4, 4, seed=0), Made(randn, 3, 1, 4, 4, seed=1), f64([0.3, 0.0, 0.2])), hint=_SIGMA_HINT),
    Case("a negative σ is refused with a ValueError",
         (Made(randn, 3, 1, 4, 4, seed=0), Made(randn, 3, 1, 4, 4, seed=1), f64([0.3, -0.2, 0.2])),
         hint=_NEGATIVE_SIGMA_HINT),
    Case("x_prev and mean of different shapes ([3, 1, 4, 4] and [3, 1, 4, 1]) are refused with a ValueError",
         (Made(randn, 3, 1, 4, 4, seed=0), Made(randn, 3, 1, 4, 1, seed=1), f64([0.3, 0.5, 0.2])), hint=_SHAPES_HINT),
    Case("std of the wrong length (2 σ's for 3 rows) is refused with a ValueError",
         (Made(randn, 3, 1, 4, 4, seed=0), Made(randn, 3, 1, 4, 4, seed=1), f64([0.3, 0.5])), hint=_STD_SHAPE_HINT),
    Case("an unknown reduction is refused with a ValueError", (Spread(step_batch, 0, stds=_STDS),),
         {"reduction": "avg"}, hint=_REDUCTION_HINT),
    Case("two channels, 6×6, mean", (Spread(step_batch, 1, B=4, C=2, H=6, W=6),), quick=False, rtol=1e-9, atol=1e-12),
    Case("small σ (the last steps of a chain), sum",
         (Spread(step_batch, 2, B=5, H=8, W=8, stds=[0.01, 0.02, 0.03, 0.04, 0.05]),), {"reduction": "sum"},
         quick=False, rtol=1e-9, atol=1e-9),
]

GAUSSIAN_STEP_LOGPROB = Item(
    exercise="09", number=1, function="gaussian_step_logprob", title="the per-step Gaussian log-prob",
    reference=gaussian_step_logprob, cases=LP_CASES,
    wrong_answers=[
        WrongAnswer("normalising constant forgotten", _lp_mistake(partial(_lp_variant, constant="none")),
                    "you kept only −(x − μ)²/(2σ²). The density also has −log σ − ½ log 2π per pixel: σ differs from "
                    "step to step, so the constant does not cancel between steps (it does cancel in a ratio at the "
                    "same step, which is why this bug can hide)."),
        WrongAnswer("std used as the variance", _lp_mistake(partial(_lp_variant, std_as_variance=True)),
                    "`std` is the standard deviation σ, not the variance: divide (x − μ)² by 2σ², and the constant is "
                    "−log σ − ½ log 2π (= −½ log(2πσ²))."),
        WrongAnswer("log σ² instead of log σ", _lp_mistake(partial(_lp_variant, constant="log σ²")),
                    "the constant is −½ log(2πσ²) = −log σ − ½ log 2π: you wrote −log σ², twice too much."),
        WrongAnswer("mean and sum swapped", _lp_mistake(
                    lambda x, m, s, reduction="mean": gaussian_step_logprob(x, m, s, "sum" if reduction == "mean"
                                                                            else "mean")),
                    "reduction='sum' adds the D per-pixel log-densities (the true log-density of the image); 'mean' "
                    "divides that by D (DDPO's choice). You have them the wrong way round."),
        WrongAnswer("sign", _lp_mistake(lambda *args, **kwargs: -gaussian_step_logprob(*args, **kwargs)),
                    "a log-density is −(x − μ)²/(2σ²) − log σ − ½ log 2π: you returned its negative (a negative "
                    "log-likelihood)."),
        # The required errors: each omission passes every value case and fails its refusal with that case's hint.
        WrongAnswer("only σ = 0 refused", partial(_lp_missing_check, skip="σ = 0 only"), _NEGATIVE_SIGMA_HINT),
        WrongAnswer("shapes of x_prev and mean not compared", partial(_lp_missing_check, skip="shapes"), _SHAPES_HINT),
        WrongAnswer("length of std not checked", partial(_lp_missing_check, skip="std shape"), _STD_SHAPE_HINT),
        WrongAnswer("reduction not checked", partial(_lp_missing_check, skip="reduction"), _REDUCTION_HINT),
    ],
)

# --------------------------------------------------------------------------- 09.2 diffusion_grpo_loss


def _ratio(logp, old_logp):
    return torch.exp(logp - old_logp.detach())


def _clipped(ratio, a, epsilon, pick=torch.min):
    return pick(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a)


def diffusion_grpo_loss(logp, old_logp, advantages, kl, epsilon=1e-3, beta=0.0):
    """Reference: mean over (chain, step) of −min(ρA, clip(ρ, 1 ± ε)A) + β·KL, ρ = exp(logp − old) per step."""
    if logp.ndim != 2 or old_logp.shape != logp.shape or kl.shape != logp.shape:
        raise ValueError(f"logp, old_logp and kl must all be [B, K], got {tuple(logp.shape)}, {tuple(old_logp.shape)} "
                         f"and {tuple(kl.shape)}")
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be one per chain, [B] = [{logp.shape[0]}], got {tuple(advantages.shape)}")
    return (-_clipped(_ratio(logp, old_logp), advantages.detach().unsqueeze(1), epsilon) + beta * kl).mean()


def _gl_variant(logp, old_logp, advantages, kl, epsilon=1e-3, beta=0.0, *, clip=True, sign=-1.0, adv_axis=1,
                pick=torch.min, ratio_per="step"):
    """The loss over chains with one thing done wrong (each wrong answer below switches one knob)."""
    log_ratio = logp - old_logp.detach()
    if ratio_per == "step":
        ratio, a = torch.exp(log_ratio), advantages.unsqueeze(adv_axis)
    else:  # the last step only, or one ratio for the whole chain
        ratio, a = torch.exp(log_ratio[:, -1] if ratio_per == "last step" else log_ratio.sum(1)), advantages
    objective = _clipped(ratio, a, epsilon, pick) if clip else ratio * a
    return (sign * objective).mean() + beta * kl.mean()


_gl_mistake = partial(checked_by, diffusion_grpo_loss)


def chains(seed: int, B: int = 4, K: int = 5, spread: float = 0.3, on_policy: bool = False):
    """Random float64 (logp, old_logp, advantages, kl) for B chains of K steps: log-ratios ~ N(0, spread²)
    (0 with ``on_policy``), one advantage per chain, per-step KL in [0, 0.1]."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, K, generator=g, dtype=torch.float64) * 2 - 0.5
    logp = old + torch.randn(B, K, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    kl = torch.rand(B, K, generator=g, dtype=torch.float64) * 0.1
    return logp, logp.clone() if on_policy else old, adv, kl


# 2 chains × 3 steps; ratios ρ: chain 0 (A = +1): 1.5, 1.0, 0.5; chain 1 (A = −1): 0.5, 1.1, 1.0
_H_RATIOS = Spread(with_ratios, f64([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]),
                   ratios=[[1.5, 1.0, 0.5], [0.5, 1.1, 1.0]])
_H_KL = f64([[0.0, 0.1, 0.2], [0.3, 0.0, 0.1]])

GL_CASES = [
    Case("by hand: 2 chains × 3 steps, A = +1 and −1, ε = 0.2", (_H_RATIOS, f64([1.0, -1.0]), _H_KL),
         {"epsilon": 0.2}, call=grads("logp")),
    Case("the same with beta = 0.5 (the KL term added per step)", (_H_RATIOS, f64([1.0, -1.0]), _H_KL),
         {"epsilon": 0.2, "beta": 0.5}, call=grads("logp")),
    Case("the default ε = 1e-3 (per-pixel-mean log-ratios are small): some steps clipped, some not",
         (Spread(chains, 4, B=3, K=4, spread=2e-3),), call=grads("logp"),
         hint="the default epsilon is 1e-3, the clip range that pairs with per-pixel-mean log-probs "
              "(DiffusionGRPOConfig's default; lesson 09 section 12)."),
    Case("a square batch (4 chains × 4 steps): each chain's advantage goes to all its steps",
         (Spread(chains, 1, B=4, K=4),), {"epsilon": 0.2}, call=grads("logp")),
    Case("μ = 1 (old_logp = logp): ratio 1 everywhere, gradient −A/(B·K)",
         (Spread(chains, 2, B=3, K=6, on_policy=True),),
         call=grads("logp")),
    Case("advantages of the wrong shape are refused with a ValueError", (_H_RATIOS, f64([1.0, 1.0, 1.0]), _H_KL),
         hint="raise ValueError unless advantages is [B] (one per chain): a silent broadcast would pair chains "
              "with the wrong advantages."),
    Case("small ε (DDPO's 1e-4 scale) and larger ratios", (Spread(chains, 3, B=6, K=10, spread=0.5),),
         {"epsilon": 1e-3, "beta": 0.1}, call=grads("logp"), quick=False, rtol=1e-9, atol=1e-12),
]

DIFFUSION_GRPO_LOSS = Item(
    exercise="09", number=2, function="diffusion_grpo_loss", title="the GRPO loss over recorded chains",
    reference=diffusion_grpo_loss, cases=GL_CASES,
    wrong_answers=[
        WrongAnswer("unclipped ratio", _gl_mistake(partial(_gl_variant, clip=False)),
                    "you used ρ·A alone. Take −min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A): without the clip nothing stops a "
                    "minibatch from moving the policy far from the one that sampled the chains."),
        WrongAnswer("sign", _gl_mistake(partial(_gl_variant, sign=1.0)),
                    "the loss is the *negative* of the clipped objective (we minimise it to maximise the reward); "
                    "the KL term keeps its + sign."),
        WrongAnswer("advantages on the wrong axis", _gl_mistake(partial(_gl_variant, adv_axis=0)),
                    "advantages is [B], one per chain; broadcast it over the K steps of its chain with "
                    "advantages[:, None] (advantages[None, :] pairs step k with chain k's advantage)."),
        WrongAnswer("only the last step", _gl_mistake(partial(_gl_variant, ratio_per="last step")),
                    "every step of a chain is an action that led to the final image, so every step gets the chain's "
                    "advantage: the loss is a mean over all (chain, step) pairs, not only the final step."),
        WrongAnswer("one ratio per chain", _gl_mistake(partial(_gl_variant, ratio_per="chain")),
                    "the ratio is per step, ρ_k = exp(logp_k − old_k), clipped one step at a time; the product over "
                    "the whole chain explodes or vanishes and would be clipped almost always."),
        WrongAnswer("max instead of min", _gl_mistake(partial(_gl_variant, pick=torch.max)),
                    "take the *min* of ρ·A and clip(ρ)·A (the pessimistic bound) before negating it."),
    ],
)

ITEMS = [GAUSSIAN_STEP_LOGPROB, DIFFUSION_GRPO_LOSS]
