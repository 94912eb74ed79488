"""Exercise 01 — REINFORCE: reward-to-go, the surrogate loss, reward-to-go over a batch of episodes."""

from __future__ import annotations

import torch

from minigrpo.advantages import batch_reward_to_go, reward_to_go
from minigrpo.course.grading.core import Case, Item, WrongAnswer
from minigrpo.losses import reinforce_loss

TITLE = "REINFORCE"

# --------------------------------------------------------------------------- inputs (fresh each call)


def _t(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _random(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64)


def _random_dones(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=g) < 0.15


def _rtg_float64_loop(rewards, gamma):
    """An independent oracle: the definition Σ_k γ^k r_{t+k}, summed literally in float64."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    return torch.stack([sum(gamma**k * r[t + k] for k in range(len(r) - t)) for t in range(len(r))])


# --------------------------------------------------------------------------- 01.1 reward_to_go


def _rtg_no_discount(rewards, gamma):
    return torch.flip(torch.cumsum(torch.flip(torch.as_tensor(rewards, dtype=torch.float32), [0]), 0), [0])


def _rtg_whole_episode(rewards, gamma):
    r = torch.as_tensor(rewards, dtype=torch.float32)
    g0 = sum(gamma**k * r[k] for k in range(len(r)))
    return torch.full_like(r, float(g0))


def _rtg_forward(rewards, gamma):
    r = torch.as_tensor(rewards, dtype=torch.float32)
    out, running = torch.empty_like(r), 0.0
    for t in range(len(r)):
        running = r[t] + gamma * running
        out[t] = running
    return out


def _rtg_excludes_current(rewards, gamma):
    r = torch.as_tensor(rewards, dtype=torch.float32)
    out, running = torch.empty_like(r), 0.0
    for t in reversed(range(len(r))):
        out[t] = gamma * running
        running = r[t] + gamma * running
    return out


def _rtg_discount_from_start(rewards, gamma):
    r = torch.as_tensor(rewards, dtype=torch.float32)
    return torch.stack([sum(gamma**k * r[k] for k in range(t, len(r))) for t in range(len(r))])


_SHAPE_HINT = ("check the input first: `if rewards.ndim != 1 or rewards.numel() == 0: raise ValueError(...)` "
               "with a message saying that one episode's rewards of shape [T], T >= 1, are expected.")

RTG_CASES = [
    Case("discounting, γ = 0.5", "rewards=[1., 1., 1.], gamma=0.5", lambda f: f(_t([1.0, 1.0, 1.0]), 0.5)),
    Case("γ = 1 gives plain sums of future rewards", "rewards=[1., 2., 3.], gamma=1.0",
         lambda f: f(_t([1.0, 2.0, 3.0]), 1.0)),
    Case("γ = 0 keeps each step's own reward", "rewards=[3., -1., 2.], gamma=0.0",
         lambda f: f(_t([3.0, -1.0, 2.0]), 0.0)),
    Case("a one-step episode", "rewards=[5.], gamma=0.9", lambda f: f(_t([5.0]), 0.9)),
    Case("a 2-D input is refused with a ValueError", "rewards of shape (2, 3), gamma=0.9",
         lambda f: f(torch.ones(2, 3), 0.9), hint=_SHAPE_HINT),
    Case("an empty episode is refused with a ValueError", "rewards=[] (shape (0,)), gamma=0.9",
         lambda f: f(torch.zeros(0), 0.9), hint=_SHAPE_HINT),
    Case("random float64 rewards, T = 60, γ = 0.97", "60 random float64 rewards (seed 1), gamma=0.97",
         lambda f: f(_random(60, 1), 0.97), quick=False, rtol=1e-9, atol=1e-9),
    Case("CartPole-like: 200 rewards of 1, γ = 0.99", "rewards=ones(200), gamma=0.99",
         lambda f: f(torch.ones(200), 0.99), quick=False),
]

REWARD_TO_GO = Item(
    exercise="01", number=1, function="reward_to_go", title="discounted reward-to-go of one episode",
    reference=reward_to_go, cases=RTG_CASES,
    wrong_answers=[
        WrongAnswer("no discount", _rtg_no_discount,
                    "this is the undiscounted sum of future rewards: weight the reward k steps ahead by γ**k."),
        WrongAnswer("whole-episode return", _rtg_whole_episode,
                    "every step got the return of the whole episode; reward-to-go at step t counts only "
                    "rewards from t onward (an action cannot change rewards that came before it)."),
        WrongAnswer("accumulated forwards", _rtg_forward,
                    "you accumulated from the start of the episode (rewards before t); loop backwards "
                    "from the last step: out[t] = r[t] + γ·out[t+1]."),
        WrongAnswer("excludes r_t", _rtg_excludes_current,
                    "off by one: the reward-to-go at t includes r[t] itself, undiscounted."),
        WrongAnswer("discounted from the episode start", _rtg_discount_from_start,
                    "the discount should count steps from t (γ**(t'−t)), not from the start of the episode (γ**t')."),
    ],
)

# --------------------------------------------------------------------------- 01.2 reinforce_loss


def _loss_sign(logp, w):
    return (logp * w.detach()).mean()


def _loss_no_detach(logp, w):
    return -(logp * w).mean()


def _loss_sum(logp, w):
    return -(logp * w.detach()).sum()


def _loss_probs(logp, w):
    return -(logp.exp() * w.detach()).mean()


_LOGP = [-0.5, -1.0, -2.0]
_W = [1.0, 2.0, -1.0]


def _value(f):
    return f(_t(_LOGP), _t(_W))


def _grad_logp(f):
    logp = _t(_LOGP).requires_grad_()
    f(logp, _t(_W)).backward()
    return logp.grad


def _grad_weights(f):
    """The gradient that reaches the weights (None, i.e. zeros, when they are detached)."""
    logp, w = _t(_LOGP).requires_grad_(), _t(_W).requires_grad_()
    f(logp, w).backward()
    return torch.zeros(3) if w.grad is None else w.grad


def _random_batch(f):
    logp = (-_random(40, 2).abs()).reshape(4, 10).requires_grad_()
    w = _random(40, 3).reshape(4, 10)
    loss = f(logp, w)
    loss.backward()
    return {"loss": loss.detach(), "d loss / d logp": logp.grad}


LOSS_CASES = [
    Case("value on a hand-computable batch", "logp=[-0.5, -1.0, -2.0], weights=[1., 2., -1.]", _value),
    Case("gradient w.r.t. logp is −weights / N", "logp=[-0.5, -1.0, -2.0] (requires_grad), weights=[1., 2., -1.]",
         _grad_logp),
    Case("no gradient flows into the weights", "logp and weights both with requires_grad=True", _grad_weights),
    Case("mismatched shapes are refused with a ValueError", "logp of shape (3,), weights of shape (3, 1)",
         lambda f: f(torch.zeros(3), torch.zeros(3, 1)),
         hint="without a check, [3] * [3, 1] silently broadcasts to [3, 3]: compare the shapes and raise ValueError."),
    Case("a [4, 10] float64 batch: value and gradient", "random logp <= 0 and weights, shape (4, 10), float64",
         _random_batch, quick=False, rtol=1e-9, atol=1e-12),
]

REINFORCE_LOSS = Item(
    exercise="01", number=2, function="reinforce_loss", title="the REINFORCE surrogate loss",
    reference=reinforce_loss, cases=LOSS_CASES,
    wrong_answers=[
        WrongAnswer("sign", _loss_sign,
                    "sign error: gradient *descent* on the loss must raise log π of actions with positive "
                    "weight, so the loss is the negative of mean(logp · weights)."),
        WrongAnswer("not detached", _loss_no_detach,
                    "detach the weights (weights.detach()): they score the actions and must not be "
                    "differentiated; otherwise a learned baseline would be trained by the policy loss."),
        WrongAnswer("sum", _loss_sum,
                    "take the mean over steps, not the sum (a sum makes the step size grow with the batch)."),
        WrongAnswer("probabilities", _loss_probs,
                    "use the log-probabilities as given: the estimator is ∇log π · weight, not ∇π · weight."),
    ],
)

# --------------------------------------------------------------------------- 01.3 batch_reward_to_go


def _batch_ignores_dones(rewards, dones, gamma):
    return _rtg_float64_loop(rewards, gamma).to(torch.as_tensor(rewards).dtype)


def _batch_reset_late(rewards, dones, gamma):
    r = torch.as_tensor(rewards, dtype=torch.float64)
    out, running = torch.empty_like(r), 0.0
    for t in reversed(range(len(r))):
        running = r[t] + gamma * running
        out[t] = running
        if bool(dones[t]):
            running = 0.0
    return out.to(torch.as_tensor(rewards).dtype)


def _batch_no_discount(rewards, dones, gamma):
    return batch_reward_to_go(rewards, dones, 1.0)


BATCH_CASES = [
    Case("two episodes, γ = 0.5", "rewards=[1., 1., 1., 1., 1.], dones=[F, F, T, F, T], gamma=0.5",
         lambda f: f(_t([1.0] * 5), torch.tensor([False, False, True, False, True]), 0.5)),
    Case("every step ends an episode", "rewards=[2., -1., 3.], dones=[T, T, T], gamma=0.9",
         lambda f: f(_t([2.0, -1.0, 3.0]), torch.tensor([True, True, True]), 0.9)),
    Case("the batch's last step ends its episode even without a flag",
         "rewards=[1., 2., 3.], dones=[F, F, F], gamma=1.0",
         lambda f: f(_t([1.0, 2.0, 3.0]), torch.tensor([False, False, False]), 1.0)),
    Case("rewards and dones of different lengths are refused with a ValueError",
         "rewards of shape (4,), dones of shape (3,)",
         lambda f: f(torch.ones(4), torch.tensor([False, False, True]), 0.9),
         hint="compare rewards.shape with dones.shape and raise ValueError when they differ."),
    Case("random float64 batch of 80 steps with random episode ends",
         "80 random float64 rewards (seed 4), dones with probability 0.15 (seed 5), gamma=0.95",
         lambda f: f(_random(80, 4), _random_dones(80, 5), 0.95), quick=False, rtol=1e-9, atol=1e-9),
]

BATCH_REWARD_TO_GO = Item(
    exercise="01", number=3, function="batch_reward_to_go", title="reward-to-go over episodes laid end to end",
    reference=batch_reward_to_go, cases=BATCH_CASES,
    wrong_answers=[
        WrongAnswer("leaks across episodes", _batch_ignores_dones,
                    "rewards leak across episode boundaries: when a step has done=True, the running "
                    "return must restart, since the next episode's rewards do not belong to this one."),
        WrongAnswer("resets one step late", _batch_reset_late,
                    "off by one at the boundary: going backwards, reset the running return *before* "
                    "adding r[t] of a step that ends an episode (its reward-to-go is just r[t])."),
        WrongAnswer("no discount", _batch_no_discount,
                    "the future rewards are not discounted: weight the reward k steps ahead by γ**k."),
    ],
)

ITEMS = [REWARD_TO_GO, REINFORCE_LOSS, BATCH_REWARD_TO_GO]
