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
import pickle
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

from minigrpo._checks import at_least, check_config_types, in_unit_interval, positive
from minigrpo.advantages import gae
from minigrpo.control.agents import ActorCritic
from minigrpo.control.rollouts import evaluate
from minigrpo.tracking import (Tracker, check_report_to, checkpoint_folder, load_state, resolve_checkpoint, rng_state,
                               save_state, set_rng_state, should_log, should_save)
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
    #: trackers to log to: "none", "tensorboard", "trackio", "wandb", or a list of them (see minigrpo.tracking);
    #: the step axis is env_steps, as in CleanRL
    report_to: str | list[str] = "none"
    logging_dir: str | Path | None = None  #: where the trackers write (None: runs/<trainer>-<env_id>-<timestamp>)
    logging_steps: int = 1  #: send the metrics to the trackers every this many iterations (and at the last)

    def __post_init__(self):
        # Subclasses call this first (super().__post_init__()), then check their own fields.
        check_config_types(self)
        at_least(self, 0, "seed", "eval_every_steps")  # gymnasium refuses negative seeds
        at_least(self, 1, "total_timesteps", "num_envs", "num_steps", "eval_episodes", "hidden_sizes", "logging_steps")
        in_unit_interval(self, "gamma", "gae_lambda")
        positive(self, "reward_scale")
        check_report_to(self)

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

    def state_dict(self) -> dict:
        """The current observations, the running episode statistics and the vector env itself (pickled: its
        sub-envs' physics, step counters and random generators), for an exact resume.

        Envs that pickle by their constructor arguments (gymnasium's ``EzPickle``: Box2D, MuJoCo) cannot be
        restored mid-episode: their state is left out (None) and a resume starts fresh episodes there."""
        vec = self.envs.unwrapped
        exact = not any(isinstance(e.unwrapped, gym.utils.EzPickle) for e in getattr(vec, "envs", [None]))
        envs = None
        if exact:
            fns, vec.env_fns = vec.env_fns, None  # the env factories are local functions: not picklable
            try:
                envs = pickle.dumps(self.envs)
            finally:
                vec.env_fns = fns
        return {"obs": self.obs.copy(), "ep_return": self.ep_return.copy(), "ep_length": self.ep_length.copy(),
                "envs": envs}

    def load_state_dict(self, state: dict, seed: int) -> None:
        """Continue where :meth:`state_dict` was taken; without a saved env state, reset every env with
        ``seed`` (new episodes, so not what an uninterrupted run would have seen)."""
        if state["envs"] is None:
            warnings.warn("these environments cannot be restored mid-episode (EzPickle): the resumed run "
                          "starts new episodes, so it differs from an uninterrupted run", stacklevel=2)
            self.obs, _ = self.envs.reset(seed=seed)
            self.ep_return[:], self.ep_length[:] = 0.0, 0
            return
        fns = self.envs.unwrapped.env_fns
        self.envs.close()
        self.envs = pickle.loads(state["envs"])
        self.envs.unwrapped.env_fns = fns
        self.obs, self.ep_return = state["obs"].copy(), state["ep_return"].copy()
        self.ep_length = state["ep_length"].copy()

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
HISTORY_KEYS = ("iteration", "env_steps", "seconds", "sps", "train_return", "episode_length", "eval_step",
                "eval_return")


@dataclass
class LoopState:
    """What the training loop carries from one iteration to the next (saved in checkpoints)."""

    iteration: int = 0
    env_steps: int = 0
    next_eval: int = 0
    recent: list[float] = field(default_factory=list)  #: returns of the last 20 finished episodes
    seconds: float = 0.0  #: wall-clock seconds spent before this run (a resumed run continues the clock)


def save_on_policy_checkpoint(folder: Path, cfg: OnPolicyConfig, agent: ActorCritic, update: UpdateFn,
                              collector: RolloutCollector, loop: LoopState, result: TrainResult) -> None:
    """Agent, optimizer (``update.state_dict()``), envs and episode statistics, random states, loop, history."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    torch.save(agent.state_dict(), Path(folder, "agent.pt"))
    save_state(folder, {"step": loop.iteration, "loop": asdict(loop), "history": result.history,
                        "solved": (result.solved_at_step, result.solved_at_seconds), "update": update.state_dict(),
                        "collector": collector.state_dict(), "rng": rng_state()}, asdict(cfg))


def load_on_policy_checkpoint(folder: Path, cfg: OnPolicyConfig, agent: ActorCritic, update: UpdateFn,
                              collector: RolloutCollector, result: TrainResult) -> LoopState:
    state = load_state(folder)
    agent.load_state_dict(torch.load(Path(folder, "agent.pt"), weights_only=True))
    update.load_state_dict(state["update"])
    collector.load_state_dict(state["collector"], seed=cfg.seed + state["step"])
    set_rng_state(state["rng"])
    result.history.update(state["history"])
    result.solved_at_step, result.solved_at_seconds = state["solved"]
    return LoopState(**state["loop"])


def run_on_policy(cfg: OnPolicyConfig, name: str, make_update: Callable[[ActorCritic], UpdateFn],
                  progress: bool = True) -> TrainResult:
    """The loop shared by every on-policy trainer: rollout → GAE → ``update`` → log → evaluate (→ save).

    ``make_update(agent)`` returns ``update(agent, rollout, advantages, returns, iteration)``, which
    changes the agent and returns the metrics to log for that iteration. Checkpoints (configs with
    ``output_dir`` / ``resume_from_checkpoint``, such as PPOConfig) need the update to carry
    ``update.state_dict()`` / ``update.load_state_dict()`` for its optimizer.
    """
    with torch_threads(1):  # tiny networks: one thread is fastest
        seed_everything(cfg.seed)
        envs = make_vec_env(cfg.env_id, cfg.num_envs)
        agent = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden_sizes)
        update = make_update(agent)
        collector = RolloutCollector(envs, cfg.seed)
        result = TrainResult(agent, {k: [] for k in HISTORY_KEYS}, asdict(cfg))
        loop = LoopState(next_eval=cfg.eval_every_steps)
        folder = resolve_checkpoint(cfg, getattr(cfg, "resume_from_checkpoint", None))
        if folder is not None:
            loop = load_on_policy_checkpoint(folder, cfg, agent, update, collector, result)
        bar = tqdm(range(loop.iteration + 1, cfg.num_iterations + 1), desc=f"{name} {cfg.env_id}",
                   disable=not progress, initial=loop.iteration, total=cfg.num_iterations)
        with Tracker(cfg.report_to, cfg.logging_dir, f"{name.lower()}-{cfg.env_id}", asdict(cfg)) as tracker:
            start = time.perf_counter() - loop.seconds
            for it in bar:
                done = _iteration(cfg, it, agent, update, collector, loop, result, start, tracker)
                output_dir = getattr(cfg, "output_dir", None)
                if output_dir is not None and (done or should_save(it, cfg.save_steps, cfg.num_iterations)):
                    save_on_policy_checkpoint(checkpoint_folder(output_dir, it), cfg, agent, update, collector, loop,
                                              result)
                bar.set_postfix({"ret": f"{result.history['train_return'][-1]:.0f}",
                                 **({"eval": f"{result.history['eval_return'][-1]:.0f}"}
                                    if result.history["eval_return"] else {})})
                if done:
                    break
        collector.envs.close()
    return result


def _iteration(cfg: OnPolicyConfig, it: int, agent: ActorCritic, update: UpdateFn, collector: RolloutCollector,
               loop: LoopState, result: TrainResult, start: float, tracker: Tracker) -> bool:
    """One iteration: rollout, GAE, update, history, trackers, evaluation. True once target_return is reached."""
    hist, t0 = result.history, time.perf_counter()
    ro = collector.collect(agent, cfg.num_steps)
    loop.iteration, loop.env_steps = it, loop.env_steps + cfg.batch_size
    adv = gae(ro.rewards * cfg.reward_scale, ro.values, ro.next_values, ro.terminated, ro.truncated,
              cfg.gamma, cfg.gae_lambda)
    returns = adv + ro.values
    metrics = update(agent, ro, adv, returns, it)
    metrics["explained_variance"] = explained_variance(ro.values.reshape(-1), returns.reshape(-1))
    loop.recent = (loop.recent + ro.episode_returns)[-20:]
    loop.seconds = time.perf_counter() - start
    row = {"iteration": it, "env_steps": loop.env_steps, "seconds": loop.seconds,
           "sps": cfg.batch_size / (time.perf_counter() - t0),
           "train_return": float(np.mean(loop.recent)) if loop.recent else math.nan,
           "episode_length": float(np.mean(ro.episode_lengths)) if ro.episode_lengths else math.nan, **metrics}
    for k, v in row.items():
        hist.setdefault(k, []).append(v)
    if should_log(it, cfg.logging_steps, cfg.num_iterations):
        tracker.log({k: v for k, v in row.items() if k not in ("iteration", "env_steps")}, loop.env_steps, "train/")
    if not (cfg.eval_every_steps and (loop.env_steps >= loop.next_eval or it == cfg.num_iterations)):
        return False
    loop.next_eval += cfg.eval_every_steps
    ev = float(evaluate(agent, cfg.env_id, cfg.eval_episodes, seed=10_000 + cfg.seed).mean())
    hist["eval_step"].append(loop.env_steps)
    hist["eval_return"].append(ev)
    tracker.log({"return": ev}, loop.env_steps, "eval/")
    if cfg.target_return is not None and ev >= cfg.target_return and result.solved_at_step is None:
        result.solved_at_step = loop.env_steps
        result.solved_at_seconds = time.perf_counter() - start
        return True
    return False
