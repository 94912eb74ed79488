"""Exercise 05 — from PPO to GRPO: group-relative advantages, and the leave-one-out (RLOO) baseline."""

from __future__ import annotations

import torch

from minigrpo.advantages import group_advantages as package_group_advantages
from minigrpo.course.grading.core import Case, Item, WrongAnswer, checked_by

TITLE = "from PPO to GRPO"

EPS = 1e-4  # the package's default eps

# --------------------------------------------------------------------------- inputs (fresh each call)


def _t(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _random_groups(num_prompts: int, group_size: int, seed: int) -> torch.Tensor:
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


def _groups(rewards, group_size):
    return _as_float(rewards).reshape(-1, group_size)


def _ga_population_std(rewards, group_size, scale="group", eps=EPS):
    g = _groups(rewards, group_size)
    c = g - g.mean(1, keepdim=True)
    if scale == "group":
        c = c / (g.std(1, unbiased=False, keepdim=True) + eps)
    elif scale == "batch":
        c = c / (g.reshape(-1).std(unbiased=False) + eps)
    return c.reshape(-1)


def _ga_whole_batch(rewards, group_size, scale="group", eps=EPS):
    r = _as_float(rewards)
    c = r - r.mean()
    return c if scale == "none" else c / (r.std() + eps)


def _ga_batch_mean(rewards, group_size, scale="group", eps=EPS):
    g = _groups(rewards, group_size)
    c = g - g.mean()
    if scale == "group":
        c = c / (g.std(1, keepdim=True) + eps)
    elif scale == "batch":
        c = c / (g.std() + eps)
    return c.reshape(-1)


def _ga_batch_std_for_group(rewards, group_size, scale="group", eps=EPS):
    g = _groups(rewards, group_size)
    c = g - g.mean(1, keepdim=True)
    return (c if scale == "none" else c / (g.std() + eps)).reshape(-1)


def _ga_strided(rewards, group_size, scale="group", eps=EPS):
    g = _as_float(rewards).reshape(group_size, -1).T  # group j = rewards[j::num_prompts]
    c = g - g.mean(1, keepdim=True)
    if scale == "group":
        c = c / (g.std(1, keepdim=True) + eps)
    elif scale == "batch":
        c = c / (g.std() + eps)
    return c.T.reshape(-1)


def _ga_no_eps(rewards, group_size, scale="group", eps=EPS):
    g = _groups(rewards, group_size)
    c = g - g.mean(1, keepdim=True)
    if scale == "group":
        c = c / g.std(1, keepdim=True)
    elif scale == "batch":
        c = c / g.std()
    return c.reshape(-1)


def _ga_eps_in_variance(rewards, group_size, scale="group", eps=EPS):
    g = _groups(rewards, group_size)
    c = g - g.mean(1, keepdim=True)
    if scale == "group":
        c = c / torch.sqrt(g.var(1, keepdim=True) + eps)
    elif scale == "batch":
        c = c / torch.sqrt(g.var() + eps)
    return c.reshape(-1)


def _ga_no_centring(rewards, group_size, scale="group", eps=EPS):
    g = _groups(rewards, group_size)
    if scale == "group":
        return (g / (g.std(1, keepdim=True) + eps)).reshape(-1)
    if scale == "batch":
        return (g / (g.std() + eps)).reshape(-1)
    return g.reshape(-1)


def _ga_batch_std_of_centred(rewards, group_size, scale="group", eps=EPS):
    g = _groups(rewards, group_size)
    c = g - g.mean(1, keepdim=True)
    if scale == "group":
        c = c / (g.std(1, keepdim=True) + eps)
    elif scale == "batch":
        c = c / (c.std() + eps)
    return c.reshape(-1)


def _ga_ignores_scale(rewards, group_size, scale="group", eps=EPS):
    g = _groups(rewards, group_size)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + eps)).reshape(-1)


_LAYOUT_HINT = ("check the sizes first: raise ValueError unless group_size >= 2 and len(rewards) is a positive "
                "multiple of group_size (each prompt needs exactly group_size completions; with one completion "
                "there is no mean to compare with).")

_TWO = [0.0, 1.0, 0.0, 0.0, 3.0, 5.0, 4.0, 8.0]

GA_CASES = [
    Case("one prompt: rewards 85, 92, 70", "rewards=[85., 92., 70.], group_size=3",
         lambda f: f(_t([85.0, 92.0, 70.0]), 3)),
    Case("an all-equal group gets advantage 0, not NaN", "rewards=[1., 1., 1., 1., 0., 1., 0., 0.], group_size=4",
         lambda f: f(_t([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), 4)),
    Case("two prompts with rewards on different scales", "rewards=[0., 1., 0., 0., 3., 5., 4., 8.], group_size=4",
         lambda f: f(_t(_TWO), 4)),
    Case("a group with a small spread (eps matters)", "rewards=[0.50, 0.51, 0.52, 0.53], group_size=4",
         lambda f: f(_t([0.50, 0.51, 0.52, 0.53]), 4)),
    Case("scale='batch': group means, one std for the whole batch",
         "rewards=[0., 1., 0., 0., 3., 5., 4., 8.], group_size=4, scale='batch'",
         lambda f: f(_t(_TWO), 4, scale="batch")),
    Case("scale='none': mean-centred only", "rewards=[0., 1., 0., 0., 3., 5., 4., 8.], group_size=4, scale='none'",
         lambda f: f(_t(_TWO), 4, scale="none")),
    Case("group_size that does not divide the batch is refused with a ValueError", "7 rewards, group_size=3",
         lambda f: f(torch.arange(7.0), 3), hint=_LAYOUT_HINT),
    Case("group_size < 2 is refused with a ValueError", "rewards=[1., 0., 1., 0.], group_size=1",
         lambda f: f(_t([1.0, 0.0, 1.0, 0.0]), 1), hint=_LAYOUT_HINT),
    Case("random float64 rewards, 24 groups of 8 (every fourth all-equal)", "192 random float64 rewards (seed 5), group_size=8",
         lambda f: f(_random_groups(24, 8, 5), 8), quick=False, rtol=1e-9, atol=1e-12),
    Case("random float64 rewards, scale='batch'", "96 random float64 rewards (seed 6), group_size=6, scale='batch'",
         lambda f: f(_random_groups(16, 6, 6), 6, scale="batch"), quick=False, rtol=1e-9, atol=1e-12),
    Case("integer 0/1 rewards (a verifier's output) are accepted", "rewards=tensor([1, 0, 0, 1, 1, 1]) (int64), group_size=3",
         lambda f: f(torch.tensor([1, 0, 0, 1, 1, 1]), 3), quick=False,
         hint="convert integer rewards to a floating dtype first (mean and std are not defined for int64 tensors)."),
    Case("an unknown scale is refused with a ValueError", "rewards=[1., 0., 1., 0.], group_size=2, scale='global'",
         lambda f: f(_t([1.0, 0.0, 1.0, 0.0]), 2, scale="global"), quick=False,
         hint="raise ValueError for any scale other than 'group', 'batch' or 'none' (a typo must not silently "
              "fall back to another normalisation)."),
]

GROUP_ADVANTAGES = Item(
    exercise="05", number=1, function="group_advantages", title="GRPO's group-relative advantages",
    reference=group_advantages, cases=GA_CASES,
    wrong_answers=[
        WrongAnswer("population std", checked_by(package_group_advantages, _ga_population_std),
                    "you divided by the population std (÷ G, unbiased=False, like np.std); the convention here is "
                    "the sample std with Bessel's correction (÷ (G − 1)), what torch.std computes by default."),
        WrongAnswer("whole-batch statistics", checked_by(package_group_advantages, _ga_whole_batch),
                    "you used the mean and std of the whole batch; each prompt is its own group: reshape to "
                    "[num_prompts, group_size] and take the mean and std along dim=1."),
        WrongAnswer("batch mean", checked_by(package_group_advantages, _ga_batch_mean),
                    "you subtracted the mean of the whole batch; subtract each group's own mean (the baseline is "
                    "the average reward of the other answers to the same prompt)."),
        WrongAnswer("batch std for scale='group'", checked_by(package_group_advantages, _ga_batch_std_for_group),
                    "with scale='group' divide by each group's own std; dividing every group by the std of the whole "
                    "batch is scale='batch'."),
        WrongAnswer("strided groups", checked_by(package_group_advantages, _ga_strided),
                    "your groups are strided (rewards[j::num_prompts]); the layout is contiguous: the first "
                    "group_size rewards are prompt 0's, the next group_size prompt 1's — rewards.view(-1, group_size)."),
        WrongAnswer("no eps", checked_by(package_group_advantages, _ga_no_eps),
                    "add eps to the std: (r − mean) / (std + eps). Without it an all-equal group divides 0 by 0 "
                    "(NaN), and the values are slightly off everywhere else."),
        WrongAnswer("eps inside the square root", checked_by(package_group_advantages, _ga_eps_in_variance),
                    "you added eps to the variance (sqrt(var + eps)); the convention is to add it to the std: "
                    "(r − mean) / (std + eps). The two differ a lot when the std is small."),
        WrongAnswer("no centring", checked_by(package_group_advantages, _ga_no_centring),
                    "subtract the group's mean before dividing: the advantage says how much better an answer was "
                    "than the other answers to the same prompt, so it must average to 0 within each group."),
        WrongAnswer("batch std of the centred rewards", checked_by(package_group_advantages, _ga_batch_std_of_centred),
                    "for scale='batch' divide by the std of the raw rewards of the whole batch (rewards.std()), "
                    "not by the std of the group-centred values."),
        WrongAnswer("scale ignored", checked_by(package_group_advantages, _ga_ignores_scale),
                    "honour the scale argument: 'group' divides by each group's std, 'batch' by the whole batch's "
                    "std, 'none' only subtracts the group mean."),
    ],
)

# --------------------------------------------------------------------------- 05.2 rloo_advantages


def rloo_advantages(rewards, group_size):
    """Reference: r_i − mean of the other G − 1 rewards of its group = G/(G−1) · (r_i − group mean)."""
    centred = package_group_advantages(rewards, group_size, scale="none")
    return centred * (group_size / (group_size - 1))


def _rloo_leave_in(rewards, group_size):
    g = _groups(rewards, group_size)
    return (g - g.mean(1, keepdim=True)).reshape(-1)


def _rloo_divide_by_g(rewards, group_size):
    g = _groups(rewards, group_size)
    return (g - (g.sum(1, keepdim=True) - g) / group_size).reshape(-1)


def _rloo_batch(rewards, group_size):
    r = _as_float(rewards)
    return r - (r.sum() - r) / (len(r) - 1)


def _rloo_strided(rewards, group_size):
    g = _as_float(rewards).reshape(group_size, -1).T
    return (g - (g.sum(1, keepdim=True) - g) / (group_size - 1)).T.reshape(-1)


def _rloo_sign(rewards, group_size):
    g = _groups(rewards, group_size)
    return ((g.sum(1, keepdim=True) - g) / (group_size - 1) - g).reshape(-1)


def _rloo_with_std(rewards, group_size):
    g = _groups(rewards, group_size)
    a = g - (g.sum(1, keepdim=True) - g) / (group_size - 1)
    return (a / (g.std(1, keepdim=True) + EPS)).reshape(-1)


_RLOO_LAYOUT_HINT = ("raise ValueError unless group_size >= 2 and len(rewards) is a positive multiple of group_size "
                     "(with one answer per prompt there are no *other* answers to average).")

RLOO_CASES = [
    Case("one prompt: rewards 85, 92, 70", "rewards=[85., 92., 70.], group_size=3",
         lambda f: f(_t([85.0, 92.0, 70.0]), 3)),
    Case("two prompts", "rewards=[1., 0., 0., 0., 1., 1., 0., 1.], group_size=4",
         lambda f: f(_t([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]), 4)),
    Case("G = 2: each answer is compared with the other one", "rewards=[3., 1., 0., 5.], group_size=2",
         lambda f: f(_t([3.0, 1.0, 0.0, 5.0]), 2)),
    Case("an all-equal group gets advantage 0", "rewards=[0.5, 0.5, 0.5, 0.5, 1., 0., 1., 0.], group_size=4",
         lambda f: f(_t([0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 1.0, 0.0]), 4)),
    Case("group_size that does not divide the batch is refused with a ValueError", "7 rewards, group_size=2",
         lambda f: f(torch.arange(7.0), 2), hint=_RLOO_LAYOUT_HINT),
    Case("group_size < 2 is refused with a ValueError", "rewards=[1., 0., 1.], group_size=1",
         lambda f: f(_t([1.0, 0.0, 1.0]), 1), hint=_RLOO_LAYOUT_HINT),
    Case("random float64 rewards, 16 groups of 6", "96 random float64 rewards (seed 7), group_size=6",
         lambda f: f(_random_groups(16, 6, 7), 6), quick=False, rtol=1e-9, atol=1e-12),
]

RLOO_ADVANTAGES = Item(
    exercise="05", number=2, function="rloo_advantages", title="the leave-one-out (RLOO) baseline",
    reference=rloo_advantages, cases=RLOO_CASES,
    wrong_answers=[
        WrongAnswer("leave-in mean", checked_by(package_group_advantages, _rloo_leave_in),
                    "you subtracted the group mean, which includes r_i itself (GRPO's leave-in baseline, biased by "
                    "(G − 1)/G); RLOO's baseline is the mean of the *other* G − 1 rewards: (sum − r_i) / (G − 1)."),
        WrongAnswer("divided by G", checked_by(package_group_advantages, _rloo_divide_by_g),
                    "the mean of the other answers divides their sum by G − 1 (there are G − 1 of them), not by G."),
        WrongAnswer("whole-batch leave-one-out", checked_by(package_group_advantages, _rloo_batch),
                    "you averaged the other rewards of the whole batch; only the other answers to the *same* prompt "
                    "(the same group) form the baseline."),
        WrongAnswer("strided groups", checked_by(package_group_advantages, _rloo_strided),
                    "your groups are strided (rewards[j::num_prompts]); the layout is contiguous — "
                    "rewards.view(-1, group_size) puts each prompt's answers in one row."),
        WrongAnswer("sign", checked_by(package_group_advantages, _rloo_sign),
                    "sign error: the advantage is r_i minus the baseline, so the better-than-the-others answers get "
                    "positive values."),
        WrongAnswer("divided by the std", checked_by(package_group_advantages, _rloo_with_std),
                    "RLOO here is mean-only: no division by the std (that would re-introduce GRPO's difficulty "
                    "weighting). Return r_i − mean of the others."),
    ],
)

ITEMS = [GROUP_ADVANTAGES, RLOO_ADVANTAGES]
