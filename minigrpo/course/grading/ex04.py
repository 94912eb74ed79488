"""Exercise 04 — PPO: the clipped surrogate loss, the clip fraction, and the k3 estimate of KL."""

from __future__ import annotations

from functools import partial

import torch

from minigrpo.course.grading.core import Case, Item, Spread, WrongAnswer, checked_by, grads, with_ratios
from minigrpo.losses import clipped_surrogate_loss as _package_loss

TITLE = "PPO"

# --------------------------------------------------------------------------- references


def reference_loss(logp, old_logp, advantages, clip_eps):
    """The package's loss without its statistics: −mean(min(r·A, clip(r, 1 ± ε)·A))."""
    return _package_loss(logp, old_logp, advantages, clip_eps)[0]


def reference_clip_fraction(logp, old_logp, advantages, clip_eps):
    """Share of samples whose gradient the clip removed: (A > 0, r > 1 + ε) or (A < 0, r < 1 − ε)."""
    if logp.shape != old_logp.shape or logp.shape != advantages.shape:
        raise ValueError("logp, old_logp and advantages must have the same shape")
    ratio = torch.exp(logp.detach() - old_logp.detach())
    clipped = ((advantages > 0) & (ratio > 1 + clip_eps)) | ((advantages < 0) & (ratio < 1 - clip_eps))
    return clipped.double().mean()


def reference_approx_kl(logp, old_logp):
    """k3 estimate of KL(π_old ‖ π_θ) from actions sampled by π_old: mean((r − 1) − log r)."""
    if logp.shape != old_logp.shape:
        raise ValueError("logp and old_logp must have the same shape")
    log_ratio = (logp - old_logp).detach()
    return (torch.expm1(log_ratio) - log_ratio).mean()


# --------------------------------------------------------------------------- inputs (fresh each call)

_EPS = 0.2


#: one sample in each region of the (ratio, sign of A) plane, plus two inside the clip range
_REGIONS = (Spread(with_ratios, [-0.7, -1.2, -0.3, -2.0, -0.9, -1.5], ratios=[1.5, 0.5, 1.5, 0.5, 1.1, 0.9]),
            torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0, -2.0]))


def ppo_batch(seed: int, shape=(4, 16), spread: float = 0.4):
    """float64 logp, old_logp (log-ratios ~ N(0, spread²)) and advantages ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3
    logp = old + spread * torch.randn(shape, generator=g, dtype=torch.float64)
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    return logp, old, adv


def log_prob_pair(seed: int, shape=(4, 16)):
    """The (logp, old_logp) of :func:`ppo_batch`."""
    return ppo_batch(seed, shape)[:2]


# --------------------------------------------------------------------------- 04.1 clipped_surrogate_loss


def _surrogate(logp, old_logp, adv, eps, *, ratio="exp", detach=True, pick=torch.min, clip="ratio"):
    """The clipped surrogate loss with one thing done wrong (each wrong answer below switches one knob)."""
    old = old_logp.detach() if detach else old_logp
    r = {"exp": torch.exp(logp - old), "quotient": logp / old, "difference": logp - old}[ratio]
    clipped = r * adv.clamp(1 - eps, 1 + eps) if clip == "advantage" else r.clamp(1 - eps, 1 + eps) * adv
    return -(clipped if pick is None else pick(r * adv, clipped)).mean()


_SHAPE_HINT = ("compare the three shapes and raise ValueError when they differ: [3] * [3, 1] would "
               "silently broadcast to a [3, 3] loss.")

_SAME = torch.tensor([-0.5, -1.0, -2.0])

LOSS_CASES = [
    Case("value: one sample in each clip region", (*_REGIONS, _EPS)),
    Case("gradient w.r.t. logp: 0 where clipped, −ratio·A/N elsewhere", (*_REGIONS, _EPS),
         call=grads("logp", value=False)),
    Case("no gradient flows into old_logp or the advantages", (*_REGIONS, _EPS),
         call=grads("old_logp", "advantages", value=False, requires_grad=("logp", "old_logp", "advantages")),
         hint="detach old_logp and the advantages: they are data from the rollout, not something to differentiate."),
    Case("ratio 1 gives the plain policy-gradient loss −mean(A)",
         (_SAME, _SAME, torch.tensor([1.0, 2.0, -1.0]), _EPS),
         call=grads("logp")),
    Case("a wider clip range, ε = 0.6", (*_REGIONS, 0.6), call=grads("logp")),
    Case("mismatched shapes are refused with a ValueError", (torch.zeros(3), torch.zeros(3), torch.ones(3, 1), _EPS),
         hint=_SHAPE_HINT),
    Case("a random [4, 16] float64 batch: value and gradient", (Spread(ppo_batch, 1), 0.2), call=grads("logp"),
         quick=False, rtol=1e-9, atol=1e-12),
    Case("a random [256] float64 batch with ε = 0.1", (Spread(ppo_batch, 5, shape=(256,)), 0.1), call=grads("logp"),
         quick=False, rtol=1e-9, atol=1e-12),
]

CLIPPED_SURROGATE_LOSS = Item(
    exercise="04", number=1, function="clipped_surrogate_loss", title="PPO's clipped surrogate loss",
    reference=reference_loss, cases=LOSS_CASES,
    wrong_answers=[
        WrongAnswer("max instead of min", partial(_surrogate, pick=torch.max),
                    "use the min of the two terms, not the max: PPO takes the pessimistic one, so "
                    "the clip can only remove an incentive, never add one."),
        WrongAnswer("clipped the advantage", partial(_surrogate, clip="advantage"),
                    "clip the ratio, not the advantage: the second term is clamp(ratio, 1 − ε, 1 + ε) · A."),
        WrongAnswer("clip only, no min", partial(_surrogate, pick=None),
                    "−clip(r)·A alone zeroes the gradient of every sample outside [1 − ε, 1 + ε], including "
                    "those whose move made things worse; take −min(r·A, clip(r)·A) so those keep their gradient."),
        WrongAnswer("ratio as a quotient of log-probs", partial(_surrogate, ratio="quotient"),
                    "the ratio is π/π_old = exp(logp − old_logp), not logp / old_logp."),
        WrongAnswer("ratio without exp", partial(_surrogate, ratio="difference"),
                    "logp − old_logp is the log of the ratio: take torch.exp of it (it is 0, not 1, "
                    "when the policies agree)."),
        WrongAnswer("old_logp not detached", partial(_surrogate, detach=False),
                    "gradient flows into old_logp: use old_logp.detach() in the ratio; π_old is a fixed "
                    "snapshot (the policy that sampled the data), not something to optimise."),
        WrongAnswer("sign", lambda *args: -reference_loss(*args),
                    "sign error: the objective min(r·A, clip(r)·A) is to be maximised, so the loss to "
                    "minimise is its negative mean."),
        WrongAnswer("sum", lambda *args: reference_loss(*args) * args[0].numel(),
                    "take the mean over samples, not the sum (a sum makes the step size grow with the batch)."),
    ],
)

# --------------------------------------------------------------------------- 04.2 ppo_clip_fraction


def _share(ratio, adv, eps):
    """The clip-fraction rule applied to a possibly wrong ratio or advantage sign."""
    return (((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))).double().mean()


CLIP_CASES = [
    Case("one sample in each clip region", (*_REGIONS, _EPS)),
    Case("zero advantages are never clipped; signs matter",
         (Spread(with_ratios, [-1.0] * 7, ratios=[1.5, 0.5, 2.0, 0.7, 1.3, 0.6, 1.05]),
          torch.tensor([0.5, -0.5, 0.0, -1.0, 1.0, 1.0, -1.0]), _EPS)),
    Case("nothing is clipped at ratio 1", (_SAME, _SAME, torch.tensor([1.0, -2.0, 3.0]), _EPS)),
    Case("mismatched shapes are refused with a ValueError", (torch.zeros(3), torch.zeros(3), torch.ones(3, 1), _EPS),
         hint=_SHAPE_HINT),
    Case("a random [4, 16] float64 batch", (Spread(ppo_batch, 1), 0.2), quick=False),
    Case("a random [512] float64 batch with ε = 0.1", (Spread(ppo_batch, 6, shape=(512,)), 0.1), quick=False),
]

PPO_CLIP_FRACTION = Item(
    exercise="04", number=2, function="ppo_clip_fraction", title="the share of samples the clip silenced",
    reference=reference_clip_fraction, cases=CLIP_CASES,
    wrong_answers=[
        WrongAnswer("|r − 1| > ε",
                    lambda logp, old, adv, eps: ((torch.exp(logp - old) - 1).abs() > eps).double().mean(),
                    "a ratio outside [1 − ε, 1 + ε] is clipped only if the advantage pushes it further out: "
                    "count r > 1 + ε with A > 0 and r < 1 − ε with A < 0; the other samples keep their gradient."),
        WrongAnswer("upper side only",
                    lambda logp, old, adv, eps: ((adv > 0) & (torch.exp(logp - old) > 1 + eps)).double().mean(),
                    "you counted only r > 1 + ε with A > 0; samples with A < 0 and r < 1 − ε are clipped too."),
        WrongAnswer("ratio as a quotient of log-probs",
                    checked_by(reference_clip_fraction, lambda logp, old, adv, eps: _share(logp / old, adv, eps)),
                    "the ratio is π/π_old = exp(logp − old_logp), not logp / old_logp (a quotient of two negative "
                    "log-probs, which is not a probability ratio at all)."),
        WrongAnswer("signs swapped", lambda logp, old, adv, eps: _share(torch.exp(logp - old), -adv, eps),
                    "the signs are swapped: with A > 0 the objective rewards a larger ratio, so the clip "
                    "acts above 1 + ε; with A < 0 it acts below 1 − ε."),
        WrongAnswer("a count",
                    lambda *args: reference_clip_fraction(*args) * args[0].numel(),
                    "return the share of samples (a number in [0, 1]), not their count."),
        WrongAnswer("ratio without exp", lambda logp, old, adv, eps: _share(logp - old, adv, eps),
                    "logp − old_logp is the log of the ratio: compare exp(logp − old_logp) with 1 ± ε."),
    ],
)

# --------------------------------------------------------------------------- 04.3 approx_kl


KL_CASES = [
    Case("hand-computable ratios", (Spread(with_ratios, [-1.0, -2.0, -0.5], ratios=[2.0, 0.4, 1.0]),)),
    Case("identical policies give 0", (torch.tensor([-0.3, -1.2, -2.5]), torch.tensor([-0.3, -1.2, -2.5]))),
    Case("ratios below 1 only", (Spread(with_ratios, [-0.5, -0.5], ratios=[0.5, 0.8]),)),
    Case("mismatched shapes are refused with a ValueError", (torch.zeros(3), torch.zeros(3, 1)),
         hint="compare logp.shape with old_logp.shape and raise ValueError when they differ."),
    Case("a random [4, 16] float64 batch", (Spread(log_prob_pair, 1),), quick=False, rtol=1e-9, atol=1e-12),
    Case("a random [1000] float64 batch", (Spread(log_prob_pair, 8, shape=(1000,)),), quick=False,
         rtol=1e-9, atol=1e-12),
]

APPROX_KL = Item(
    exercise="04", number=3, function="approx_kl", title="the k3 estimate of KL(π_old ‖ π_θ)",
    reference=reference_approx_kl, cases=KL_CASES,
    wrong_answers=[
        WrongAnswer("k1", lambda logp, old: (old - logp).mean(),
                    "this is k1 = mean(old_logp − logp): unbiased but noisy and negative for some "
                    "samples. k3 adds the zero-mean control variate (r − 1): mean((r − 1) − log r)."),
        WrongAnswer("k2", lambda logp, old: (0.5 * (logp - old) ** 2).mean(),
                    "this is k2 = ½·mean((log r)²), which is biased; k3 = mean((r − 1) − log r) is "
                    "unbiased and still non-negative."),
        WrongAnswer("direction", lambda logp, old: reference_approx_kl(old, logp),
                    "wrong direction: the actions were sampled by π_old, so with r = π_θ/π_old the k3 "
                    "estimate of KL(π_old ‖ π_θ) is (r − 1) − log r, not (1/r − 1) + log r."),
        WrongAnswer("sign",
                    lambda *args: -reference_approx_kl(*args),
                    "sign error: a KL divergence (and every k3 term) is ≥ 0."),
        WrongAnswer("sum",
                    lambda *args: reference_approx_kl(*args) * args[0].numel(),
                    "take the mean over samples, not the sum."),
    ],
)

ITEMS = [CLIPPED_SURROGATE_LOSS, PPO_CLIP_FRACTION, APPROX_KL]
