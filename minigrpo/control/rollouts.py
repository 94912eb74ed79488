"""Experience from gymnasium vector envs: whole episodes (REINFORCE, evaluation) and fixed-length rollouts
(A2C, TRPO, PPO).

Every env here is a ``SyncVectorEnv`` made by :func:`make_vec_env`, wrapped in gymnasium's
``RecordEpisodeStatistics``: the wrapper, not our code, adds up each episode's return and length and reports
them in ``info["episode"]`` at the step the episode ends (``info["_episode"]`` says which sub-envs ended).

Autoreset: we pick gymnasium's ``SAME_STEP`` mode. A sub-env that ends an episode is reset inside that same
``step``: the observation it returns is already the next episode's first, and the real last observation comes
in ``info["final_obs"]``. Every step is therefore a real transition (NEXT_STEP mode would insert a
no-op reset step after each ending, which the data would have to skip).
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import RecordEpisodeStatistics

from minigrpo.utils import torch_threads


def make_vec_env(env_id: str, num_envs: int, seed: int | None = None, buffer_length: int = 20,
                 **kwargs) -> RecordEpisodeStatistics:
    """``num_envs`` copies of ``env_id`` in a SyncVectorEnv (SAME_STEP autoreset), wrapped in
    ``RecordEpisodeStatistics`` whose ``return_queue`` keeps the last ``buffer_length`` episode returns.
    With a ``seed``, sub-env i is reset with ``seed + i`` (and the action space seeded). ``kwargs`` go to
    ``gym.make`` (e.g. ``max_episode_steps``)."""
    envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **kwargs)
    envs = RecordEpisodeStatistics(envs, buffer_length=buffer_length)
    if seed is not None:
        envs.reset(seed=seed)
        envs.action_space.seed(seed)
    return envs


def ended_episodes(info: dict, num_envs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From a step's ``info``: which of the ``num_envs`` sub-envs ended an episode (bool ``[N]``), and the
    returns and lengths ``RecordEpisodeStatistics`` recorded for them (``[N]``, meaningful where the mask is True)."""
    if "_episode" not in info:  # no episode ended in this step
        return np.zeros(num_envs, dtype=bool), np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64)
    return info["_episode"], info["episode"]["r"], info["episode"]["l"]


def env_actions(space: gym.Space, actions: torch.Tensor) -> np.ndarray:
    """A batch of a policy's actions as a vector env wants them: clipped to the bounds of a Box space."""
    out = actions.cpu().numpy()
    return out if isinstance(space, gym.spaces.Discrete) else np.clip(out, space.low, space.high)


# ---------------------------------------------------------------------------------------- whole episodes


@dataclass
class Episode:
    """One finished episode. ``obs[t]`` is the observation at which ``actions[t]`` was taken."""

    obs: torch.Tensor  # [T, obs_dim] float32
    actions: torch.Tensor  # [T] (int64 for discrete actions)
    rewards: torch.Tensor  # [T] float32
    terminated: bool  # ended in a terminal state (nothing follows: V = 0)
    truncated: bool  # cut by a time limit (the last state still has value)

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def total_reward(self) -> float:
        return float(self.rewards.sum())


def _idle_actions(space: gym.Space, n: int) -> torch.Tensor:
    """Actions for sub-envs whose episode is over (they keep stepping with the others; nothing is kept)."""
    if isinstance(space, gym.spaces.Discrete):
        return torch.full((n,), int(space.start), dtype=torch.int64)
    return torch.as_tensor(np.clip(np.zeros(space.shape), space.low, space.high), dtype=torch.float32).expand(n, -1)


@torch.no_grad()
def run_episodes(envs: RecordEpisodeStatistics, policy,
                 deterministic: bool = False) -> tuple[list[Episode], np.ndarray]:
    """Reset ``envs`` and run one whole episode in each sub-env, in lockstep, with one batched policy call
    per step on the sub-envs still in their first episode. Returns the episodes (in sub-env order) and
    their returns as ``RecordEpisodeStatistics`` recorded them."""
    obs, _ = envs.reset()
    n, space = envs.num_envs, envs.single_action_space
    live = np.ones(n, dtype=bool)
    length, ret = np.zeros(n, dtype=np.int64), np.zeros(n)
    term, trunc = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    obs_buf, act_buf, rew_buf = [], [], []
    while live.any():
        actions = _idle_actions(space, n).clone()
        actions[live] = policy.act(torch.as_tensor(obs[live], dtype=torch.float32), deterministic=deterministic)
        obs_buf.append(obs)
        act_buf.append(actions)
        obs, reward, terminated, truncated, info = envs.step(env_actions(space, actions))
        rew_buf.append(reward)
        ended, returns, lengths = ended_episodes(info, n)
        first = live & ended  # a sub-env's later episodes are not kept
        length[first], ret[first] = lengths[first], returns[first]
        term[first], trunc[first] = terminated[first], truncated[first]
        live &= ~first
    obs_all, act_all = torch.as_tensor(np.stack(obs_buf), dtype=torch.float32), torch.stack(act_buf)  # [T, N, ...]
    rew_all = torch.as_tensor(np.stack(rew_buf), dtype=torch.float32)
    episodes = [Episode(obs_all[:t, i], act_all[:t, i], rew_all[:t, i], bool(term[i]), bool(trunc[i]))
                for i, t in enumerate(length)]
    return episodes, ret


def collect_episodes(envs: RecordEpisodeStatistics, policy, n_episodes: int | None = None,
                     min_steps: int | None = None, deterministic: bool = False) -> list[Episode]:
    """Whole episodes, ``envs.num_envs`` at a time (one per sub-env), each run to its end.

    Starting a fixed set of episodes and running every one to completion avoids a subtle bias:
    "keep the first N episodes to finish" over-represents short episodes. So a sub-env that ends early
    idles (its next episode is dropped) until the longest episode of the round is over.

    Args:
        envs: a vector env from :func:`make_vec_env` (seed it there: ``make_vec_env(..., seed=0)``).
        policy: anything with ``act(obs_batch, deterministic) -> actions``.
        n_episodes: stop after at least this many episodes (a multiple of ``envs.num_envs``).
        min_steps: or stop once at least this many steps were collected in total.
        deterministic: take the policy's most likely action instead of sampling.
    """
    if (n_episodes is None) == (min_steps is None):
        raise ValueError("pass exactly one of n_episodes or min_steps")
    if not isinstance(envs, gym.vector.VectorEnv):
        raise TypeError(f"collect_episodes needs a vector env (make_vec_env), got {type(envs).__name__}")
    episodes: list[Episode] = []
    with torch_threads(1):
        while True:
            episodes += run_episodes(envs, policy, deterministic)[0]
            if n_episodes is not None and len(episodes) >= n_episodes:
                return episodes
            if min_steps is not None and sum(len(e) for e in episodes) >= min_steps:
                return episodes


def evaluate(policy, env_id: str, n_episodes: int = 10, seed: int = 10_000, deterministic: bool = True) -> np.ndarray:
    """Undiscounted return of ``n_episodes`` fresh episodes, one per sub-env of a vector env seeded with
    ``seed`` (greedy actions by default)."""
    envs = make_vec_env(env_id, n_episodes, seed=seed)
    try:
        with torch_threads(1):
            return run_episodes(envs, policy, deterministic)[1]
    finally:
        envs.close()


# ---------------------------------------------------------------------------------- fixed-length rollouts


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


class RolloutCollector:
    """Steps a vector env with an agent, ``num_steps`` at a time, carrying the observations between calls.

    ``next_obs[t]`` (what followed step t) is the final observation when the episode ended there, taken from
    ``info["final_obs"]``; ``terminated``/``truncated`` say how it ended, so that GAE bootstraps from
    V(next_obs) after a truncation but not after a termination.
    """

    def __init__(self, envs: RecordEpisodeStatistics, seed: int):
        self.envs = envs
        self.obs, _ = envs.reset(seed=seed)
        envs.action_space.seed(seed)
        self._space = envs.single_action_space

    def state_dict(self) -> dict:
        """The current observations and the vector env itself, episode statistics included (pickled: its
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
        return {"obs": self.obs.copy(), "envs": envs, "return_queue": list(self.envs.return_queue),
                "length_queue": list(self.envs.length_queue)}

    def load_state_dict(self, state: dict, seed: int) -> None:
        """Continue where :meth:`state_dict` was taken; without a saved env state, reset every env with
        ``seed`` (new episodes, so not what an uninterrupted run would have seen)."""
        if state["envs"] is None:
            warnings.warn("these environments cannot be restored mid-episode (EzPickle): the resumed run "
                          "starts new episodes, so it differs from an uninterrupted run", stacklevel=2)
            self.obs, _ = self.envs.reset(seed=seed)
            self.envs.return_queue.extend(state["return_queue"])
            self.envs.length_queue.extend(state["length_queue"])
            return
        fns = self.envs.unwrapped.env_fns
        self.envs.close()
        self.envs = pickle.loads(state["envs"])
        self.envs.unwrapped.env_fns = fns
        self.obs = state["obs"].copy()

    @torch.no_grad()
    def collect(self, agent, num_steps: int) -> Rollout:
        """``num_steps`` steps of every sub-env with actions sampled from ``agent`` (an ActorCritic)."""
        keys = ("obs", "actions", "logp", "values", "rewards", "terminated", "truncated", "next_obs")
        buf: dict[str, list] = {k: [] for k in keys}
        returns, lengths = [], []
        for _ in range(num_steps):
            obs = torch.as_tensor(self.obs, dtype=torch.float32)
            dist = agent.dist(obs)
            action = dist.sample()
            self.obs, reward, term, trunc, info = self.envs.step(env_actions(self._space, action))
            next_obs = self.obs.copy()
            for i in np.flatnonzero(term | trunc):
                next_obs[i] = info["final_obs"][i]  # SAME_STEP autoreset: self.obs[i] is already a reset
            ended, ep_returns, ep_lengths = ended_episodes(info, self.envs.num_envs)
            returns += ep_returns[ended].tolist()
            lengths += ep_lengths[ended].tolist()
            row = (obs, action, dist.log_prob(action), agent.value(obs), reward, term, trunc, next_obs)
            for k, v in zip(keys, row):
                buf[k].append(torch.as_tensor(v, dtype=torch.float32 if k in ("rewards", "next_obs") else None))
        t = {k: torch.stack(v) for k, v in buf.items()}
        return Rollout(obs=t["obs"], actions=t["actions"], logp=t["logp"], values=t["values"], rewards=t["rewards"],
                       terminated=t["terminated"], truncated=t["truncated"], next_values=agent.value(t["next_obs"]),
                       episode_returns=returns, episode_lengths=lengths)
