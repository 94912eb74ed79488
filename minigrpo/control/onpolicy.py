"""What actor-critic, TRPO and PPO share: vector-env rollouts, GAE, evaluation and the training loop.

A rollout is ``num_steps`` steps of ``num_envs`` environments, stored time-major (``[T, N]``).
The vector env resets a finished sub-env in the same step (gymnasium's SAME_STEP autoreset), so
the observation it returns is already the next episode's; the real last observation comes in
``info["final_obs"]``. We keep both apart: ``next_obs[t]`` is what followed step t (the final
observation when the episode ended there), and ``terminated``/``truncated`` say how it ended —
GAE bootstraps from V(next_obs) after a truncation but not after a termination.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

from minigrpo._checks import at_least, check_config_types, in_unit_interval, positive
from minigrpo.advantages import gae
from minigrpo.control.agents import ActorCritic
from minigrpo.control.rollouts import evaluate
from minigrpo.utils import seed_everything, torch_threads


@dataclass
class OnPolicyConfig:
    """Settings every on-policy trainer shares (PPOConfig and TRPOConfig add their own)."""

    env_id: str = "CartPole-v1"  #: gymnasium id; flat Box observations, Discrete or Box actions
    seed: int = 0  #: seeds python, numpy, torch and the envs
    total_timesteps: int = 100_000  #: environment steps to train for (all envs together)
    num_envs: int = 8  #: parallel environments in the vector env
    num_steps: int = 128  #: steps per env per rollout (a rollout has num_envs * num_steps samples)
    gamma: float = 0.99  #: discount
    gae_lambda: float = 0.95  #: GAE λ: 0 = TD residual (low variance), 1 = Monte Carlo (no bias)
    hidden_sizes: tuple[int, ...] = (64, 64)  #: hidden widths of the policy and value MLPs
    eval_every_steps: int = 5_000  #: evaluate the deterministic policy this often (0: never)
    eval_episodes: int = 10  #: episodes per evaluation
    target_return: float | None = None  #: stop once an evaluation's mean reaches this (None: never)
    reward_scale: float = 1.0  #: rewards are multiplied by this for learning only (logged returns stay raw)

    def __post_init__(self):
        # Subclasses call this first (super().__post_init__()), then check their own fields.
        check_config_types(self)
        at_least(self, 0, "seed", "eval_every_steps")  # gymnasium refuses negative seeds
        at_least(self, 1, "total_timesteps", "num_envs", "num_steps", "eval_episodes", "hidden_sizes")
        in_unit_interval(self, "gamma", "gae_lambda")
        positive(self, "reward_scale")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        return max(1, self.total_timesteps // self.batch_size)


@dataclass
class Rollout:
    """One batch of experience, time-major: every tensor is ``[T, N, ...]``."""

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor  #: log π_old(a|s) at sampling time
    values: torch.Tensor  #: V(s_t) at sampling time
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    next_values: torch.Tensor  #: V of the observation after step t (the final one if the episode ended)
    episode_returns: list[float] = field(default_factory=list)  #: returns of episodes that ended in it
    episode_lengths: list[int] = field(default_factory=list)


def make_vec_env(env_id: str, num_envs: int, **kwargs) -> gym.vector.VectorEnv:
    """A synchronous vector env that resets finished sub-envs in the same step."""
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **kwargs)


class RolloutCollector:
    """Steps a vector env with an agent, keeping observations and episode statistics between calls."""

    def __init__(self, envs: gym.vector.VectorEnv, seed: int):
        self.envs = envs
        self.obs, _ = envs.reset(seed=seed)
        envs.action_space.seed(seed)
        self.ep_return = np.zeros(envs.num_envs)
        self.ep_length = np.zeros(envs.num_envs, dtype=np.int64)
        space = envs.single_action_space
        self._discrete = isinstance(space, gym.spaces.Discrete)
        self._low, self._high = (None, None) if self._discrete else (space.low, space.high)

    @torch.no_grad()
    def collect(self, agent: ActorCritic, num_steps: int) -> Rollout:
        obs_buf, act_buf, logp_buf, val_buf, rew_buf, term_buf, trunc_buf, next_obs_buf = ([] for _ in range(8))
        returns, lengths = [], []
        for _ in range(num_steps):
            obs = torch.as_tensor(self.obs, dtype=torch.float32)
            dist = agent.dist(obs)
            action = dist.sample()
            env_action = action.numpy() if self._discrete else np.clip(action.numpy(), self._low, self._high)
            next_obs, reward, term, trunc, info = self.envs.step(env_action)
            real_next = next_obs.copy()
            done = term | trunc
            if done.any():
                for i in np.flatnonzero(done):
                    real_next[i] = info["final_obs"][i]
            self.ep_return += reward
            self.ep_length += 1
            for i in np.flatnonzero(done):
                returns.append(float(self.ep_return[i]))
                lengths.append(int(self.ep_length[i]))
                self.ep_return[i], self.ep_length[i] = 0.0, 0
            obs_buf.append(obs)
            act_buf.append(action)
            logp_buf.append(dist.log_prob(action))
            val_buf.append(agent.value(obs))
            rew_buf.append(torch.as_tensor(reward, dtype=torch.float32))
            term_buf.append(torch.as_tensor(term))
            trunc_buf.append(torch.as_tensor(trunc))
            next_obs_buf.append(torch.as_tensor(real_next, dtype=torch.float32))
            self.obs = next_obs
        next_obs_all = torch.stack(next_obs_buf)
        return Rollout(
            obs=torch.stack(obs_buf), actions=torch.stack(act_buf), logp=torch.stack(logp_buf),
            values=torch.stack(val_buf), rewards=torch.stack(rew_buf), terminated=torch.stack(term_buf),
            truncated=torch.stack(trunc_buf), next_values=agent.value(next_obs_all),
            episode_returns=returns, episode_lengths=lengths,
        )


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """1 − Var(target − pred) / Var(target): 1 is a perfect value function, ≤ 0 is no better than a constant."""
    var = target.var()
    return float("nan") if var == 0 else float(1 - (target - pred).var() / var)


@dataclass
class TrainResult:
    agent: ActorCritic
    history: dict[str, list] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    solved_at_step: int | None = None  #: env steps when an evaluation first reached target_return
    solved_at_seconds: float | None = None  #: wall-clock seconds (training + evaluation) at that moment


UpdateFn = Callable[[ActorCritic, Rollout, torch.Tensor, torch.Tensor, int], dict[str, float]]


def run_on_policy(cfg: OnPolicyConfig, name: str, make_update: Callable[[ActorCritic], UpdateFn],
                  progress: bool = True) -> TrainResult:
    """The loop shared by every on-policy trainer: rollout → GAE → ``update`` → log → evaluate.

    ``make_update(agent)`` returns ``update(agent, rollout, advantages, returns, iteration)``, which
    changes the agent and returns the metrics to log for that iteration.
    """
    with torch_threads(1):  # tiny networks: one thread is fastest
        seed_everything(cfg.seed)
        envs = make_vec_env(cfg.env_id, cfg.num_envs)
        agent = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden_sizes)
        update = make_update(agent)
        collector = RolloutCollector(envs, cfg.seed)
        result = TrainResult(agent, {k: [] for k in ("iteration", "env_steps", "seconds", "sps", "train_return",
                                                     "episode_length", "eval_step", "eval_return")}, asdict(cfg))
        hist = result.history
        start, env_steps, next_eval = time.perf_counter(), 0, cfg.eval_every_steps
        recent: list[float] = []
        bar = tqdm(range(1, cfg.num_iterations + 1), desc=f"{name} {cfg.env_id}", disable=not progress)
        for it in bar:
            t0 = time.perf_counter()
            ro = collector.collect(agent, cfg.num_steps)
            env_steps += cfg.batch_size
            adv = gae(ro.rewards * cfg.reward_scale, ro.values, ro.next_values, ro.terminated, ro.truncated,
                      cfg.gamma, cfg.gae_lambda)
            returns = adv + ro.values
            metrics = update(agent, ro, adv, returns, it)
            metrics["explained_variance"] = explained_variance(ro.values.reshape(-1), returns.reshape(-1))
            recent = (recent + ro.episode_returns)[-20:]
            hist["iteration"].append(it)
            hist["env_steps"].append(env_steps)
            hist["seconds"].append(time.perf_counter() - start)
            hist["sps"].append(cfg.batch_size / (time.perf_counter() - t0))
            hist["train_return"].append(float(np.mean(recent)) if recent else math.nan)
            hist["episode_length"].append(float(np.mean(ro.episode_lengths)) if ro.episode_lengths else math.nan)
            for k, v in metrics.items():
                hist.setdefault(k, []).append(v)
            post = {"ret": f"{hist['train_return'][-1]:.0f}"}
            if cfg.eval_every_steps and (env_steps >= next_eval or it == cfg.num_iterations):
                next_eval += cfg.eval_every_steps
                ev = float(evaluate(agent, cfg.env_id, cfg.eval_episodes, seed=10_000 + cfg.seed).mean())
                hist["eval_step"].append(env_steps)
                hist["eval_return"].append(ev)
                post["eval"] = f"{ev:.0f}"
                if cfg.target_return is not None and ev >= cfg.target_return and result.solved_at_step is None:
                    result.solved_at_step = env_steps
                    result.solved_at_seconds = time.perf_counter() - start
                    bar.set_postfix(post)
                    break
            bar.set_postfix(post)
        envs.close()
    return result
