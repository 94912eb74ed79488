"""Exercise 02 — actor-critic and GAE: TD residuals, GAE with episode boundaries, explained variance."""

from __future__ import annotations

import torch

from minigrpo.advantages import gae as package_gae
from minigrpo.control.onpolicy import explained_variance as package_explained_variance
from minigrpo.course.grading.core import Case, Item, WrongAnswer

TITLE = "actor-critic and GAE"

# --------------------------------------------------------------------------- inputs (fresh each call)


def _t(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _b(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bool)


def _random_batch(T: int, N: int | None, seed: int, p_term: float = 0.1, p_trunc: float = 0.05):
    """Random float64 rewards/values and random episode ends (a step is never both)."""
    g = torch.Generator().manual_seed(seed)
    shape = (T,) if N is None else (T, N)
    r = torch.randn(shape, generator=g, dtype=torch.float64)
    v = torch.randn(shape, generator=g, dtype=torch.float64)
    nv = torch.randn(shape, generator=g, dtype=torch.float64)
    u = torch.rand(shape, generator=g)
    term, trunc = u < p_term, (u >= p_term) & (u < p_term + p_trunc)
    return r, v, nv, term, trunc


def _as_float(x) -> torch.Tensor:
    x = torch.as_tensor(x)
    return x if x.is_floating_point() else x.float()


# --------------------------------------------------------------------------- 02.1 td_residuals


def td_residuals(rewards, values, next_values, terminated, gamma):
    """Reference: δ_t = r_t + γ·(1 − terminated_t)·next_values_t − values_t (GAE with λ = 0)."""
    term = torch.as_tensor(terminated, dtype=torch.bool)
    return package_gae(rewards, values, next_values, term, torch.zeros_like(term), gamma, 0.0)


def _td_bootstraps_terminal(rewards, values, next_values, terminated, gamma):
    return _as_float(rewards) + gamma * _as_float(next_values) - _as_float(values)


def _td_shifted_values(rewards, values, next_values, terminated, gamma):
    v, nv = _as_float(values), _as_float(next_values)
    following = torch.cat([v[1:], nv[-1:]])  # values[t + 1] (the next row), next_values only at the end
    keep = (~torch.as_tensor(terminated, dtype=torch.bool)).to(v.dtype)
    return _as_float(rewards) + gamma * keep * following - v


def _td_no_discount(rewards, values, next_values, terminated, gamma):
    keep = (~torch.as_tensor(terminated, dtype=torch.bool)).float()
    return _as_float(rewards) + keep * _as_float(next_values) - _as_float(values)


_TD_SHAPE_HINT = ("check the shapes first: if values, next_values or terminated differ in shape from rewards, "
                  "raise ValueError (otherwise [3] and [3, 1] broadcast silently to [3, 3]).")

TD_CASES = [
    Case("one episode that ends in a terminal state, γ = 0.5",
         "rewards=[1., 1., 1.], values=[2., 1., 0.5], next_values=[1., 0.5, 4.], terminated=[F, F, T], gamma=0.5",
         lambda f: f(_t([1.0, 1.0, 1.0]), _t([2.0, 1.0, 0.5]), _t([1.0, 0.5, 4.0]), _b([False, False, True]), 0.5)),
    Case("an episode cut by a time limit at t = 1: next_values[1] is V(final obs), values[2] is V(reset obs)",
         "rewards=[1., 1., 1.], values=[1., 2., 0.], next_values=[2., 3., 1.], terminated=[F, F, F], gamma=0.5",
         lambda f: f(_t([1.0, 1.0, 1.0]), _t([1.0, 2.0, 0.0]), _t([2.0, 3.0, 1.0]), _b([False, False, False]), 0.5)),
    Case("two envs side by side, shape [T, N] = [2, 2]",
         "rewards=[[1., 0.], [2., 1.]], values=[[1., 1.], [2., 0.]], next_values=[[2., 3.], [5., 1.]], "
         "terminated=[[F, F], [T, F]], gamma=0.9",
         lambda f: f(_t([[1.0, 0.0], [2.0, 1.0]]), _t([[1.0, 1.0], [2.0, 0.0]]), _t([[2.0, 3.0], [5.0, 1.0]]),
                     _b([[False, False], [True, False]]), 0.9)),
    Case("mismatched shapes are refused with a ValueError", "rewards of shape (3,), values of shape (3, 1)",
         lambda f: f(torch.ones(3), torch.ones(3, 1), torch.ones(3), _b([False] * 3), 0.9), hint=_TD_SHAPE_HINT),
    Case("random float64 [64, 4] batch with random terminations, γ = 0.97",
         "random float64 rewards/values/next_values of shape (64, 4), terminations with probability 0.1 (seed 1)",
         lambda f: f(*_random_batch(64, 4, 1)[:4], 0.97), quick=False, rtol=1e-9, atol=1e-9),
]

TD_RESIDUALS = Item(
    exercise="02", number=1, function="td_residuals", title="one-step TD residuals",
    reference=td_residuals, cases=TD_CASES,
    wrong_answers=[
        WrongAnswer("bootstraps at terminal steps", _td_bootstraps_terminal,
                    "a terminated step has no future: its δ is r_t − V(s_t). Multiply the bootstrap term by "
                    "(1 − terminated) (or use torch.where) so next_values is ignored there."),
        WrongAnswer("values[t + 1] instead of next_values", _td_shifted_values,
                    "use next_values[t], not values[t + 1]: after an episode ends, row t + 1 holds the *next* "
                    "episode's first state (a vector env resets in place), so values[t + 1] is the wrong state."),
        WrongAnswer("no discount", _td_no_discount,
                    "the bootstrap is discounted: δ_t = r_t + γ·V(s_{t+1}) − V(s_t)."),
    ],
)

# --------------------------------------------------------------------------- 02.2 gae


def gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Reference: the package's GAE (minigrpo.advantages.gae)."""
    return package_gae(rewards, values, next_values, terminated, truncated, gamma, lam)


def _gae_variant(rewards, values, next_values, terminated, truncated, gamma, lam, *, boot_mask="term",
                 stop_mask="done", factor=None, forward=False, bootstrap_last=True, flags_from_next=False):
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
    k = gamma * lam if factor is None else factor
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


def _gae_trunc_as_term(*a):
    return _gae_variant(*a, boot_mask="done")


def _gae_crosses_truncation(*a):
    return _gae_variant(*a, stop_mask="term")


def _gae_boots_terminal(*a):
    return _gae_variant(*a, boot_mask="none")


def _gae_gamma_only(r, v, nv, te, tr, gamma, lam):
    return _gae_variant(r, v, nv, te, tr, gamma, lam, factor=gamma)


def _gae_lambda_only(r, v, nv, te, tr, gamma, lam):
    return _gae_variant(r, v, nv, te, tr, gamma, lam, factor=lam)


def _gae_forward(*a):
    return _gae_variant(*a, forward=True)


def _gae_no_last_bootstrap(*a):
    return _gae_variant(*a, bootstrap_last=False)


def _gae_flags_off_by_one(*a):
    return _gae_variant(*a, flags_from_next=True)


def _gae_flattened(rewards, values, next_values, terminated, truncated, gamma, lam):
    r = _as_float(rewards)
    flat = [torch.as_tensor(x).reshape(-1) for x in (r, values, next_values, terminated, truncated)]
    return _gae_variant(*flat, gamma, lam).reshape(r.shape)


_GAE_SHAPE_HINT = ("check the shapes first: values, next_values, terminated and truncated must all have the "
                   "shape of rewards; raise ValueError when one differs (broadcasting would hide the bug).")

# Hand-computable inputs (γ = 0.5, λ = 0.8 so that γ, λ and γλ = 0.4 are three different numbers).
GAE_CASES = [
    Case("one episode that ends in a terminal state, γ = 0.5, λ = 0.8",
         "rewards=[1., 1., 1.], values=[2., 1., 0.5], next_values=[1., 0.5, 4.], terminated=[F, F, T], "
         "truncated=[F, F, F], gamma=0.5, lam=0.8",
         lambda f: f(_t([1.0, 1.0, 1.0]), _t([2.0, 1.0, 0.5]), _t([1.0, 0.5, 4.0]), _b([False, False, True]),
                     _b([False, False, False]), 0.5, 0.8)),
    Case("a rollout that stops mid-episode: the last step bootstraps from next_values",
         "rewards=[1., 0., 2.], values=[1., 1., 1.], next_values=[1., 1., 3.], no episode ends, gamma=0.5, lam=0.8",
         lambda f: f(_t([1.0, 0.0, 2.0]), _t([1.0, 1.0, 1.0]), _t([1.0, 1.0, 3.0]), _b([False] * 3), _b([False] * 3),
                     0.5, 0.8)),
    Case("truncation at t = 1: bootstrap from next_values[1], and do not look past the boundary",
         "rewards=[1., 1., 1., 1.], values=[1., 2., 0., 1.], next_values=[2., 4., 1., 2.], terminated=[F, F, F, F], "
         "truncated=[F, T, F, F], gamma=0.5, lam=0.8",
         lambda f: f(_t([1.0, 1.0, 1.0, 1.0]), _t([1.0, 2.0, 0.0, 1.0]), _t([2.0, 4.0, 1.0, 2.0]), _b([False] * 4),
                     _b([False, True, False, False]), 0.5, 0.8)),
    Case("termination at t = 1 (next_values[1] holds a meaningless 10.)",
         "rewards=[1., 1., 1., 1.], values=[1., 2., 0., 1.], next_values=[2., 10., 1., 2.], "
         "terminated=[F, T, F, F], truncated=[F, F, F, F], gamma=0.5, lam=0.8",
         lambda f: f(_t([1.0, 1.0, 1.0, 1.0]), _t([1.0, 2.0, 0.0, 1.0]), _t([2.0, 10.0, 1.0, 2.0]),
                     _b([False, True, False, False]), _b([False] * 4), 0.5, 0.8)),
    Case("two envs, shape [T, N] = [3, 2]: env 0 terminates at t = 0, env 1 is truncated at t = 1",
         "rewards=[[1., 2.], [0., 1.], [1., 1.]], values=[[1., 0.], [2., 1.], [0., 2.]], "
         "next_values=[[5., 1.], [0., 3.], [1., 1.]], terminated=[[T, F], [F, F], [F, F]], "
         "truncated=[[F, F], [F, T], [F, F]], gamma=0.5, lam=0.8",
         lambda f: f(_t([[1.0, 2.0], [0.0, 1.0], [1.0, 1.0]]), _t([[1.0, 0.0], [2.0, 1.0], [0.0, 2.0]]),
                     _t([[5.0, 1.0], [0.0, 3.0], [1.0, 1.0]]), _b([[True, False], [False, False], [False, False]]),
                     _b([[False, False], [False, True], [False, False]]), 0.5, 0.8)),
    Case("λ = 0 gives the TD residuals δ_t",
         "rewards=[1., 2., 3.], values=[1., 1., 1.], next_values=[2., 0., 5.], no episode ends, gamma=0.9, lam=0.0",
         lambda f: f(_t([1.0, 2.0, 3.0]), _t([1.0, 1.0, 1.0]), _t([2.0, 0.0, 5.0]), _b([False] * 3), _b([False] * 3),
                     0.9, 0.0)),
    Case("λ = 1 on an episode that terminates: discounted return minus V",
         "rewards=[1., 2., 3.], values=[4., 3., 2.], next_values=[3., 2., 7.], terminated=[F, F, T], "
         "truncated=[F, F, F], gamma=0.5, lam=1.0",
         lambda f: f(_t([1.0, 2.0, 3.0]), _t([4.0, 3.0, 2.0]), _t([3.0, 2.0, 7.0]), _b([False, False, True]),
                     _b([False] * 3), 0.5, 1.0)),
    Case("mismatched shapes are refused with a ValueError", "rewards of shape (3,), values of shape (3, 1)",
         lambda f: f(torch.ones(3), torch.ones(3, 1), torch.ones(3), _b([False] * 3), _b([False] * 3), 0.9, 0.95),
         hint=_GAE_SHAPE_HINT),
    Case("random float64 [T] rollout, T = 200, γ = 0.99, λ = 0.95",
         "random float64 rewards/values/next_values of shape (200,), random terminations and truncations (seed 2)",
         lambda f: f(*_random_batch(200, None, 2), 0.99, 0.95), quick=False, rtol=1e-9, atol=1e-9),
    Case("random float64 [T, N] rollout, [64, 8], γ = 0.97, λ = 0.9",
         "random float64 tensors of shape (64, 8), random terminations and truncations (seed 3)",
         lambda f: f(*_random_batch(64, 8, 3), 0.97, 0.9), quick=False, rtol=1e-9, atol=1e-9),
    Case("λ = 1, γ = 1 on a long CartPole-like episode (reward 1 per step, terminated at the end)",
         "rewards=ones(300), values=zeros(300), next_values=zeros(300), terminated only at t = 299, gamma=1, lam=1",
         lambda f: f(torch.ones(300, dtype=torch.float64), torch.zeros(300, dtype=torch.float64),
                     torch.zeros(300, dtype=torch.float64), torch.arange(300) == 299,
                     torch.zeros(300, dtype=torch.bool), 1.0, 1.0), quick=False),
]

GAE = Item(
    exercise="02", number=2, function="gae", title="generalized advantage estimation with episode boundaries",
    reference=gae, cases=GAE_CASES,
    wrong_answers=[
        WrongAnswer("truncation treated as termination", _gae_trunc_as_term,
                    "a truncated step was treated like a terminal one: a time limit does not make the future "
                    "worthless, so δ_t must still bootstrap from next_values[t]. Zero the bootstrap only where "
                    "terminated is True (the recursion stops at both kinds of end)."),
        WrongAnswer("recursion crosses a truncation", _gae_crosses_truncation,
                    "your advantages leak across a truncation: the running sum must restart after *any* episode "
                    "end (terminated or truncated), because the next row belongs to a new episode. Multiply "
                    "A_{t+1} by (1 − terminated_t)·(1 − truncated_t)."),
        WrongAnswer("next_values used at terminal steps", _gae_boots_terminal,
                    "at a terminated step nothing follows: δ_t = r_t − V(s_t). next_values[t] there is "
                    "meaningless (a vector env may even put the reset state's value in it); mask it out."),
        WrongAnswer("recursion with γ only", _gae_gamma_only,
                    "the recursion's factor is γ·λ, not γ: A_t = δ_t + γλ·(1 − done_t)·A_{t+1}. "
                    "(δ itself already carries the single γ of the bootstrap.)"),
        WrongAnswer("recursion with λ only", _gae_lambda_only,
                    "the recursion's factor is γ·λ, not λ: A_t = δ_t + γλ·(1 − done_t)·A_{t+1}; δ_{t+k} "
                    "is weighted by (γλ)^k."),
        WrongAnswer("accumulated forwards", _gae_forward,
                    "you accumulated from the past: A_t sums δ of *later* steps, so loop backwards from the "
                    "last step, t = T−1, …, 0."),
        WrongAnswer("last step not bootstrapped", _gae_no_last_bootstrap,
                    "the rollout's last step is not an episode end: when it is neither terminated nor "
                    "truncated, δ_{T−1} = r + γ·next_values[T−1] − V, like any other step."),
        WrongAnswer("episode-end flags off by one", _gae_flags_off_by_one,
                    "off by one: the flags at index t say whether step t ended its episode, so they decide "
                    "whether A_t may look at A_{t+1}. Use terminated[t] / truncated[t], not the flags of t + 1."),
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


@_ev_guarded
def _ev_ratio(v, r):
    return float(1 - v.var() / r.var())


@_ev_guarded
def _ev_mse(v, r):
    return float(1 - ((r - v) ** 2).mean() / r.var())


@_ev_guarded
def _ev_swapped(v, r):
    return float(1 - (r - v).var() / v.var())


@_ev_guarded
def _ev_corr2(v, r):
    v, r = v.reshape(-1), r.reshape(-1)
    vc, rc = v - v.mean(), r - r.mean()
    return float((vc * rc).sum() ** 2 / ((vc**2).sum() * (rc**2).sum()))


_RET = [1.0, 2.0, 3.0, 4.0]

EV_CASES = [
    Case("a hand example", "values=[1.5, 1.5, 3.5, 3.5], returns=[1., 2., 3., 4.]",
         lambda f: f(_t([1.5, 1.5, 3.5, 3.5]), _t(_RET))),
    Case("a perfect critic explains everything", "values=[1., 2., 3., 4.], returns=[1., 2., 3., 4.]",
         lambda f: f(_t(_RET), _t(_RET))),
    Case("a critic off by a constant still explains all the variance",
         "values=[6., 7., 8., 9.] (returns + 5), returns=[1., 2., 3., 4.]",
         lambda f: f(_t([6.0, 7.0, 8.0, 9.0]), _t(_RET))),
    Case("a critic that predicts the mean return explains nothing", "values=[2.5, 2.5, 2.5, 2.5], returns=[1., 2., 3., 4.]",
         lambda f: f(_t([2.5] * 4), _t(_RET))),
    Case("a critic worse than a constant: negative", "values=[4., 3., 2., 1.], returns=[1., 2., 3., 4.]",
         lambda f: f(_t([4.0, 3.0, 2.0, 1.0]), _t(_RET))),
    Case("a [T, N] batch counts all its elements", "values=[[1., 2.], [2., 2.]], returns=[[1., 3.], [2., 4.]]",
         lambda f: f(_t([[1.0, 2.0], [2.0, 2.0]]), _t([[1.0, 3.0], [2.0, 4.0]])),
         hint="compute one number over all the elements (flatten first); a per-env variance gives one value per column."),
    Case("constant returns: undefined, return NaN", "values=[1., 2., 3.], returns=[2., 2., 2.]",
         lambda f: f(_t([1.0, 2.0, 3.0]), _t([2.0, 2.0, 2.0])),
         hint="when Var(returns) is 0 the ratio is undefined: return float('nan') instead of dividing by zero."),
    Case("random float64 critic on 1000 returns", "returns ~ N(0, 1), values = 0.8·returns + noise (seed 4)",
         lambda f: f(*(lambda r, n: (0.8 * r + 0.3 * n, r))(*_random_batch(1000, None, 4)[:2])),
         quick=False, rtol=1e-9, atol=1e-9),
]

EXPLAINED_VARIANCE = Item(
    exercise="02", number=3, function="explained_variance", title="explained variance of a critic",
    reference=explained_variance, cases=EV_CASES,
    wrong_answers=[
        WrongAnswer("ratio of variances", _ev_ratio,
                    "this compares the spread of the predictions with the spread of the returns; explained "
                    "variance measures the *error*: 1 − Var(returns − values) / Var(returns)."),
        WrongAnswer("MSE instead of variance", _ev_mse,
                    "the numerator is the variance of the residual, not its mean square: explained variance "
                    "ignores a constant offset (which an advantage never sees) and only asks how much of the "
                    "returns' variation the critic tracks."),
        WrongAnswer("arguments swapped", _ev_swapped,
                    "divide by the variance of the *returns* (the targets), not of the predictions."),
        WrongAnswer("squared correlation", _ev_corr2,
                    "the squared correlation ignores the scale of the predictions; explained variance is "
                    "1 − Var(returns − values) / Var(returns), which can be negative for a bad critic."),
    ],
)

ITEMS = [TD_RESIDUALS, GAE, EXPLAINED_VARIANCE]
