"""REINFORCE (vanilla policy gradient), with or without a learned value baseline.

One iteration: run one whole episode in each of the ``num_envs`` sub-envs with the current policy, weight
each step's log π(a_t|s_t) by its reward-to-go (minus V(s_t) with a baseline), and take one gradient step
on ``reinforce_loss``. With a baseline, V is then regressed on the reward-to-go of the same batch.
The agent, the vector env, the loop, evaluation and logging are those of A2C, TRPO and PPO
(``minigrpo.control.onpolicy.train_loop``); only the batch (whole episodes) and the weights differ.
Reference: Williams (1992); the layout follows OpenAI Spinning Up's "simplest policy gradient".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import torch

from minigrpo.infra.checks import at_least, one_of, positive
from minigrpo.advantages import reward_to_go
from minigrpo.control.agents import ActorCritic, MLPPolicy
from minigrpo.control.config import ControlConfig
from minigrpo.control.onpolicy import TrainResult, episode_stats, fit_value, normalize, train_loop
from minigrpo.control.rollouts import Episode, run_episodes
from minigrpo.losses import reinforce_loss
from minigrpo.utils import torch_threads

RETURNS = ("reward_to_go", "episode")
BASELINES = ("none", "value")


@dataclass
class ReinforceConfig(ControlConfig):
    """REINFORCE's knobs (on top of ControlConfig; defaults solve CartPole-v1 on CPU in seconds)."""

    num_envs: int = 16  #: parallel envs; an iteration's batch is one whole episode from each
    hidden_sizes: tuple[int, ...] = (32, 32)  #: hidden widths of the policy and value MLPs
    target_return: float | None = 475.0  #: stop once an evaluation's mean reaches this (None: never)
    num_iterations: int = 150  #: policy updates (each on a fresh batch)
    returns: str = "reward_to_go"  #: "reward_to_go" (from step t on) or "episode" (whole-episode return)
    baseline: str = "value"  #: "value" (the critic's V(s) subtracted) or "none"
    learning_rate: float = 1e-2  #: Adam step size of the policy
    vf_lr: float = 1e-2  #: Adam step size of the value function
    vf_iters: int = 10  #: full-batch regression steps on V per iteration

    def __post_init__(self):
        super().__post_init__()
        one_of(self, "returns", RETURNS)
        one_of(self, "baseline", BASELINES)
        at_least(self, 1, "num_iterations", "vf_iters")
        positive(self, "learning_rate", "vf_lr")


def episode_weights(
    episodes: list[Episode],
    gamma: float,
    returns: str = "reward_to_go",
    returns_fn: Callable = reward_to_go,
) -> torch.Tensor:
    """The per-step weights of a batch, concatenated: reward-to-go, or the episode's return."""
    parts = []
    for ep in episodes:
        if returns == "reward_to_go":
            parts.append(torch.as_tensor(returns_fn(ep.rewards, gamma), dtype=torch.float32))
        else:
            g0 = torch.as_tensor(returns_fn(ep.rewards, gamma), dtype=torch.float32)[0]
            parts.append(g0.expand(len(ep)).clone())
    return torch.cat(parts)


def per_episode_gradients(
    policy: MLPPolicy,
    episodes: list[Episode],
    gamma: float,
    returns: str = "reward_to_go",
    baseline: Callable[[Episode], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One policy-gradient estimate per episode, ``Σ_t ∇log π(a_t|s_t) · w_t``: shape ``[N, n_params]``.

    Their spread measures the variance of the estimator on a fixed policy (lesson 01's experiment).
    ``baseline(episode)`` returns ``[T]`` values subtracted from the weights; it must not depend on
    the actions taken, or the estimator becomes biased.
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    grads = []
    with torch_threads(1):
        for ep in episodes:
            w = episode_weights([ep], gamma, returns)
            if baseline is not None:
                w = w - torch.as_tensor(baseline(ep), dtype=torch.float32)
            logp = policy.log_prob(ep.obs, ep.actions)
            g = torch.autograd.grad((logp * w).sum(), params)
            grads.append(torch.cat([x.reshape(-1) for x in g]))
    return torch.stack(grads)


class ReinforceLearner:
    """One REINFORCE iteration for :func:`~minigrpo.control.onpolicy.train_loop`: a batch of whole episodes,
    their weights, one policy step, then the value regression. ``train_return`` is the batch's mean return;
    the env steps counted are the batch's (not the idle steps of sub-envs whose episode ended early)."""

    def __init__(self, cfg: ReinforceConfig, agent: ActorCritic, envs: gym.vector.VectorEnv,
                 loss_fn: Callable = reinforce_loss, returns_fn: Callable = reward_to_go):
        self.cfg, self.agent, self.envs, self.loss_fn, self.returns_fn = cfg, agent, envs, loss_fn, returns_fn
        envs.reset(seed=cfg.seed)  # sub-env i: seed + i
        envs.action_space.seed(cfg.seed)
        self.opt = torch.optim.Adam(agent.actor.parameters(), lr=cfg.learning_rate)
        self.vopt = torch.optim.Adam(agent.critic.parameters(), lr=cfg.vf_lr) if cfg.baseline == "value" else None

    def weights(self, episodes: list[Episode], obs: torch.Tensor) -> torch.Tensor:
        """w_t: the reward-to-go (or episode return), minus V(s_t) before V sees this batch, normalised."""
        w = episode_weights(episodes, self.cfg.gamma, self.cfg.returns, self.returns_fn)
        if self.vopt is not None:
            with torch.no_grad():
                w = w - self.agent.value(obs)
        return normalize(w) if self.cfg.norm_adv else w

    def __call__(self, iteration: int) -> tuple[int, dict[str, float]]:
        episodes, returns = run_episodes(self.envs, self.agent)
        obs, actions = torch.cat([e.obs for e in episodes]), torch.cat([e.actions for e in episodes])
        w = self.weights(episodes, obs)
        dist = self.agent.dist(obs)
        loss = self.loss_fn(dist.log_prob(actions), w)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        v_loss = float("nan")
        if self.vopt is not None:
            targets = episode_weights(episodes, self.cfg.gamma, "reward_to_go")  # the package's reward-to-go
            v_loss = fit_value(self.agent.critic, self.vopt, obs, targets, self.cfg.vf_iters)
        lengths = [len(e) for e in episodes]
        return sum(lengths), {**episode_stats(returns, lengths), "policy_loss": loss.item(), "value_loss": v_loss,
                              "entropy": dist.entropy().mean().item()}


def train_reinforce(
    config: ReinforceConfig | None = None,
    progress: bool = True,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = reinforce_loss,
    returns_fn: Callable = reward_to_go,
) -> TrainResult:
    """Train an ActorCritic with REINFORCE (its critic only as the baseline). ``loss_fn``/``returns_fn`` can
    be swapped for a learner's own implementations (the exercise does this).

    History keys: the shared ones of ``train_loop`` (``iteration, env_steps, seconds, sps, train_return,
    episode_length``, and ``eval_step, eval_return`` per evaluation) plus ``policy_loss, value_loss, entropy``.
    """
    cfg = config or ReinforceConfig()
    return train_loop(cfg, "REINFORCE", lambda agent, envs: ReinforceLearner(cfg, agent, envs, loss_fn, returns_fn),
                      progress)
