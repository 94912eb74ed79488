"""Exercise 05 — from PPO to GRPO: group-relative advantages, and the leave-one-out (RLOO) baseline."""

from __future__ import annotations

from functools import partial

import torch
from torch import tensor

from minigrpo.advantages import group_advantages as package_group_advantages
from minigrpo_course.grading.core import Case, Item, Made, WrongAnswer, checked_by

TITLE = "from PPO to GRPO"

EPS = 1e-4  # the package's default eps

# --------------------------------------------------------------------------- inputs (fresh each call)


def random_groups(num_prompts: int, group_size: int, seed: int) -> torch.Tensor:
    """Random float64 rewards, with every fourth group made all-equal (a solved or failed prompt)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(num_prompts, group_size, generator=g, dtype=torch.float64) * 2.0 + 1.0
    r[::4] = r[::4, :1]
    return r.reshape(-1)


def _as_float(x) -> torch.Tensor:
    x = torch.as_tensor(x)
    return x if x.is_floating_point() else x.float()


# --------------------------------------------------------------------------- 05.1 group_advantages


def group_advantages(rewards, group_size, scale="group", eps=EPS):
    """Reference: the package's function (sample std, eps added to the std, contiguous groups)."""
    return package_group_advantages(rewards, group_size, scale=scale, eps=eps)


def _ga_variant(rewards, group_size, scale="group", eps=EPS, *, unbiased=True, centre="group", group_scale="group",
                batch_of="raw", eps_in="std", strided=False):
    """Group advantages with one thing done wrong (each wrong answer below switches one knob)."""
    r = _as_float(rewards)
    g = r.reshape(group_size, -1).T if strided else r.reshape(-1, group_size)  # strided: group j = r[j::P]
    c = g - {"group": g.mean(1, keepdim=True), "batch": g.mean(), "none": 0.0}[centre]
    if scale == "none":
        std = None
    elif scale == "group" and group_scale == "group":
        std = g.std(1, unbiased=unbiased, keepdim=True)
    else:  # one std for the whole batch: of the raw rewards, or of the centred ones
        std = (c if batch_of == "centred" else g).std(unbiased=unbiased)
    out = c if std is None else c / (torch.sqrt(std**2 + eps) if eps_in == "var" else std + eps)
    return (out.T if strided else out).reshape(-1)


def _leave_one_out(rewards, group_size, *, by_g=False, strided=False, std=False):
    """RLOO advantages with one thing done wrong."""
    r = _as_float(rewards)
    g = r.reshape(group_size, -1).T if strided else r.reshape(-1, group_size)
    a = g - (g.sum(1, keepdim=True) - g) / (group_size if by_g else group_size - 1)
    a = a / (g.std(1, keepdim=True) + EPS) if std else a
    return (a.T if strided else a).reshape(-1)


# Typical mistakes exercise 11 reuses on one group.
_ga_population_std = partial(_ga_variant, unbiased=False)
_ga_no_centring = partial(_ga_variant, centre="none")
_rloo_with_std = partial(_leave_one_out, std=True)


def _ga_no_eps(rewards, group_size, scale="group", eps=EPS):
    return _ga_variant(rewards, group_size, scale, 0.0)


def _rloo_leave_in(rewards, group_size):
    return package_group_advantages(rewards, group_size, scale="none")


_mistake = partial(checked_by, package_group_advantages)  # refuses what the reference refuses, then errs

_LAYOUT_HINT = ("check the sizes first: raise ValueError unless group_size >= 2 and len(rewards) is a positive "
                "multiple of group_size (each prompt needs exactly group_size completions; with one completion "
                "there is no mean to compare with).")

_TWO = tensor([0.0, 1.0, 0.0, 0.0, 3.0, 5.0, 4.0, 8.0])

GA_CASES = [
    Case("one prompt: rewards 85, 92, 70", (tensor([85.0, 92.0, 70.0]), 3)),
    Case("an all-equal group gets advantage 0, not NaN", (tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), 4)),
    Case("two prompts with rewards on different scales", (_TWO, 4)),
    Case("a group with a small spread (eps matters)", (tensor([0.50, 0.51, 0.52, 0.53]), 4)),
    Case("scale='batch': group means, one std for the whole batch", (_TWO, 4), {"scale": "batch"}),
    Case("scale='none': mean-centred only", (_TWO, 4), {"scale": "none"}),
    Case("group_size that does not divide the batch is refused with a ValueError", (torch.arange(7.0), 3),
         hint=_LAYOUT_HINT),
    Case("group_size < 2 is refused with a ValueError", (tensor([1.0, 0.0, 1.0, 0.0]), 1), hint=_LAYOUT_HINT),
    Case("random float64 rewards, 24 groups of 8 (every fourth all-equal)", (Made(random_groups, 24, 8, seed=5), 8),
         quick=False, rtol=1e-9, atol=1e-12),
    Case("random float64 rewards, scale='batch'", (Made(random_groups, 16, 6, seed=6), 6), {"scale": "batch"},
         quick=False, rtol=1e-9, atol=1e-12),
    Case("integer 0/1 rewards (a verifier's output) are accepted", (tensor([1, 0, 0, 1, 1, 1]), 3), quick=False,
         hint="convert integer rewards to a floating dtype first (mean and std are not defined for int64 tensors)."),
    Case("an unknown scale is refused with a ValueError", (tensor([1.0, 0.0, 1.0, 0.0]), 2), {"scale": "global"},
         quick=False, hint="raise ValueError for any scale other than 'group', 'batch' or 'none' (a typo must not "
                           "silently fall back to another normalisation)."),
]

GROUP_ADVANTAGES = Item(
    exercise="05", number=1, function="group_advantages", title="GRPO's group-relative advantages",
    reference=group_advantages, cases=GA_CASES,
    wrong_answers=[
        WrongAnswer("population std", _mistake(_ga_population_std),
                    "you divided by the population std (÷ G, unbiased=False, like np.std); the convention here is "
                    "the sample std with Bessel's correction (÷ (G − 1)), what torch.std computes by default."),
        WrongAnswer("whole-batch statistics", _mistake(partial(_ga_variant, centre="batch", group_scale="batch")),
                    "you used the mean and std of the whole batch; each prompt is its own group: reshape to "
                    "[num_prompts, group_size] and take the mean and std along dim=1."),
        WrongAnswer("batch mean", _mistake(partial(_ga_variant, centre="batch")),
                    "you subtracted the mean of the whole batch; subtract each group's own mean (the baseline is "
                    "the average reward of the other answers to the same prompt)."),
        WrongAnswer("batch std for scale='group'", _mistake(partial(_ga_variant, group_scale="batch")),
                    "with scale='group' divide by each group's own std; dividing every group by the std of the whole "
                    "batch is scale='batch'."),
        WrongAnswer("strided groups", _mistake(partial(_ga_variant, strided=True)),
                    "your groups are strided (rewards[j::num_prompts]); the layout is contiguous: the first "
                    "group_size rewards are prompt 0's, the next group_size prompt 1's — rewards.view(-1, group_size)."),
        WrongAnswer("no eps", _mistake(_ga_no_eps),
                    "add eps to the std: (r − mean) / (std + eps). Without it an all-equal group divides 0 by 0 "
                    "(NaN), and the values are slightly off everywhere else."),
        WrongAnswer("eps inside the square root", _mistake(partial(_ga_variant, eps_in="var")),
                    "you added eps to the variance (sqrt(var + eps)); the convention is to add it to the std: "
                    "(r − mean) / (std + eps). The two differ a lot when the std is small."),
        WrongAnswer("no centring", _mistake(_ga_no_centring),
                    "subtract the group's mean before dividing: the advantage says how much better an answer was "
                    "than the other answers to the same prompt, so it must average to 0 within each group."),
        WrongAnswer("batch std of the centred rewards", _mistake(partial(_ga_variant, batch_of="centred")),
                    "for scale='batch' divide by the std of the raw rewards of the whole batch (rewards.std()), "
                    "not by the std of the group-centred values."),
        WrongAnswer("scale ignored", _mistake(lambda r, G, scale="group", eps=EPS: _ga_variant(r, G, "group", eps)),
                    "honour the scale argument: 'group' divides by each group's std, 'batch' by the whole batch's "
                    "std, 'none' only subtracts the group mean."),
    ],
)

# --------------------------------------------------------------------------- 05.2 rloo_advantages


def rloo_advantages(rewards, group_size):
    """Reference: r_i − mean of the other G − 1 rewards of its group = G/(G−1) · (r_i − group mean)."""
    centred = package_group_advantages(rewards, group_size, scale="none")
    return centred * (group_size / (group_size - 1))


_RLOO_LAYOUT_HINT = ("raise ValueError unless group_size >= 2 and len(rewards) is a positive multiple of group_size "
                     "(with one answer per prompt there are no *other* answers to average).")

RLOO_CASES = [
    Case("one prompt: rewards 85, 92, 70", (tensor([85.0, 92.0, 70.0]), 3)),
    Case("two prompts", (tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]), 4)),
    Case("G = 2: each answer is compared with the other one", (tensor([3.0, 1.0, 0.0, 5.0]), 2)),
    Case("an all-equal group gets advantage 0", (tensor([0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 1.0, 0.0]), 4)),
    Case("group_size that does not divide the batch is refused with a ValueError", (torch.arange(7.0), 2),
         hint=_RLOO_LAYOUT_HINT),
    Case("group_size < 2 is refused with a ValueError", (tensor([1.0, 0.0, 1.0]), 1), hint=_RLOO_LAYOUT_HINT),
    Case("random float64 rewards, 16 groups of 6", (Made(random_groups, 16, 6, seed=7), 6), quick=False,
         rtol=1e-9, atol=1e-12),
]

RLOO_ADVANTAGES = Item(
    exercise="05", number=2, function="rloo_advantages", title="the leave-one-out (RLOO) baseline",
    reference=rloo_advantages, cases=RLOO_CASES,
    wrong_answers=[
        WrongAnswer("leave-in mean", _mistake(_rloo_leave_in),
                    "you subtracted the group mean, which includes r_i itself (GRPO's leave-in baseline, biased by "
                    "(G − 1)/G); RLOO's baseline is the mean of the *other* G − 1 rewards: (sum − r_i) / (G − 1)."),
        WrongAnswer("divided by G", _mistake(partial(_leave_one_out, by_g=True)),
                    "the mean of the other answers divides their sum by G − 1 (there are G − 1 of them), not by G."),
        WrongAnswer("whole-batch leave-one-out", _mistake(lambda r, G: _leave_one_out(r, len(r))),
                    "you averaged the other rewards of the whole batch; only the other answers to the *same* prompt "
                    "(the same group) form the baseline."),
        WrongAnswer("strided groups", _mistake(partial(_leave_one_out, strided=True)),
                    "your groups are strided (rewards[j::num_prompts]); the layout is contiguous — "
                    "rewards.view(-1, group_size) puts each prompt's answers in one row."),
        WrongAnswer("sign", _mistake(lambda r, G: -_leave_one_out(r, G)),
                    "sign error: the advantage is r_i minus the baseline, so the better-than-the-others answers get "
                    "positive values."),
        WrongAnswer("divided by the std", _mistake(_rloo_with_std),
                    "RLOO here is mean-only: no division by the std (that would re-introduce GRPO's difficulty "
                    "weighting). Return r_i − mean of the others."),
    ],
)

ITEMS = [GROUP_ADVANTAGES, RLOO_ADVANTAGES]
