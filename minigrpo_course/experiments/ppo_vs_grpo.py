"""Lesson 05's long-horizon task, where PPO with a critic beats GRPO: a corridor of ``horizon`` rooms.

Each episode starts in one of ``n_starts`` corridors (the "prompts"). In room ``t`` of corridor ``k`` the agent
sees a feature vector ``obs[k, t]`` and opens one of ``n_actions`` doors; door ``a`` pays 1 with probability
``mu[k, t, a] = σ(1.5·x_{k,t}·w_a + e_k)`` (else 0), and the agent walks on to room ``t + 1`` whichever door it
opened. Which door suits which room is learnable from the features; how generous a corridor is overall
(``e_k``) is hidden, as a prompt's difficulty is in lesson 05's bandit. The return is the sum of the
``horizon`` rewards.

Because the agent's choices do not change which rooms come next, the task isolates **credit assignment**:
GRPO gives every door of an episode the same group-normalised return, so the noise of the other
``horizon − 1`` rewards rides on each decision's signal, while PPO's GAE advantage of room ``t`` mostly looks
at the rewards that follow it closely. Its expected return is exact (a sum over rooms), so the curves carry
no evaluation noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from minigrpo.infra.checks import at_least, check_config_types, in_unit_interval, one_of, positive
from minigrpo.advantages import gae, group_advantages
from minigrpo.losses import clipped_surrogate_loss

METHODS = ("ppo", "grpo")


@dataclass(frozen=True)
class Corridor:
    """The task's tables. ``obs[k, t]``: what the agent sees in room ``t`` of corridor ``k`` (random features,
    then the share of the corridor still ahead, ``(H − t)/H``, which a critic needs); ``mu[k, t, a]``: the
    probability that door ``a`` pays."""

    obs: torch.Tensor   # [K, H, D + 1]
    mu: torch.Tensor    # [K, H, A]

    @property
    def horizon(self) -> int:
        return self.mu.shape[1]

    @property
    def n_actions(self) -> int:
        return self.mu.shape[2]

    def best_reward(self) -> float:
        """Mean reward per room of the best policy (always the likeliest door)."""
        return float(self.mu.max(-1).values.mean())

    @torch.no_grad()
    def expected_reward(self, policy: nn.Module) -> float:
        """Exact expected reward per room of ``policy``, averaged over corridors (= expected return / H)."""
        probs = torch.softmax(policy(self.obs), -1)
        return float((probs * self.mu).sum(-1).mean())

    @torch.no_grad()
    def rollout(self, policy: nn.Module, starts: torch.Tensor, gen: torch.Generator):
        """One episode per entry of ``starts`` (corridor indices ``[n]``), time-major: observations
        ``[H, n, D + 1]``, actions ``[H, n]``, rewards ``[H, n]`` (the rooms do not depend on the actions, so the
        whole episode is sampled in one forward pass)."""
        obs = self.obs[starts].transpose(0, 1)                          # [H, n, D + 1]
        probs = torch.softmax(policy(obs), -1)                           # [H, n, A]
        actions = torch.multinomial(probs.reshape(-1, self.n_actions), 1, generator=gen).reshape(probs.shape[:2])
        mu = self.mu[starts].transpose(0, 1).gather(2, actions[..., None]).squeeze(2)
        return obs, actions, torch.bernoulli(mu, generator=gen)


def make_corridor(horizon: int, n_starts: int = 128, n_actions: int = 4, obs_dim: int = 8,
                  seed: int = 0) -> Corridor:
    """A random corridor task (see the module docstring); the same ``seed`` gives the same task."""
    for name, value, low in (("horizon", horizon, 1), ("n_starts", n_starts, 1), ("n_actions", n_actions, 2),
                             ("obs_dim", obs_dim, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"make_corridor: {name} must be an int >= {low}, got {value!r}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_starts, horizon, obs_dim, generator=g)
    w = torch.randn(obs_dim, n_actions, generator=g) / math.sqrt(obs_dim)
    ease = -1.0 + 2.0 * torch.randn(n_starts, generator=g)                # hidden generosity of a corridor
    mu = torch.sigmoid(1.5 * x @ w + ease[:, None, None])
    ahead = (horizon - torch.arange(horizon, dtype=torch.float32)) / horizon
    obs = torch.cat([x, ahead[None, :, None].expand(n_starts, horizon, 1)], -1)
    return Corridor(obs, mu)


@dataclass
class LongHorizonConfig:
    """One training run on a :class:`Corridor`; PPO and GRPO share every field but their advantage."""

    method: str = "ppo"            #: "ppo" (learned critic + GAE) or "grpo" (group of returns, no critic)
    steps_per_iter: int = 2048     #: environment steps per batch, for both methods (= episodes × horizon)
    iterations: int = 60           #: batches
    group_size: int = 8            #: GRPO: episodes from the same start corridor
    lr: float = 3e-3               #: Adam, policy and critic
    epochs: int = 4                #: passes over each batch
    minibatches: int = 4           #: minibatches per epoch (of single steps)
    clip_eps: float = 0.2          #: PPO / GRPO clip range
    gamma: float = 1.0             #: PPO: discount (1: the return GRPO optimises)
    lam: float = 0.9               #: PPO: GAE λ
    hidden: int = 32               #: width of the policy and critic MLPs

    def __post_init__(self):
        check_config_types(self)
        one_of(self, "method", METHODS)
        at_least(self, 1, "steps_per_iter", "iterations", "epochs", "minibatches", "hidden")
        at_least(self, 2, "group_size")
        positive(self, "lr", "clip_eps")
        in_unit_interval(self, "gamma", "lam")


def mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Module:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, out_dim))


def ppo_advantages(critic: nn.Module, obs: torch.Tensor, rewards: torch.Tensor, gamma: float, lam: float):
    """GAE advantages ``[H, n]`` and value targets (advantages + values) of complete episodes: the last room
    ends the episode (terminated), every other room bootstraps from the critic's value of the next."""
    with torch.no_grad():
        values = critic(obs).squeeze(-1)                                  # [H, n]
    next_values = torch.cat([values[1:], torch.zeros_like(values[:1])])
    terminated = torch.zeros_like(rewards, dtype=torch.bool)
    terminated[-1] = True
    adv = gae(rewards, values, next_values, terminated, torch.zeros_like(terminated), gamma, lam)
    return adv, adv + values


def grpo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """One group-normalised return per episode (episodes of a group contiguous), copied to each room: ``[H, n]``."""
    return group_advantages(rewards.sum(0), group_size).expand_as(rewards)


def train_long_horizon(task: Corridor, cfg: LongHorizonConfig, seed: int) -> np.ndarray:
    """Train from scratch; returns the exact expected reward per room before each batch and at the end
    (``[iterations + 1]``). Both methods sample ``steps_per_iter`` steps per batch and take ``epochs ×
    minibatches`` clipped steps on it; PPO normalises its advantages per minibatch and fits its critic on the
    same minibatches, GRPO draws ``n / group_size`` corridors and runs each ``group_size`` times."""
    H = task.horizon
    n = cfg.steps_per_iter // H
    if cfg.method == "grpo" and (n < cfg.group_size or n % cfg.group_size):
        raise ValueError(f"LongHorizonConfig.steps_per_iter // horizon = {n} episodes must be a positive multiple "
                         f"of group_size = {cfg.group_size}")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    policy = mlp(task.obs.shape[-1], cfg.hidden, task.n_actions)
    critic = mlp(task.obs.shape[-1], cfg.hidden, 1)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.lr)
    K = task.obs.shape[0]
    curve = [task.expected_reward(policy)]
    for _ in range(cfg.iterations):
        if cfg.method == "grpo":
            starts = torch.randint(K, (n // cfg.group_size,), generator=gen).repeat_interleave(cfg.group_size)
        else:
            starts = torch.randint(K, (n,), generator=gen)
        obs, actions, rewards = task.rollout(policy, starts, gen)
        if cfg.method == "grpo":
            adv, returns = grpo_advantages(rewards, cfg.group_size), None
        else:
            adv, returns = ppo_advantages(critic, obs, rewards, cfg.gamma, cfg.lam)
        _update(policy, critic, opt, critic_opt, cfg, obs, actions, adv, returns, gen)
        curve.append(task.expected_reward(policy))
    return np.array(curve)


def _update(policy, critic, opt, critic_opt, cfg, obs, actions, adv, returns, gen) -> None:
    """Epochs of clipped minibatch steps on the flattened batch (and, for PPO, critic MSE steps)."""
    obs, actions, adv = obs.reshape(-1, obs.shape[-1]), actions.reshape(-1), adv.reshape(-1)
    with torch.no_grad():
        old = torch.log_softmax(policy(obs), -1).gather(1, actions[:, None]).squeeze(1)
    for _ in range(cfg.epochs):
        for mb in torch.randperm(len(actions), generator=gen).chunk(cfg.minibatches):
            a = adv[mb]
            if returns is not None:                                       # PPO: normalise per minibatch
                a = (a - a.mean()) / (a.std() + 1e-8)
            logp = torch.log_softmax(policy(obs[mb]), -1).gather(1, actions[mb, None]).squeeze(1)
            loss, _ = clipped_surrogate_loss(logp, old[mb], a, cfg.clip_eps)
            opt.zero_grad(); loss.backward(); opt.step()
            if returns is not None:
                v_loss = (critic(obs[mb]).squeeze(1) - returns.reshape(-1)[mb]).pow(2).mean()
                critic_opt.zero_grad(); v_loss.backward(); critic_opt.step()


def horizon_sweep(horizons, seeds, methods=METHODS, progress: bool = False, task_seed: int = 0,
                  **config) -> dict:
    """``{(method, H, seed): curve}`` on :func:`make_corridor` tasks (one task per horizon, the same for every
    seed and method); ``config`` sets :class:`LongHorizonConfig` fields for every run."""
    from tqdm.auto import tqdm

    runs = [(m, H, s) for H in horizons for m in methods for s in seeds]
    tasks = {H: make_corridor(H, seed=task_seed) for H in horizons}
    return {(m, H, s): train_long_horizon(tasks[H], LongHorizonConfig(method=m, **config), s)
            for m, H, s in tqdm(runs, desc="runs", disable=not progress)}


def plot_horizon_sweep(curves: dict, horizons, seeds, steps_per_iter: int, labels: dict, task_seed: int = 0):
    """One panel per horizon: expected reward per room against environment steps, mean ± s.e. over seeds,
    the best policy's level dotted. ``labels``: ``{method: legend label}``. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(horizons), figsize=(4.6 * len(horizons), 3.6), sharey=True, squeeze=False)
    for ax, H in zip(axes[0], horizons):
        for m, label in labels.items():
            ys = np.stack([curves[m, H, s] for s in seeds])
            x = np.arange(ys.shape[1]) * steps_per_iter
            ax.plot(x, ys.mean(0), label=label)
            if len(seeds) > 1:
                se = ys.std(0, ddof=1) / np.sqrt(len(seeds))
                ax.fill_between(x, ys.mean(0) - se, ys.mean(0) + se, alpha=0.2)
        ax.axhline(make_corridor(H, seed=task_seed).best_reward(), color="gray", ls=":")
        ax.set(title=f"horizon H = {H} ({steps_per_iter // H} episodes per batch)", xlabel="environment steps")
    axes[0, 0].set_ylabel("expected reward per room (exact)")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def credit_share(task: Corridor, method: str, seed: int = 0, steps: int = 8192, group_size: int = 8,
                 lam: float = 0.9) -> float:
    """How much of a step's advantage is about that step's own decision, at the initial policy: the squared
    correlation between the advantage of room t and the reward of room t, over one batch of ``steps`` steps.
    For GRPO it shrinks like ``1/H`` (the room's reward is one of H terms of the return); for GAE it does not
    depend on H (δ_t is the first of about 1/(1 − λ) discounted terms; the critic is untrained here)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    policy, critic = mlp(task.obs.shape[-1], 32, task.n_actions), mlp(task.obs.shape[-1], 32, 1)
    episodes = steps // task.horizon
    starts = torch.randint(task.obs.shape[0], (episodes // group_size,), generator=gen).repeat_interleave(group_size)
    obs, _, rewards = task.rollout(policy, starts, gen)
    if method == "grpo":
        adv = grpo_advantages(rewards, group_size)
    else:
        adv = ppo_advantages(critic, obs, rewards, 1.0, lam)[0]
    return float(torch.corrcoef(torch.stack([adv.reshape(-1), rewards.reshape(-1)]))[0, 1] ** 2)
