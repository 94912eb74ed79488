"""Exercise 04 — PPO: the clipped surrogate loss, the clip fraction, and the k3 estimate of KL."""

from __future__ import annotations

import torch

from minigrpo.course.grading.core import Case, Item, WrongAnswer
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
_RATIOS = [1.5, 0.5, 1.5, 0.5, 1.1, 0.9]
_ADV = [1.0, 1.0, -1.0, -1.0, 2.0, -2.0]
_OLD = [-0.7, -1.2, -0.3, -2.0, -0.9, -1.5]
_REGIONS = ("old_logp=[-0.7, -1.2, -0.3, -2.0, -0.9, -1.5], logp = old_logp + log(ratio) with "
            "ratio=[1.5, 0.5, 1.5, 0.5, 1.1, 0.9], advantages=[1, 1, -1, -1, 2, -2], clip_eps=0.2")


def _t(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _regions(dtype=torch.float32):
    old = _t(_OLD, dtype)
    logp = old + torch.log(_t(_RATIOS, dtype))
    return logp, old, _t(_ADV, dtype)


def _random_batch(seed: int, shape=(4, 16), spread: float = 0.4):
    """float64 logp, old_logp (log-ratios ~ N(0, spread²)) and advantages ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3
    logp = old + spread * torch.randn(shape, generator=g, dtype=torch.float64)
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    return logp, old, adv


# --------------------------------------------------------------------------- 04.1 clipped_surrogate_loss


def _clip_ratio(logp, old_logp, eps):
    return torch.clamp(torch.exp(logp - old_logp.detach()), 1 - eps, 1 + eps)


def _loss_max(logp, old_logp, adv, eps):
    r = torch.exp(logp - old_logp.detach())
    return -torch.max(r * adv, _clip_ratio(logp, old_logp, eps) * adv).mean()


def _loss_clip_advantage(logp, old_logp, adv, eps):
    r = torch.exp(logp - old_logp.detach())
    return -torch.min(r * adv, r * torch.clamp(adv, 1 - eps, 1 + eps)).mean()


def _loss_clip_only(logp, old_logp, adv, eps):
    return -(_clip_ratio(logp, old_logp, eps) * adv).mean()


def _loss_ratio_quotient(logp, old_logp, adv, eps):
    r = logp / old_logp.detach()
    return -torch.min(r * adv, torch.clamp(r, 1 - eps, 1 + eps) * adv).mean()


def _loss_ratio_difference(logp, old_logp, adv, eps):
    r = logp - old_logp.detach()
    return -torch.min(r * adv, torch.clamp(r, 1 - eps, 1 + eps) * adv).mean()


def _loss_not_detached(logp, old_logp, adv, eps):
    r = torch.exp(logp - old_logp)
    return -torch.min(r * adv, torch.clamp(r, 1 - eps, 1 + eps) * adv).mean()


def _loss_sign(logp, old_logp, adv, eps):
    return -reference_loss(logp, old_logp, adv, eps)


def _loss_sum(logp, old_logp, adv, eps):
    return reference_loss(logp, old_logp, adv, eps) * logp.numel()


def _value(f):
    return f(*_regions(), _EPS)


def _grad_logp(f):
    logp, old, adv = _regions()
    logp.requires_grad_()
    f(logp, old, adv, _EPS).backward()
    return logp.grad


def _grad_data(f):
    """The gradients reaching old_logp and the advantages (zeros when they are detached)."""
    logp, old, adv = _regions()
    for t in (logp, old, adv):
        t.requires_grad_()
    f(logp, old, adv, _EPS).backward()
    zeros = torch.zeros(len(_ADV))
    return {"d loss / d old_logp": zeros if old.grad is None else old.grad,
            "d loss / d advantages": zeros if adv.grad is None else adv.grad}


def _ratio_one(f):
    logp = _t([-0.5, -1.0, -2.0]).requires_grad_()
    loss = f(logp, _t([-0.5, -1.0, -2.0]), _t([1.0, 2.0, -1.0]), _EPS)
    loss.backward()
    return {"loss": loss.detach(), "d loss / d logp": logp.grad}


def _other_eps(f):
    logp, old, adv = _regions()
    logp.requires_grad_()
    loss = f(logp, old, adv, 0.6)
    loss.backward()
    return {"loss": loss.detach(), "d loss / d logp": logp.grad}


def _random_value_and_grad(f, seed=1, shape=(4, 16), eps=0.2):
    logp, old, adv = _random_batch(seed, shape)
    logp.requires_grad_()
    loss = f(logp, old, adv, eps)
    loss.backward()
    return {"loss": loss.detach(), "d loss / d logp": logp.grad}


_SHAPE_HINT = ("compare the three shapes and raise ValueError when they differ: [3] * [3, 1] would "
               "silently broadcast to a [3, 3] loss.")

LOSS_CASES = [
    Case("value: one sample in each clip region", _REGIONS, _value),
    Case("gradient w.r.t. logp: 0 where clipped, −ratio·A/N elsewhere", _REGIONS + " (logp requires grad)",
         _grad_logp),
    Case("no gradient flows into old_logp or the advantages", _REGIONS + " (all three require grad)",
         _grad_data, hint="detach old_logp and the advantages: they are data from the rollout, not "
                          "something to differentiate."),
    Case("ratio 1 gives the plain policy-gradient loss −mean(A)",
         "logp = old_logp = [-0.5, -1.0, -2.0], advantages=[1., 2., -1.], clip_eps=0.2", _ratio_one),
    Case("a wider clip range, ε = 0.6", _REGIONS.replace("clip_eps=0.2", "clip_eps=0.6"), _other_eps),
    Case("mismatched shapes are refused with a ValueError",
         "logp and old_logp of shape (3,), advantages of shape (3, 1)",
         lambda f: f(torch.zeros(3), torch.zeros(3), torch.ones(3, 1), _EPS), hint=_SHAPE_HINT),
    Case("a random [4, 16] float64 batch: value and gradient",
         "random float64 log-probs, log-ratios ~ N(0, 0.4²), advantages ~ N(0, 1), clip_eps=0.2",
         _random_value_and_grad, quick=False, rtol=1e-9, atol=1e-12),
    Case("a random [256] float64 batch with ε = 0.1", "256 random samples (seed 5), clip_eps=0.1",
         lambda f: _random_value_and_grad(f, seed=5, shape=(256,), eps=0.1), quick=False, rtol=1e-9, atol=1e-12),
]

CLIPPED_SURROGATE_LOSS = Item(
    exercise="04", number=1, function="clipped_surrogate_loss", title="PPO's clipped surrogate loss",
    reference=reference_loss, cases=LOSS_CASES,
    wrong_answers=[
        WrongAnswer("max instead of min", _loss_max,
                    "use the min of the two terms, not the max: PPO takes the pessimistic one, so "
                    "the clip can only remove an incentive, never add one."),
        WrongAnswer("clipped the advantage", _loss_clip_advantage,
                    "clip the ratio, not the advantage: the second term is clamp(ratio, 1 − ε, 1 + ε) · A."),
        WrongAnswer("clip only, no min", _loss_clip_only,
                    "−clip(r)·A alone zeroes the gradient of every sample outside [1 − ε, 1 + ε], including "
                    "those whose move made things worse; take −min(r·A, clip(r)·A) so those keep their gradient."),
        WrongAnswer("ratio as a quotient of log-probs", _loss_ratio_quotient,
                    "the ratio is π/π_old = exp(logp − old_logp), not logp / old_logp."),
        WrongAnswer("ratio without exp", _loss_ratio_difference,
                    "logp − old_logp is the log of the ratio: take torch.exp of it (it is 0, not 1, "
                    "when the policies agree)."),
        WrongAnswer("old_logp not detached", _loss_not_detached,
                    "gradient flows into old_logp: use old_logp.detach() in the ratio; π_old is a fixed "
                    "snapshot (the policy that sampled the data), not something to optimise."),
        WrongAnswer("sign", _loss_sign,
                    "sign error: the objective min(r·A, clip(r)·A) is to be maximised, so the loss to "
                    "minimise is its negative mean."),
        WrongAnswer("sum", _loss_sum,
                    "take the mean over samples, not the sum (a sum makes the step size grow with the batch)."),
    ],
)

# --------------------------------------------------------------------------- 04.2 ppo_clip_fraction


def _cf_both_sides(logp, old_logp, adv, eps):
    r = torch.exp(logp - old_logp)
    return ((r - 1).abs() > eps).double().mean()


def _cf_high_only(logp, old_logp, adv, eps):
    r = torch.exp(logp - old_logp)
    return ((adv > 0) & (r > 1 + eps)).double().mean()


def _cf_signs_swapped(logp, old_logp, adv, eps):
    r = torch.exp(logp - old_logp)
    return (((adv < 0) & (r > 1 + eps)) | ((adv > 0) & (r < 1 - eps))).double().mean()


def _cf_count(logp, old_logp, adv, eps):
    return reference_clip_fraction(logp, old_logp, adv, eps) * logp.numel()


def _cf_no_exp(logp, old_logp, adv, eps):
    r = logp - old_logp
    return (((adv > 0) & (r > 1 + eps)) | ((adv < 0) & (r < 1 - eps))).double().mean()


_CF_EXTRA = ("logp = old_logp + log(ratio), ratio=[1.5, 0.5, 2.0, 0.7, 1.3, 0.6, 1.05], old_logp=-1, "
             "advantages=[0.5, -0.5, 0., -1., 1., 1., -1.], clip_eps=0.2")


def _cf_extra(f):
    ratio = _t([1.5, 0.5, 2.0, 0.7, 1.3, 0.6, 1.05])
    old = torch.full((7,), -1.0)
    return f(old + torch.log(ratio), old, _t([0.5, -0.5, 0.0, -1.0, 1.0, 1.0, -1.0]), _EPS)


CLIP_CASES = [
    Case("one sample in each clip region", _REGIONS, _value),
    Case("zero advantages are never clipped; signs matter", _CF_EXTRA, _cf_extra),
    Case("nothing is clipped at ratio 1", "logp = old_logp = [-0.5, -1.0, -2.0], advantages=[1., -2., 3.], clip_eps=0.2",
         lambda f: f(_t([-0.5, -1.0, -2.0]), _t([-0.5, -1.0, -2.0]), _t([1.0, -2.0, 3.0]), _EPS)),
    Case("mismatched shapes are refused with a ValueError",
         "logp and old_logp of shape (3,), advantages of shape (3, 1)",
         lambda f: f(torch.zeros(3), torch.zeros(3), torch.ones(3, 1), _EPS), hint=_SHAPE_HINT),
    Case("a random [4, 16] float64 batch", "random float64 log-probs, log-ratios ~ N(0, 0.4²), clip_eps=0.2",
         lambda f: f(*_random_batch(1), 0.2), quick=False),
    Case("a random [512] float64 batch with ε = 0.1", "512 random samples (seed 6), clip_eps=0.1",
         lambda f: f(*_random_batch(6, (512,)), 0.1), quick=False),
]

PPO_CLIP_FRACTION = Item(
    exercise="04", number=2, function="ppo_clip_fraction", title="the share of samples the clip silenced",
    reference=reference_clip_fraction, cases=CLIP_CASES,
    wrong_answers=[
        WrongAnswer("|r − 1| > ε", _cf_both_sides,
                    "a ratio outside [1 − ε, 1 + ε] is clipped only if the advantage pushes it further out: "
                    "count r > 1 + ε with A > 0 and r < 1 − ε with A < 0; the other samples keep their gradient."),
        WrongAnswer("upper side only", _cf_high_only,
                    "you counted only r > 1 + ε with A > 0; samples with A < 0 and r < 1 − ε are clipped too."),
        WrongAnswer("signs swapped", _cf_signs_swapped,
                    "the signs are swapped: with A > 0 the objective rewards a larger ratio, so the clip "
                    "acts above 1 + ε; with A < 0 it acts below 1 − ε."),
        WrongAnswer("a count", _cf_count, "return the share of samples (a number in [0, 1]), not their count."),
        WrongAnswer("ratio without exp", _cf_no_exp,
                    "logp − old_logp is the log of the ratio: compare exp(logp − old_logp) with 1 ± ε."),
    ],
)

# --------------------------------------------------------------------------- 04.3 approx_kl


def _kl_k1(logp, old_logp):
    return (old_logp - logp).mean()


def _kl_k2(logp, old_logp):
    return (0.5 * (logp - old_logp) ** 2).mean()


def _kl_reversed(logp, old_logp):
    lr = old_logp - logp
    return (torch.expm1(lr) - lr).mean()


def _kl_sign(logp, old_logp):
    return -reference_approx_kl(logp, old_logp)


def _kl_sum(logp, old_logp):
    return reference_approx_kl(logp, old_logp) * logp.numel()


_KL_HAND = "old_logp=[-1., -2., -0.5], logp = old_logp + log([2.0, 0.4, 1.0])"


def _kl_hand(f):
    old = _t([-1.0, -2.0, -0.5])
    return f(old + torch.log(_t([2.0, 0.4, 1.0])), old)


def _kl_random(f, seed=1, shape=(4, 16)):
    logp, old, _ = _random_batch(seed, shape)
    return f(logp, old)


KL_CASES = [
    Case("hand-computable ratios", _KL_HAND, _kl_hand),
    Case("identical policies give 0", "logp = old_logp = [-0.3, -1.2, -2.5]",
         lambda f: f(_t([-0.3, -1.2, -2.5]), _t([-0.3, -1.2, -2.5]))),
    Case("ratios below 1 only", "old_logp=[-0.5, -0.5], logp = old_logp + log([0.5, 0.8])",
         lambda f: f(_t([-0.5, -0.5]) + torch.log(_t([0.5, 0.8])), _t([-0.5, -0.5]))),
    Case("mismatched shapes are refused with a ValueError", "logp of shape (3,), old_logp of shape (3, 1)",
         lambda f: f(torch.zeros(3), torch.zeros(3, 1)),
         hint="compare logp.shape with old_logp.shape and raise ValueError when they differ."),
    Case("a random [4, 16] float64 batch", "random float64 log-probs, log-ratios ~ N(0, 0.4²)", _kl_random,
         quick=False, rtol=1e-9, atol=1e-12),
    Case("a random [1000] float64 batch", "1000 random samples (seed 8)", lambda f: _kl_random(f, 8, (1000,)),
         quick=False, rtol=1e-9, atol=1e-12),
]

APPROX_KL = Item(
    exercise="04", number=3, function="approx_kl", title="the k3 estimate of KL(π_old ‖ π_θ)",
    reference=reference_approx_kl, cases=KL_CASES,
    wrong_answers=[
        WrongAnswer("k1", _kl_k1,
                    "this is k1 = mean(old_logp − logp): unbiased but noisy and negative for some "
                    "samples. k3 adds the zero-mean control variate (r − 1): mean((r − 1) − log r)."),
        WrongAnswer("k2", _kl_k2,
                    "this is k2 = ½·mean((log r)²), which is biased; k3 = mean((r − 1) − log r) is "
                    "unbiased and still non-negative."),
        WrongAnswer("direction", _kl_reversed,
                    "wrong direction: the actions were sampled by π_old, so with r = π_θ/π_old the k3 "
                    "estimate of KL(π_old ‖ π_θ) is (r − 1) − log r, not (1/r − 1) + log r."),
        WrongAnswer("sign", _kl_sign, "sign error: a KL divergence (and every k3 term) is ≥ 0."),
        WrongAnswer("sum", _kl_sum, "take the mean over samples, not the sum."),
    ],
)

ITEMS = [CLIPPED_SURROGATE_LOSS, PPO_CLIP_FRACTION, APPROX_KL]
