"""The training loop of every control trainer, and what A2C, TRPO and PPO share on top of it.

One iteration = a *learner* call: collect a batch with the current policy, compute the advantages, update
the agent; it returns the env steps it used and its metrics. The loop around it (:func:`train_loop`) is the
same for REINFORCE (whole episodes, reward-to-go) and for the actor-critic methods (``num_steps`` per env,
GAE: :class:`GAELearner`): seeding, the agent, history, trackers, evaluation, stopping at ``target_return``,
checkpoints. :func:`run_on_policy` is the loop with a GAE learner around an algorithm's ``update``.

The history uses short keys (``sps``, ``train_return``, ``clip_frac``, ...); the trackers (TensorBoard, W&B) get
CleanRL's names for them (:func:`tracker_tag`: ``charts/SPS``, ``charts/episodic_return``, ``losses/clipfrac``, ...,
and ``eval/episodic_return``), at environment steps (CleanRL's ``global_step``).

Several processes (``accelerate launch --num_processes N``, ``torchrun``; ``minigrpo.infra.distributed``), for a learner
that says it can (``data_parallel``: PPO's): each rank steps its own ``num_envs`` env copies seeded apart, every rank
starts from rank 0's agent, the update averages the gradients (see ``control.ppo``), the metrics are averaged over the
ranks; ``total_timesteps`` counts the env steps of every rank (as CleanRL's multi-GPU PPO), so an iteration takes
N × ``batch_size`` of them; rank 0 alone shows progress, logs, evaluates (the verdict is sent to every rank) and saves.
In one process nothing changes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

from minigrpo.infra.checks import at_least, in_unit_interval, positive
from minigrpo.advantages import gae
from minigrpo.control.agents import ActorCritic
from minigrpo.control.config import ControlConfig
from minigrpo.control.rollouts import Rollout, RolloutCollector, evaluate, make_vec_env
from minigrpo.infra.atomic import atomic_folder
from minigrpo.infra.distributed import Distributed
from minigrpo.losses import value_loss
from minigrpo.infra.tracking import (Tracker, checkpoint_folder, load_state, resolve_checkpoint, rng_state, save_state,
                                     set_rng_state, should_log, should_save)
from minigrpo.utils import seed_everything, torch_threads

__all__ = ["GAELearner", "OnPolicyConfig", "Rollout", "RolloutCollector", "TrainResult", "explained_variance",
           "fit_value", "iterations", "make_vec_env", "normalize", "run_on_policy", "tracker_tag", "train_loop"]


@dataclass
class OnPolicyConfig(ControlConfig):
    """What the GAE trainers (A2C, TRPO, PPO) add to ControlConfig; each of them adds its own knobs."""

    total_timesteps: int = 100_000  #: environment steps to train for (all envs together)
    num_steps: int = 128  #: steps per env per rollout (a rollout has num_envs * num_steps samples)
    gae_lambda: float = 0.95  #: GAE λ: 0 = TD residual (low variance), 1 = Monte Carlo (no bias)
    reward_scale: float = 1.0  #: rewards are multiplied by this for learning only (logged returns stay raw)

    def __post_init__(self):
        super().__post_init__()
        at_least(self, 1, "total_timesteps", "num_steps")
        in_unit_interval(self, "gae_lambda")
        positive(self, "reward_scale")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        return max(1, self.total_timesteps // self.batch_size)


@dataclass
class TrainResult:
    agent: ActorCritic
    history: dict[str, list] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    solved_at_step: int | None = None  #: env steps when an evaluation first reached target_return
    solved_at_seconds: float | None = None  #: wall-clock seconds (training + evaluation) at that moment


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """1 − Var(target − pred) / Var(target): 1 is a perfect value function, ≤ 0 is no better than a constant."""
    var = target.var()
    return float("nan") if var == 0 else float(1 - (target - pred).var() / var)


def normalize(adv: torch.Tensor, ranks: Distributed | None = None) -> torch.Tensor:
    """``(adv − mean) / (std + 1e-8)`` over every entry (``norm_adv``); a single entry is left alone. With ``ranks``
    (several processes, equal sizes) the mean and std are those of every rank's entries together."""
    everyone = adv if ranks is None else ranks.gather(adv.detach())
    return (adv - everyone.mean()) / (everyone.std() + 1e-8) if everyone.numel() > 1 else adv


def iterations(cfg: ControlConfig, world_size: int = 1) -> int:
    """The loop's iterations: ``cfg.num_iterations`` in one process; with N processes an iteration takes N ×
    ``batch_size`` env steps of ``total_timesteps`` (which counts every rank's envs)."""
    if world_size == 1:
        return cfg.num_iterations
    return max(1, cfg.total_timesteps // (cfg.batch_size * world_size))


def fit_value(critic: torch.nn.Module, opt: torch.optim.Optimizer, obs: torch.Tensor, targets: torch.Tensor,
              epochs: int, minibatches: int = 1) -> float:
    """``epochs`` passes of ``opt`` on ``value_loss(critic(obs), targets)`` (0.5 · mean squared error), each in
    ``minibatches`` shuffled minibatches (1: the whole batch, in order). Returns the last minibatch's loss."""
    n = obs.shape[0]
    size = max(1, n // minibatches)
    for _ in range(epochs):
        order = torch.randperm(n) if minibatches > 1 else torch.arange(n)
        for start in range(0, n, size):
            idx = order[start: start + size]
            loss = value_loss(critic(obs[idx]), targets[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return loss.item()


def episode_stats(returns: Iterable[float], lengths: Iterable[int]) -> dict[str, float]:
    """``train_return`` and ``episode_length``: means of episode statistics (NaN when there is none)."""
    returns, lengths = list(returns), list(lengths)
    return {"train_return": float(np.mean(returns)) if returns else math.nan,
            "episode_length": float(np.mean(lengths)) if lengths else math.nan}


class Learner(Protocol):
    """What :func:`train_loop` drives: one call is one iteration."""

    envs: gym.vector.VectorEnv

    def __call__(self, iteration: int) -> tuple[int, dict[str, float]]:
        """Collect, compute advantages, update; return the env steps used and the metrics (with
        ``train_return`` and ``episode_length``)."""

    def state_dict(self) -> dict: ...  # only for checkpoints

    def load_state_dict(self, state: dict, seed: int) -> None: ...


UpdateFn = Callable[[ActorCritic, Rollout, torch.Tensor, torch.Tensor, int], dict[str, float]]
HISTORY_KEYS = ("iteration", "env_steps", "seconds", "sps", "train_return", "episode_length", "eval_step",
                "eval_return")


class GAELearner:
    """An iteration of A2C, TRPO or PPO: ``num_steps`` steps of every env, GAE, then the algorithm's
    ``update(agent, rollout, advantages, returns, iteration) -> metrics``. ``train_return`` is the mean of
    the last 20 episodes (the episode-statistics wrapper's ``return_queue``)."""

    def __init__(self, cfg: OnPolicyConfig, agent: ActorCritic, envs: gym.vector.VectorEnv, update: UpdateFn):
        self.cfg, self.agent, self.update = cfg, agent, update
        self.dist = Distributed()  # one process: every collective is the identity
        self.data_parallel = getattr(update, "data_parallel", False)  #: the update averages gradients over ranks
        self.collector = RolloutCollector(envs, self.dist.seed(cfg.seed))  # each rank's envs seeded apart

    @property
    def envs(self) -> gym.vector.VectorEnv:
        return self.collector.envs  # a resume replaces the collector's envs

    def __call__(self, iteration: int) -> tuple[int, dict[str, float]]:
        cfg = self.cfg
        ro = self.collector.collect(self.agent, cfg.num_steps)
        adv = gae(ro.rewards * cfg.reward_scale, ro.values, ro.next_values, ro.terminated, ro.truncated,
                  cfg.gamma, cfg.gae_lambda)
        returns = adv + ro.values
        metrics = self.update(self.agent, ro, adv, returns, iteration)
        metrics["explained_variance"] = explained_variance(ro.values.reshape(-1), returns.reshape(-1))
        metrics = {**episode_stats(self.envs.return_queue, ro.episode_lengths), **metrics}
        return cfg.batch_size * self.dist.world_size, self.dist.reduce_metrics(metrics)  # every rank's env steps

    def state_dict(self) -> dict:
        """The optimizer (``update.state_dict()``) and the envs with their episode statistics."""
        return {"update": self.update.state_dict(), "collector": self.collector.state_dict()}

    def load_state_dict(self, state: dict, seed: int) -> None:
        self.update.load_state_dict(state["update"])
        self.collector.load_state_dict(state["collector"], seed=seed)


@dataclass
class LoopState:
    """What the training loop carries from one iteration to the next (saved in checkpoints)."""

    iteration: int = 0
    env_steps: int = 0
    next_eval: int = 0
    seconds: float = 0.0  #: wall-clock seconds spent before this run (a resumed run continues the clock)


def save_checkpoint(folder: Path, cfg: ControlConfig, agent: ActorCritic, learner: Learner, loop: LoopState,
                    result: TrainResult) -> None:
    """Agent, learner (optimizer, envs and episode statistics), random states, loop, history. Written into a
    temporary folder renamed into place: a crash mid-save leaves the previous checkpoint whole, never half."""
    with atomic_folder(folder) as tmp:
        torch.save(agent.state_dict(), tmp / "agent.pt")
        save_state(tmp, {"step": loop.iteration, "loop": asdict(loop), "history": result.history,
                         "solved": (result.solved_at_step, result.solved_at_seconds), **learner.state_dict(),
                         "rng": rng_state()}, asdict(cfg))


def load_checkpoint(folder: Path, cfg: ControlConfig, agent: ActorCritic, learner: Learner,
                    result: TrainResult) -> LoopState:
    state = load_state(folder)
    agent.load_state_dict(torch.load(Path(folder, "agent.pt"), weights_only=True))
    learner.load_state_dict(state, seed=cfg.seed + state["step"])
    set_rng_state(state["rng"])
    result.history.update(state["history"])
    result.solved_at_step, result.solved_at_seconds = state["solved"]
    return LoopState(**state["loop"])


def run_on_policy(cfg: OnPolicyConfig, name: str, make_update: Callable[[ActorCritic], UpdateFn],
                  progress: bool = True) -> TrainResult:
    """The training loop with a :class:`GAELearner`: rollout → GAE → ``update`` → log → evaluate (→ save).

    ``make_update(agent)`` returns ``update(agent, rollout, advantages, returns, iteration)``, which
    changes the agent and returns the metrics to log for that iteration. Checkpoints (configs with
    ``output_dir`` / ``resume_from_checkpoint``, such as PPOConfig) need the update to carry
    ``update.state_dict()`` / ``update.load_state_dict()`` for its optimizer.
    """
    return train_loop(cfg, name, lambda agent, envs: GAELearner(cfg, agent, envs, make_update(agent)), progress)


def train_loop(cfg: ControlConfig, name: str, make_learner: Callable[[ActorCritic, gym.vector.VectorEnv], Learner],
               progress: bool = True) -> TrainResult:
    """Seed, build the envs (:func:`make_vec_env`), the agent and ``make_learner(agent, envs)``, then run
    ``cfg.num_iterations`` iterations (fewer once an evaluation reaches ``cfg.target_return``)."""
    with torch_threads(1):  # tiny networks: one thread is fastest
        dist = Distributed()  # one process: every collective is the identity
        seed_everything(dist.seed(cfg.seed))  # rank 0: cfg.seed; the other ranks their own
        envs = make_vec_env(cfg.env_id, cfg.num_envs)
        agent = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden_sizes)
        dist.broadcast_parameters(agent)  # every rank starts from rank 0's agent
        learner = make_learner(agent, envs)
        _check_processes(dist, cfg, name, learner)
        total = iterations(cfg, dist.world_size)
        result = TrainResult(agent, {k: [] for k in HISTORY_KEYS}, asdict(cfg))
        loop = LoopState(next_eval=cfg.eval_every_steps)
        folder = resolve_checkpoint(cfg, getattr(cfg, "resume_from_checkpoint", None))
        if folder is not None:
            loop = load_checkpoint(folder, cfg, agent, learner, result)
        bar = tqdm(range(loop.iteration + 1, total + 1), desc=f"{name} {cfg.env_id}",
                   disable=not progress or not dist.is_main, initial=loop.iteration, total=total)
        with Tracker(cfg.report_to, cfg.logging_dir, f"{name.lower()}-{cfg.env_id}", asdict(cfg)) as tracker:
            start = time.perf_counter() - loop.seconds
            for it in bar:
                done = _iteration(cfg, it, learner, loop, result, start, tracker, total, dist)
                output_dir = getattr(cfg, "output_dir", None)
                due = output_dir is not None and (done or should_save(it, cfg.save_steps, total))
                if due and dist.is_main:  # only rank 0 writes
                    save_checkpoint(checkpoint_folder(output_dir, it), cfg, agent, learner, loop, result)
                bar.set_postfix({"ret": f"{result.history['train_return'][-1]:.0f}",
                                 **({"eval": f"{result.history['eval_return'][-1]:.0f}"}
                                    if result.history["eval_return"] else {})})
                if done:
                    break
        learner.envs.close()
    return result


def _check_processes(dist: Distributed, cfg: ControlConfig, name: str, learner: Learner) -> None:
    """Under a launcher, only a learner whose update averages gradients over the ranks may train, from scratch."""
    if dist.active and not getattr(learner, "data_parallel", False):
        raise ValueError(f"{name} trains in one process only; under a launcher (several processes) use PPO, whose "
                         "update averages the gradients over the processes")
    if dist.active and getattr(cfg, "resume_from_checkpoint", None):
        raise ValueError(f"{type(cfg).__name__}.resume_from_checkpoint works in one process only: a checkpoint "
                         "holds rank 0's environments, not the other ranks'")


#: The trackers' (TensorBoard, W&B) names of the history's keys: CleanRL's (``ppo.py``) where CleanRL logs the same
#: quantity. The history keeps the short keys; any other key of an update goes under ``losses/``.
CLEANRL_TAGS = {
    "sps": "charts/SPS", "train_return": "charts/episodic_return", "episode_length": "charts/episodic_length",
    "learning_rate": "charts/learning_rate", "seconds": "charts/seconds", "clip_coef": "charts/clip_coef",
    "kl_coef": "charts/kl_coef", "clip_frac": "losses/clipfrac",
}


def tracker_tag(key: str) -> str:
    """A history key's name in the trackers: ``sps`` -> ``charts/SPS``, ``clip_frac`` -> ``losses/clipfrac``,
    ``policy_loss`` -> ``losses/policy_loss`` (CleanRL's names)."""
    return CLEANRL_TAGS.get(key, f"losses/{key}")


def _iteration(cfg: ControlConfig, it: int, learner: Learner, loop: LoopState, result: TrainResult, start: float,
               tracker: Tracker, total: int, dist: Distributed) -> bool:
    """One iteration of ``total``: the learner, history, trackers, evaluation (rank 0's, its verdict sent to every
    rank). True once target_return is reached."""
    t0 = time.perf_counter()
    steps, metrics = learner(it)
    loop.iteration, loop.env_steps = it, loop.env_steps + steps
    loop.seconds = time.perf_counter() - start
    row = {"iteration": it, "env_steps": loop.env_steps, "seconds": loop.seconds,
           "sps": steps / (time.perf_counter() - t0), **metrics}
    for k, v in row.items():
        result.history.setdefault(k, []).append(v)
    if should_log(it, cfg.logging_steps, total):
        tracker.log({tracker_tag(k): v for k, v in row.items() if k not in ("iteration", "env_steps")},
                    loop.env_steps)
    if not (cfg.eval_every_steps and (loop.env_steps >= loop.next_eval or it == total)):
        return False
    loop.next_eval = (loop.env_steps // cfg.eval_every_steps + 1) * cfg.eval_every_steps
    ev = float(evaluate(result.agent, cfg.env_id, cfg.eval_episodes, seed=10_000 + cfg.seed).mean()) \
        if dist.is_main else 0.0
    ev = dist.from_main(ev)  # every rank stops (target_return) when rank 0 does
    result.history["eval_step"].append(loop.env_steps)
    result.history["eval_return"].append(ev)
    tracker.log({"eval/episodic_return": ev}, loop.env_steps)
    if cfg.target_return is not None and ev >= cfg.target_return and result.solved_at_step is None:
        result.solved_at_step = loop.env_steps
        result.solved_at_seconds = time.perf_counter() - start
        return True
    return False
