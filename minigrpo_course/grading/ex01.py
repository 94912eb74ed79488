"""Exercise 01 — REINFORCE: reward-to-go, the surrogate loss, reward-to-go over a batch of episodes."""

from __future__ import annotations

import torch
from torch import tensor

from minigrpo.advantages import batch_reward_to_go, reward_to_go
from minigrpo_course.grading.core import Case, Item, Made, WrongAnswer, checked_by, grads, randn, random_flags
from minigrpo.losses import reinforce_loss

TITLE = "REINFORCE"


def _rtg_float64_loop(rewards, gamma):
    """An independent oracle: the definition Σ_k γ^k r_{t+k}, summed literally in float64."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    return torch.stack([sum(gamma**k * r[t + k] for k in range(len(r) - t)) for t in range(len(r))])


def _rtg_in_dtype_of(rewards, gamma):
    """The backward recursion in an accumulator of the rewards' own dtype (right for float rewards only)."""
    out, running = torch.zeros_like(rewards), torch.zeros((), dtype=rewards.dtype)
    for t in range(len(rewards) - 1, -1, -1):
        running = (rewards[t] + gamma * running).to(rewards.dtype)
        out[t] = running
    return out


def random_logp(*shape: int, seed: int) -> torch.Tensor:
    """Log-probabilities: −|standard normal|, float64."""
    return -randn(*shape, seed=seed).abs()


# --------------------------------------------------------------------------- 01.1 reward_to_go

_SHAPE_HINT = ("check the input first: `if rewards.ndim != 1 or rewards.numel() == 0: raise ValueError(...)` "
               "with a message saying that one episode's rewards of shape [T], T >= 1, are expected.")

REWARD_TO_GO = Item(
    exercise="01", number=1, function="reward_to_go", title="discounted reward-to-go of one episode",
    reference=reward_to_go,
    cases=[
        Case("discounting, γ = 0.5", (tensor([1.0, 1.0, 1.0]), 0.5)),
        Case("γ = 1 gives plain sums of future rewards", (tensor([1.0, 2.0, 3.0]), 1.0)),
        Case("γ = 0 keeps each step's own reward", (tensor([3.0, -1.0, 2.0]), 0.0)),
        Case("a one-step episode", (tensor([5.0]), 0.9)),
        Case("a 2-D input is refused with a ValueError", (torch.ones(2, 3), 0.9), hint=_SHAPE_HINT),
        Case("an empty episode is refused with a ValueError", (torch.zeros(0), 0.9), hint=_SHAPE_HINT),
        Case("random float64 rewards, T = 60, γ = 0.97", (Made(randn, 60, seed=1), 0.97), quick=False,
             rtol=1e-9, atol=1e-9),
        Case("CartPole-like: 200 rewards of 1, γ = 0.99", (Made(torch.ones, 200), 0.99), quick=False),
        Case("integer rewards (int64, as a counter of steps gives them) are accepted", (tensor([1, 1, 1]), 0.5),
             quick=False, hint="work in a floating dtype: an int64 result or accumulator (torch.zeros_like(rewards) "
                               "of int64 rewards) truncates every discounted sum to an integer."),
    ],
    wrong_answers=[
        WrongAnswer("no discount", lambda r, gamma: _rtg_float64_loop(r, 1.0),
                    "this is the undiscounted sum of future rewards: weight the reward k steps ahead by γ**k."),
        WrongAnswer("whole-episode return", lambda r, gamma: torch.full(r.shape, float(_rtg_float64_loop(r, gamma)[0])),
                    "every step got the return of the whole episode; reward-to-go at step t counts only "
                    "rewards from t onward (an action cannot change rewards that came before it)."),
        WrongAnswer("accumulated forwards", lambda r, gamma: _rtg_float64_loop(r.flip(0), gamma).flip(0),
                    "you accumulated from the start of the episode (rewards before t); loop backwards "
                    "from the last step: out[t] = r[t] + γ·out[t+1]."),
        WrongAnswer("excludes r_t", lambda r, gamma: _rtg_float64_loop(r, gamma) - r,
                    "off by one: the reward-to-go at t includes r[t] itself, undiscounted."),
        WrongAnswer("integer accumulator", checked_by(reward_to_go, _rtg_in_dtype_of),
                    "integer rewards gave an integer result: the accumulator took the rewards' dtype "
                    "(torch.zeros_like(rewards) is int64 for int64 rewards). Convert first: "
                    "rewards = torch.as_tensor(rewards, dtype=torch.get_default_dtype()) unless it is already floating.",
                    quick=False),
        WrongAnswer("discounted from the episode start",
                    lambda r, gamma: gamma ** torch.arange(len(r)) * _rtg_float64_loop(r, gamma),
                    "the discount should count steps from t (γ**(t'−t)), not from the start of the episode (γ**t')."),
    ],
)

# --------------------------------------------------------------------------- 01.2 reinforce_loss

_LOGP, _W = tensor([-0.5, -1.0, -2.0]), tensor([1.0, 2.0, -1.0])

REINFORCE_LOSS = Item(
    exercise="01", number=2, function="reinforce_loss", title="the REINFORCE surrogate loss",
    reference=reinforce_loss,
    cases=[
        Case("value on a hand-computable batch", (_LOGP, _W)),
        Case("gradient w.r.t. logp is −weights / N", (_LOGP, _W), call=grads("logp", value=False)),
        Case("no gradient flows into the weights", (_LOGP, _W),
             call=grads("weights", value=False, requires_grad=("logp", "weights"))),
        Case("mismatched shapes are refused with a ValueError", (torch.zeros(3), torch.zeros(3, 1)),
             hint="without a check, [3] * [3, 1] silently broadcasts to [3, 3]: compare the shapes and raise "
                  "ValueError."),
        Case("a [4, 10] float64 batch: value and gradient",
             (Made(random_logp, 4, 10, seed=2), Made(randn, 4, 10, seed=3)), call=grads("logp"), quick=False,
             rtol=1e-9, atol=1e-12),
    ],
    wrong_answers=[
        WrongAnswer("sign", lambda logp, w: (logp * w.detach()).mean(),
                    "sign error: gradient *descent* on the loss must raise log π of actions with positive "
                    "weight, so the loss is the negative of mean(logp · weights)."),
        WrongAnswer("not detached", lambda logp, w: -(logp * w).mean(),
                    "detach the weights (weights.detach()): they score the actions and must not be "
                    "differentiated; otherwise a learned baseline would be trained by the policy loss."),
        WrongAnswer("sum", lambda logp, w: -(logp * w.detach()).sum(),
                    "take the mean over steps, not the sum (a sum makes the step size grow with the batch)."),
        WrongAnswer("probabilities", lambda logp, w: -(logp.exp() * w.detach()).mean(),
                    "use the log-probabilities as given: the estimator is ∇log π · weight, not ∇π · weight."),
    ],
)

# --------------------------------------------------------------------------- 01.3 batch_reward_to_go

BATCH_REWARD_TO_GO = Item(
    exercise="01", number=3, function="batch_reward_to_go", title="reward-to-go over episodes laid end to end",
    reference=batch_reward_to_go,
    cases=[
        Case("two episodes, γ = 0.5", (tensor([1.0] * 5), tensor([False, False, True, False, True]), 0.5)),
        Case("every step ends an episode", (tensor([2.0, -1.0, 3.0]), tensor([True, True, True]), 0.9)),
        Case("the batch's last step ends its episode even without a flag",
             (tensor([1.0, 2.0, 3.0]), tensor([False, False, False]), 1.0)),
        Case("rewards and dones of different lengths are refused with a ValueError",
             (torch.ones(4), tensor([False, False, True]), 0.9),
             hint="compare rewards.shape with dones.shape and raise ValueError when they differ."),
        Case("random float64 batch of 80 steps with random episode ends",
             (Made(randn, 80, seed=4), Made(random_flags, 80, p=0.15, seed=5), 0.95), quick=False,
             rtol=1e-9, atol=1e-9),
        Case("0/1 integer episode ends (int64)", (tensor([1.0, 1.0, 1.0, 1.0, 1.0]), tensor([0, 0, 1, 0, 1]), 0.5),
             quick=False, hint="read the flags as booleans (dones.bool()): `~` on an int64 flag is a bitwise not "
                               "(~0 = −1, ~1 = −2), not 'not done'."),
    ],
    wrong_answers=[
        WrongAnswer("leaks across episodes", lambda r, dones, gamma: _rtg_float64_loop(r, gamma),
                    "rewards leak across episode boundaries: when a step has done=True, the running "
                    "return must restart, since the next episode's rewards do not belong to this one."),
        # resetting after adding r[t] moves every boundary one step back: the flags of t + 1 act at t
        WrongAnswer("resets one step late", lambda r, dones, gamma: batch_reward_to_go(r, dones.roll(-1), gamma),
                    "off by one at the boundary: going backwards, reset the running return *before* "
                    "adding r[t] of a step that ends an episode (its reward-to-go is just r[t])."),
        WrongAnswer("no discount", lambda r, dones, gamma: batch_reward_to_go(r, dones, 1.0),
                    "the future rewards are not discounted: weight the reward k steps ahead by γ**k."),
    ],
)

ITEMS = [REWARD_TO_GO, REINFORCE_LOSS, BATCH_REWARD_TO_GO]
