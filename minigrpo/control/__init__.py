"""Classic control on gymnasium: one stack for lessons 01–04.

- ``agents``: the networks (``MLPPolicy``, ``MLPValue``, ``ActorCritic``);
- ``rollouts``: vector envs with gymnasium's episode statistics, whole episodes, rollouts, evaluation;
- ``config`` / ``onpolicy``: the shared settings and the training loop;
- ``reinforce``, ``a2c``, ``trpo``, ``ppo``: what each algorithm adds.
"""

from minigrpo.control.a2c import A2CConfig, train_a2c
from minigrpo.control.agents import ActorCritic, MLPPolicy, MLPValue, mlp
from minigrpo.control.config import ControlConfig
from minigrpo.control.onpolicy import OnPolicyConfig, TrainResult, explained_variance, run_on_policy
from minigrpo.control.ppo import PPOConfig, train_ppo
from minigrpo.control.reinforce import ReinforceConfig, train_reinforce
from minigrpo.control.rollouts import Episode, Rollout, collect_episodes, evaluate, make_vec_env
from minigrpo.control.trpo import TRPOConfig, train_trpo

__all__ = [
    "A2CConfig",
    "ActorCritic",
    "ControlConfig",
    "Episode",
    "MLPPolicy",
    "MLPValue",
    "OnPolicyConfig",
    "PPOConfig",
    "ReinforceConfig",
    "Rollout",
    "TRPOConfig",
    "TrainResult",
    "collect_episodes",
    "evaluate",
    "explained_variance",
    "make_vec_env",
    "mlp",
    "run_on_policy",
    "train_a2c",
    "train_ppo",
    "train_reinforce",
    "train_trpo",
]
