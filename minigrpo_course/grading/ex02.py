"""Exercise 02 — actor-critic and GAE: TD residuals, GAE with episode boundaries, explained variance, one-step
targets with both kinds of episode end, and an ablation that plants "truncation as termination" and measures it."""

from __future__ import annotations

from functools import partial

import torch
from torch import tensor

from minigrpo.advantages import gae as package_gae
from minigrpo.control.onpolicy import explained_variance as package_explained_variance
from minigrpo_course.grading.core import Call, Case, Item, Made, Spread, WrongAnswer, checked_by

TITLE = "actor-critic and GAE"

F, T = False, True


def random_rollout(T: int, N: int | None = None, seed: int = 0, p_term: float = 0.1, p_trunc: float = 0.05,
                   truncated: bool = True):
    """Random float64 rewards, values, next_values and random episode ends (a step is never both
    terminated and truncated); without ``truncated``, the first four only."""
    g = torch.Generator().manual_seed(seed)
    shape = (T,) if N is None else (T, N)
    r = torch.randn(shape, generator=g, dtype=torch.float64)
    v = torch.randn(shape, generator=g, dtype=torch.float64)
    nv = torch.randn(shape, generator=g, dtype=torch.float64)
    u = torch.rand(shape, generator=g)
    term, trunc = u < p_term, (u >= p_term) & (u < p_term + p_trunc)
    return (r, v, nv, term, trunc) if truncated else (r, v, nv, term)


def ends_at(T: int, t: int) -> torch.Tensor:
    """A [T] bool tensor, True at step t only."""
    return torch.arange(T) == t


def noisy_critic(n: int, seed: int):
    """(values, returns): returns ~ N(0, 1), values = 0.8·returns + 0.3·noise, float64."""
    r, noise = random_rollout(n, seed=seed)[:2]
    return 0.8 * r + 0.3 * noise, r


def _as_float(x) -> torch.Tensor:
    x = torch.as_tensor(x)
    return x if x.is_floating_point() else x.float()


# --------------------------------------------------------------------------- 02.1 td_residuals


def td_residuals(rewards, values, next_values, terminated, gamma):
    """Reference: δ_t = r_t + γ·(1 − terminated_t)·next_values_t − values_t (GAE with λ = 0)."""
    term = torch.as_tensor(terminated, dtype=torch.bool)
    return package_gae(rewards, values, next_values, term, torch.zeros_like(term), gamma, 0.0)


def _td_shifted_values(rewards, values, next_values, terminated, gamma):
    v, nv = _as_float(values), _as_float(next_values)
    following = torch.cat([v[1:], nv[-1:]])  # values[t + 1] (the next row), next_values only at the end
    keep = (~torch.as_tensor(terminated, dtype=torch.bool)).to(v.dtype)
    return _as_float(rewards) + gamma * keep * following - v


_TD_SHAPE_HINT = ("check the shapes first: if values, next_values or terminated differ in shape from rewards, "
                  "raise ValueError (otherwise [3] and [3, 1] broadcast silently to [3, 3]).")

TD_CASES = [
    Case("one episode that ends in a terminal state, γ = 0.5",
         (tensor([1.0, 1.0, 1.0]), tensor([2.0, 1.0, 0.5]), tensor([1.0, 0.5, 4.0]), tensor([F, F, T]), 0.5)),
    Case("an episode cut by a time limit at t = 1: next_values[1] is V(final obs), values[2] is V(reset obs)",
         (tensor([1.0, 1.0, 1.0]), tensor([1.0, 2.0, 0.0]), tensor([2.0, 3.0, 1.0]), tensor([F, F, F]), 0.5)),
    Case("two envs side by side, shape [T, N] = [2, 2]",
         (tensor([[1.0, 0.0], [2.0, 1.0]]), tensor([[1.0, 1.0], [2.0, 0.0]]), tensor([[2.0, 3.0], [5.0, 1.0]]),
          tensor([[F, F], [T, F]]), 0.9)),
    Case("mismatched shapes are refused with a ValueError",
         (torch.ones(3), torch.ones(3, 1), torch.ones(3), tensor([F, F, F]), 0.9), hint=_TD_SHAPE_HINT),
    Case("random float64 [64, 4] batch with random terminations, γ = 0.97",
         (Spread(random_rollout, 64, 4, seed=1, truncated=False), 0.97), quick=False, rtol=1e-9, atol=1e-9),
    Case("terminated given as 0/1 integers (int64)",
         (tensor([1.0, 1.0, 1.0]), tensor([2.0, 1.0, 0.5]), tensor([1.0, 0.5, 4.0]), tensor([0, 0, 1]), 0.5),
         quick=False, hint="turn the flags into booleans first (terminated.bool()): on an int64 tensor `~` is a bitwise "
                           "not (~0 = −1, ~1 = −2), not 'not terminated'."),
]

TD_RESIDUALS = Item(
    exercise="02", number=1, function="td_residuals", title="one-step TD residuals",
    reference=td_residuals, cases=TD_CASES,
    wrong_answers=[
        WrongAnswer("bootstraps at terminal steps",
                    lambda r, v, nv, term, gamma: _as_float(r) + gamma * _as_float(nv) - _as_float(v),
                    "a terminated step has no future: its δ is r_t − V(s_t). Multiply the bootstrap term by "
                    "(1 − terminated) (or use torch.where) so next_values is ignored there."),
        WrongAnswer("values[t + 1] instead of next_values", _td_shifted_values,
                    "use next_values[t], not values[t + 1]: after an episode ends, row t + 1 holds the *next* "
                    "episode's first state (a vector env resets in place), so values[t + 1] is the wrong state."),
        WrongAnswer("no discount", lambda r, v, nv, term, gamma: td_residuals(r, v, nv, term, 1.0),
                    "the bootstrap is discounted: δ_t = r_t + γ·V(s_{t+1}) − V(s_t)."),
        WrongAnswer("bitwise not of integer flags", checked_by(td_residuals, lambda r, v, nv, term, gamma: (
                    _as_float(r) + gamma * (~torch.as_tensor(term)).to(_as_float(r).dtype) * _as_float(nv)
                    - _as_float(v))),
                    "with 0/1 integer flags, `~terminated` is −1/−2 (a bitwise not), not 'not terminated': convert "
                    "with terminated.bool() first (a mask in the values' dtype: (~terminated.bool()).to(values.dtype)).",
                    quick=False),
    ],
)

# --------------------------------------------------------------------------- 02.2 gae


def _gae_variant(rewards, values, next_values, terminated, truncated, gamma, lam, *, boot_mask="term",
                 stop_mask="done", factor="γλ", forward=False, bootstrap_last=True, flags_from_next=False):
    """GAE with one thing done wrong (each wrong answer below switches one of these knobs)."""
    r, v, nv = _as_float(rewards), _as_float(values), _as_float(next_values)
    nv, v = nv.to(r.dtype), v.to(r.dtype)
    term = torch.as_tensor(terminated, dtype=torch.bool)
    trunc = torch.as_tensor(truncated, dtype=torch.bool)
    done = term | trunc
    no_boot = {"term": term, "done": done, "none": torch.zeros_like(term)}[boot_mask]
    stop = {"done": done, "term": term, "none": torch.zeros_like(term)}[stop_mask]
    if flags_from_next:
        stop = torch.cat([stop[1:], torch.zeros_like(stop[:1])])
    boot = torch.where(no_boot, torch.zeros_like(nv), nv)
    if not bootstrap_last:
        boot = boot.clone()
        boot[-1] = 0.0
    deltas = r + gamma * boot - v
    keep = (~stop).to(r.dtype)
    k = {"γλ": gamma * lam, "γ": gamma, "λ": lam}[factor]
    adv, running = torch.zeros_like(r), torch.zeros_like(r[0])
    steps = range(len(r)) if forward else range(len(r) - 1, -1, -1)
    for t in steps:
        if forward:
            running = deltas[t] + k * running
            adv[t] = running
            running = running * keep[t]  # reset after an episode end
        else:
            running = deltas[t] + k * keep[t] * running
            adv[t] = running
    return adv


def _gae_flattened(rewards, values, next_values, terminated, truncated, gamma, lam):
    r = _as_float(rewards)
    flat = [torch.as_tensor(x).reshape(-1) for x in (r, values, next_values, terminated, truncated)]
    return _gae_variant(*flat, gamma, lam).reshape(r.shape)


def _gae_raw_flags(rewards, values, next_values, terminated, truncated, gamma, lam):
    """GAE whose masks are `~flag` of the flags as given (right for bool flags, not for 0/1 integers)."""
    r, v, nv = _as_float(rewards), _as_float(values), _as_float(next_values)
    term, trunc = torch.as_tensor(terminated), torch.as_tensor(truncated)
    boot, keep = (~term).to(r.dtype), (~(term | trunc)).to(r.dtype)
    deltas = r + gamma * boot * nv - v
    adv, running = torch.zeros_like(r), torch.zeros_like(r[0])
    for t in range(len(r) - 1, -1, -1):
        running = deltas[t] + gamma * lam * keep[t] * running
        adv[t] = running
    return adv


_GAE_SHAPE_HINT = ("check the shapes first: values, next_values, terminated and truncated must all have the "
                   "shape of rewards; raise ValueError when one differs (broadcasting would hide the bug).")

# Hand-computable inputs (γ = 0.5, λ = 0.8 so that γ, λ and γλ = 0.4 are three different numbers).
GAE_CASES = [
    Case("one episode that ends in a terminal state, γ = 0.5, λ = 0.8",
         (tensor([1.0, 1.0, 1.0]), tensor([2.0, 1.0, 0.5]), tensor([1.0, 0.5, 4.0]), tensor([F, F, T]),
          tensor([F, F, F]), 0.5, 0.8)),
    Case("a rollout that stops mid-episode: the last step bootstraps from next_values",
         (tensor([1.0, 0.0, 2.0]), tensor([1.0, 1.0, 1.0]), tensor([1.0, 1.0, 3.0]), tensor([F, F, F]),
          tensor([F, F, F]), 0.5, 0.8)),
    Case("truncation at t = 1: bootstrap from next_values[1], and do not look past the boundary",
         (tensor([1.0, 1.0, 1.0, 1.0]), tensor([1.0, 2.0, 0.0, 1.0]), tensor([2.0, 4.0, 1.0, 2.0]),
          tensor([F, F, F, F]), tensor([F, T, F, F]), 0.5, 0.8)),
    Case("termination at t = 1 (next_values[1] holds a meaningless 10.)",
         (tensor([1.0, 1.0, 1.0, 1.0]), tensor([1.0, 2.0, 0.0, 1.0]), tensor([2.0, 10.0, 1.0, 2.0]),
          tensor([F, T, F, F]), tensor([F, F, F, F]), 0.5, 0.8)),
    Case("two envs, shape [T, N] = [3, 2]: env 0 terminates at t = 0, env 1 is truncated at t = 1",
         (tensor([[1.0, 2.0], [0.0, 1.0], [1.0, 1.0]]), tensor([[1.0, 0.0], [2.0, 1.0], [0.0, 2.0]]),
          tensor([[5.0, 1.0], [0.0, 3.0], [1.0, 1.0]]), tensor([[T, F], [F, F], [F, F]]),
          tensor([[F, F], [F, T], [F, F]]), 0.5, 0.8)),
    Case("λ = 0 gives the TD residuals δ_t",
         (tensor([1.0, 2.0, 3.0]), tensor([1.0, 1.0, 1.0]), tensor([2.0, 0.0, 5.0]), tensor([F, F, F]),
          tensor([F, F, F]), 0.9, 0.0)),
    Case("λ = 1 on an episode that terminates: discounted return minus V",
         (tensor([1.0, 2.0, 3.0]), tensor([4.0, 3.0, 2.0]), tensor([3.0, 2.0, 7.0]), tensor([F, F, T]),
          tensor([F, F, F]), 0.5, 1.0)),
    Case("mismatched shapes are refused with a ValueError",
         (torch.ones(3), torch.ones(3, 1), torch.ones(3), tensor([F, F, F]), tensor([F, F, F]), 0.9, 0.95),
         hint=_GAE_SHAPE_HINT),
    Case("episode-end flags given as 0/1 integers (int64), one of each kind",
         (tensor([1.0, 1.0, 1.0, 1.0]), tensor([1.0, 2.0, 0.0, 1.0]), tensor([2.0, 4.0, 1.0, 2.0]),
          tensor([0, 0, 1, 0]), tensor([0, 1, 0, 0]), 0.5, 0.8), quick=False,
         hint="turn the flags into booleans (terminated.bool()) before combining them: on an int64 tensor "
              "`~` is a bitwise not (~0 = −1, ~1 = −2), not 'not ended'."),
    Case("random float64 [T] rollout, T = 200, γ = 0.99, λ = 0.95", (Spread(random_rollout, 200, seed=2), 0.99, 0.95),
         quick=False, rtol=1e-9, atol=1e-9),
    Case("random float64 [T, N] rollout, [64, 8], γ = 0.97, λ = 0.9", (Spread(random_rollout, 64, 8, seed=3), 0.97, 0.9),
         quick=False, rtol=1e-9, atol=1e-9),
    Case("λ = 1, γ = 1 on a long CartPole-like episode (reward 1 per step, terminated at the end)",
         (Made(torch.ones, 300, dtype=torch.float64), Made(torch.zeros, 300, dtype=torch.float64),
          Made(torch.zeros, 300, dtype=torch.float64), Made(ends_at, 300, t=299),
          Made(torch.zeros, 300, dtype=torch.bool), 1.0, 1.0), quick=False),
]

GAE = Item(
    exercise="02", number=2, function="gae", title="generalized advantage estimation with episode boundaries",
    reference=package_gae, cases=GAE_CASES,
    wrong_answers=[
        WrongAnswer("truncation treated as termination", partial(_gae_variant, boot_mask="done"),
                    "a truncated step was treated like a terminal one: a time limit does not make the future "
                    "worthless, so δ_t must still bootstrap from next_values[t]. Zero the bootstrap only where "
                    "terminated is True (the recursion stops at both kinds of end)."),
        WrongAnswer("recursion never reset", partial(_gae_variant, stop_mask="none"),
                    "the running sum never restarts: after *any* episode end (terminated or truncated) the next row "
                    "belongs to a new episode, so A_t = δ_t + γλ·(1 − terminated_t)·(1 − truncated_t)·A_{t+1}."),
        WrongAnswer("recursion crosses a truncation", partial(_gae_variant, stop_mask="term"),
                    "your advantages leak across a truncation: the running sum must restart after *any* episode "
                    "end (terminated or truncated), because the next row belongs to a new episode. Multiply "
                    "A_{t+1} by (1 − terminated_t)·(1 − truncated_t)."),
        WrongAnswer("next_values used at terminal steps", partial(_gae_variant, boot_mask="none"),
                    "at a terminated step nothing follows: δ_t = r_t − V(s_t). next_values[t] there is "
                    "meaningless (a vector env may even put the reset state's value in it); mask it out."),
        WrongAnswer("recursion with γ only", partial(_gae_variant, factor="γ"),
                    "the recursion's factor is γ·λ, not γ: A_t = δ_t + γλ·(1 − done_t)·A_{t+1}. "
                    "(δ itself already carries the single γ of the bootstrap.)"),
        WrongAnswer("recursion with λ only", partial(_gae_variant, factor="λ"),
                    "the recursion's factor is γ·λ, not λ: A_t = δ_t + γλ·(1 − done_t)·A_{t+1}; δ_{t+k} "
                    "is weighted by (γλ)^k."),
        WrongAnswer("accumulated forwards", partial(_gae_variant, forward=True),
                    "you accumulated from the past: A_t sums δ of *later* steps, so loop backwards from the "
                    "last step, t = T−1, …, 0."),
        WrongAnswer("last step not bootstrapped", partial(_gae_variant, bootstrap_last=False),
                    "the rollout's last step is not an episode end: when it is neither terminated nor "
                    "truncated, δ_{T−1} = r + γ·next_values[T−1] − V, like any other step."),
        WrongAnswer("episode-end flags off by one", partial(_gae_variant, flags_from_next=True),
                    "off by one: the flags at index t say whether step t ended its episode, so they decide "
                    "whether A_t may look at A_{t+1}. Use terminated[t] / truncated[t], not the flags of t + 1."),
        WrongAnswer("bitwise not of integer flags", checked_by(package_gae, _gae_raw_flags),
                    "with 0/1 integer flags, `~flags` is −1/−2 (a bitwise not), so your masks were wrong: convert the "
                    "flags with .bool() first (a mask in the values' dtype: (~done.bool()).to(values.dtype)).",
                    quick=False),
        WrongAnswer("[T, N] flattened", _gae_flattened,
                    "the envs got mixed: flattening [T, N] interleaves N environments into one stream. "
                    "Run the recursion over the time axis only, on whole rows: running = δ[t] + γλ·mask[t]·running "
                    "with running of shape [N]."),
    ],
)

# --------------------------------------------------------------------------- 02.3 explained_variance


def explained_variance(values, returns):
    """Reference: 1 − Var(returns − values) / Var(returns), NaN when Var(returns) = 0."""
    return package_explained_variance(_as_float(values).reshape(-1), _as_float(returns).reshape(-1))


def _ev_guarded(formula):
    """A wrong formula that still returns NaN for constant returns (so the hint names the formula)."""
    def fn(values, returns):
        v, r = _as_float(values), _as_float(returns)
        return float("nan") if r.var() == 0 else formula(v, r)
    return fn


def _ev_corr2(v, r):
    v, r = v.reshape(-1), r.reshape(-1)
    vc, rc = v - v.mean(), r - r.mean()
    return float((vc * rc).sum() ** 2 / ((vc**2).sum() * (rc**2).sum()))


_RET = tensor([1.0, 2.0, 3.0, 4.0])

EV_CASES = [
    Case("a hand example", (tensor([1.5, 1.5, 3.5, 3.5]), _RET)),
    Case("a perfect critic explains everything", (_RET, _RET)),
    Case("a critic off by a constant still explains all the variance", (_RET + 5, _RET)),
    Case("a critic that predicts the mean return explains nothing", (tensor([2.5] * 4), _RET)),
    Case("a critic worse than a constant: negative", (tensor([4.0, 3.0, 2.0, 1.0]), _RET)),
    Case("a [T, N] batch counts all its elements", (tensor([[1.0, 2.0], [2.0, 2.0]]), tensor([[1.0, 3.0], [2.0, 4.0]])),
         hint="compute one number over all the elements (flatten first); a per-env variance gives one value per column."),
    Case("constant returns: undefined, return NaN", (tensor([1.0, 2.0, 3.0]), tensor([2.0, 2.0, 2.0])),
         hint="when Var(returns) is 0 the ratio is undefined: return float('nan') instead of dividing by zero."),
    Case("random float64 critic on 1000 returns", (Spread(noisy_critic, 1000, seed=4),), quick=False,
         rtol=1e-9, atol=1e-9),
    Case("integer returns and values (int64) are accepted", (tensor([1, 1, 3, 3]), tensor([1, 2, 3, 4])), quick=False,
         hint="convert to a floating dtype first: torch's var and mean are not defined for int64 tensors."),
]

EXPLAINED_VARIANCE = Item(
    exercise="02", number=3, function="explained_variance", title="explained variance of a critic",
    reference=explained_variance, cases=EV_CASES,
    wrong_answers=[
        WrongAnswer("ratio of variances", _ev_guarded(lambda v, r: float(1 - v.var() / r.var())),
                    "this compares the spread of the predictions with the spread of the returns; explained "
                    "variance measures the *error*: 1 − Var(returns − values) / Var(returns)."),
        WrongAnswer("MSE instead of variance",
                    _ev_guarded(lambda v, r: float(1 - ((r - v) ** 2).mean() / r.var())),
                    "the numerator is the variance of the residual, not its mean square: explained variance "
                    "ignores a constant offset (which an advantage never sees) and only asks how much of the "
                    "returns' variation the critic tracks."),
        WrongAnswer("arguments swapped", _ev_guarded(lambda v, r: float(1 - (r - v).var() / v.var())),
                    "divide by the variance of the *returns* (the targets), not of the predictions."),
        WrongAnswer("squared correlation", _ev_guarded(_ev_corr2),
                    "the squared correlation ignores the scale of the predictions; explained variance is "
                    "1 − Var(returns − values) / Var(returns), which can be negative for a bad critic."),
    ],
)


# --------------------------------------------------------------------------- 02.4 td_targets


def td_targets(rewards, next_values, terminated, truncated, gamma, truncation_is_terminal=False):
    """Reference: y_t = r_t + γ·(1 − stop_t)·next_values_t, stop = terminated (or terminated | truncated when
    ``truncation_is_terminal``: the planted bug of the ablation). A step both terminated and truncated stops."""
    r = _as_float(rewards)
    nv = torch.as_tensor(next_values, dtype=r.dtype)
    term = torch.as_tensor(terminated, dtype=torch.bool)
    trunc = torch.as_tensor(truncated, dtype=torch.bool)
    for name, x in (("next_values", nv), ("terminated", term), ("truncated", trunc)):
        if x.shape != r.shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, rewards has shape {tuple(r.shape)}")
    stop = term | trunc if truncation_is_terminal else term
    return r + gamma * torch.where(stop, torch.zeros_like(nv), nv)


def _targets_variant(rewards, next_values, terminated, truncated, gamma, truncation_is_terminal=False, *,
                     stop="term", flag="adds truncation", both="terminated wins"):
    """td_targets with one typical mistake (each wrong answer switches one knob); the reference's input checks
    come first, so a wrong answer differs from it by its one mistake only."""
    td_targets(rewards, next_values, terminated, truncated, gamma, truncation_is_terminal)
    r = _as_float(rewards)
    nv = torch.as_tensor(next_values, dtype=r.dtype)
    term, trunc = torch.as_tensor(terminated, dtype=torch.bool), torch.as_tensor(truncated, dtype=torch.bool)
    if both == "truncated wins":
        term = term & ~trunc
    planted = {"adds truncation": truncation_is_terminal, "ignored": False, "inverted": not truncation_is_terminal}[flag]
    base = {"term": term, "done": term | trunc, "none": torch.zeros_like(term)}[stop]
    halt = base | trunc if planted else base
    return r + gamma * torch.where(halt, torch.zeros_like(nv), nv)


def _targets_raw_flags(rewards, next_values, terminated, truncated, gamma, truncation_is_terminal=False):
    """The mask as `1 − terminated` / `~terminated` of the flags as given (right for bool flags, not 0/1 integers)."""
    r = _as_float(rewards)
    term, trunc = torch.as_tensor(terminated), torch.as_tensor(truncated)
    stop = term | trunc if truncation_is_terminal else term
    return r + gamma * (~stop).to(r.dtype) * torch.as_tensor(next_values, dtype=r.dtype)


def _random_targets_rollout(T, N, seed):
    """(rewards, next_values, terminated, truncated) of :func:`random_rollout`."""
    r, _, nv, term, trunc = random_rollout(T, N, seed=seed, p_trunc=0.1)
    return r, nv, term, trunc


_TARGET_SHAPE_HINT = ("check the shapes first: next_values, terminated and truncated must all have the shape of "
                      "rewards; raise ValueError when one differs (broadcasting would hide the bug).")

TARGET_CASES = [
    Case("a truncation at t = 1 bootstraps from next_values[1], V of the episode's final observation",
         (tensor([1.0, 1.0, 1.0]), tensor([2.0, 3.0, 4.0]), tensor([F, F, F]), tensor([F, T, F]), 0.5)),
    Case("a termination at t = 2 bootstraps nothing (next_values[2] = 10 is meaningless)",
         (tensor([1.0, 1.0, 1.0]), tensor([2.0, 3.0, 10.0]), tensor([F, F, T]), tensor([F, F, F]), 0.5)),
    Case("truncation_is_terminal=True plants the bug: the truncated step t = 1 gets r alone",
         (tensor([1.0, 1.0, 1.0]), tensor([2.0, 3.0, 4.0]), tensor([F, F, F]), tensor([F, T, F]), 0.5),
         {"truncation_is_terminal": True}),
    Case("a step both terminated and truncated (gymnasium allows it) is terminal: t = 1 gets r alone",
         (tensor([1.0, 1.0]), tensor([4.0, 6.0]), tensor([F, T]), tensor([F, T]), 0.5),
         hint="terminated decides: a terminal state has no future even if the time limit struck at the same step."),
    Case("two envs, shape [T, N] = [2, 3]: each kind of end once, and a step of each env that goes on",
         (tensor([[1.0, 2.0, 0.0], [1.0, 1.0, 3.0]]), tensor([[5.0, 1.0, 2.0], [2.0, 4.0, 8.0]]),
          tensor([[T, F, F], [F, F, F]]), tensor([[F, F, T], [F, F, F]]), 0.9)),
    Case("mismatched shapes are refused with a ValueError",
         (torch.ones(3), torch.ones(3, 1), tensor([F, F, F]), tensor([F, F, F]), 0.9), hint=_TARGET_SHAPE_HINT),
    Case("random float64 [64, 4] rollout with both kinds of end, γ = 0.97",
         (Spread(_random_targets_rollout, 64, 4, seed=5), 0.97), quick=False, rtol=1e-9, atol=1e-9),
    Case("the same rollout with the bug planted", (Spread(_random_targets_rollout, 64, 4, seed=5), 0.97),
         {"truncation_is_terminal": True}, quick=False, rtol=1e-9, atol=1e-9),
    Case("episode-end flags given as 0/1 integers (int64), with the bug planted",
         (tensor([1.0, 1.0, 1.0, 1.0]), tensor([2.0, 4.0, 1.0, 2.0]), tensor([0, 0, 1, 0]), tensor([0, 1, 0, 0]), 0.5),
         {"truncation_is_terminal": True}, quick=False,
         hint="turn the flags into booleans (terminated.bool()) before combining them: on an int64 tensor `~` is a "
              "bitwise not (~0 = −1, ~1 = −2), not 'not ended'."),
]


TD_TARGETS = Item(
    exercise="02", number=4, function="td_targets", title="one-step targets with both kinds of episode end",
    reference=td_targets, cases=TARGET_CASES,
    wrong_answers=[
        WrongAnswer("bootstraps at terminal steps", partial(_targets_variant, stop="none"),
                    "a terminated step has no future: its target is r_t alone. Zero the bootstrap where terminated "
                    "is True (torch.where(terminated, 0, next_values))."),
        WrongAnswer("truncation always terminal", partial(_targets_variant, stop="done"),
                    "a time limit does not end the task: a truncated step still bootstraps from next_values[t] (V of "
                    "the final observation). Only with truncation_is_terminal=True (the planted bug) does it stop."),
        WrongAnswer("truncation_is_terminal ignored", partial(_targets_variant, flag="ignored"),
                    "truncation_is_terminal=True must plant the bug: then a truncated step stops like a terminated "
                    "one (stop = terminated | truncated)."),
        WrongAnswer("truncation_is_terminal inverted", partial(_targets_variant, flag="inverted"),
                    "the flag is upside down: by default (False) truncated steps bootstrap; True makes them stop."),
        WrongAnswer("truncated wins when both", partial(_targets_variant, both="truncated wins"),
                    "a step can be terminated and truncated at once: it is terminal (the state has no future), so "
                    "no bootstrap; test terminated, not 'truncated and not terminated'."),
        WrongAnswer("no discount", lambda r, nv, term, trunc, gamma, truncation_is_terminal=False: td_targets(
                    r, nv, term, trunc, 1.0, truncation_is_terminal),
                    "the bootstrap is discounted: y_t = r_t + γ·V(s_{t+1})."),
        WrongAnswer("bitwise not of integer flags", checked_by(td_targets, _targets_raw_flags),
                    "with 0/1 integer flags, `~flags` is −1/−2 (a bitwise not), not 'not ended': convert the flags "
                    "with .bool() first (then torch.where(stop, 0.0, next_values) keeps the values' dtype).",
                    quick=False),
    ],
)

# --------------------------------------------------------------------------- 02.5 time_limit_ablation


def time_limit_ablation(seeds, total_timesteps: int = 8000, targets=td_targets, planted=(False, True)):
    """Reference: for each seed, A2C (λ = 0) on CashOut with the correct targets and with truncation treated as
    termination; the mean episode length over the second half of training, {"bootstrap": [...], "terminal": [...]}
    (Python floats). ``planted`` says which bug flag each of the two runs gets (the wrong answers change it)."""
    from minigrpo_course.experiments.time_limits import cash_out_config, late_episode_length, train_a2c_on_targets

    lengths = {"bootstrap": [], "terminal": []}
    for seed in seeds:
        for name, terminal in zip(lengths, planted):
            def fn(r, nv, term, trunc, gamma, terminal=terminal):
                return targets(r, nv, term, trunc, gamma, truncation_is_terminal=terminal)
            lengths[name].append(late_episode_length(train_a2c_on_targets(fn, cash_out_config(seed, total_timesteps))))
    return lengths


def _lengths(fn, inputs):
    """The learner's {"bootstrap": [...], "terminal": [...]} as float64 tensors, one entry per seed."""
    out = inputs(fn)
    if not (isinstance(out, dict) and {"bootstrap", "terminal"} <= out.keys()):
        raise TypeError('time_limit_ablation must return a dict {"bootstrap": [...], "terminal": [...]}')
    return {f"episode length, {k}": torch.as_tensor(out[k], dtype=torch.float64).reshape(-1)
            for k in ("bootstrap", "terminal")}


#: How far a right answer may land from the reference's figures. Measured with the reference over seeds 0–5 at
#: 8,000 steps (the same with 1 and 2 torch threads: the trainer runs on one): late episode length 4.99, 5.00,
#: 5.00, 5.00, 4.96, 5.00 with bootstrapping; 3.09, 3.64, 3.43, 3.84, 3.44, 2.70 with truncation as
#: termination (gap 1.16 to 2.30). A learner's run that drifts from the reference's by rounding behaves like
#: another seed: 0.8 covers every seed's distance from seed 0's figures (3.09, 4.99).
ABLATION_BAND = 0.8

ABLATION_CASES = [
    Case("seed 0, 8,000 steps per run: the late episode length with bootstrapping (≈ 5, the time limit) and with "
         "truncation as termination (≈ 3.1: the agent quits)", ([0], 8000),
         call=Call(_lengths, "compared: the episode lengths per seed, to within ±0.8 (seed-to-seed spread)"),
         rtol=1e-4, atol=ABLATION_BAND,
         hint="run A2C twice per seed, cash_out_config(seed, total_timesteps), with targets from your td_targets: "
              "truncation_is_terminal=False for \"bootstrap\", True for \"terminal\"; measure late_episode_length."),
]

TIME_LIMIT_ABLATION = Item(
    exercise="02", number=5, function="time_limit_ablation", title="ablation: a time limit treated as termination",
    reference=time_limit_ablation, cases=ABLATION_CASES, time_limit=60.0,
    wrong_answers=[
        WrongAnswer("bug planted in both runs", partial(time_limit_ablation, planted=(True, True)),
                    "your \"bootstrap\" run has the bug too: pass truncation_is_terminal=False there, so that the "
                    "time limit bootstraps and the agent keeps working to the end (about 5 steps)."),
        WrongAnswer("runs swapped", partial(time_limit_ablation, planted=(True, False)),
                    "the two runs are swapped: \"bootstrap\" is the correct run (truncation_is_terminal=False), "
                    "\"terminal\" the one with the bug planted (True)."),
    ],
)

ITEMS = [TD_RESIDUALS, GAE, EXPLAINED_VARIANCE, TD_TARGETS, TIME_LIMIT_ABLATION]
