"""Classic control on gymnasium: policies, rollouts and the trainers of lessons 01–04."""

from minigrpo.control.a2c import A2CConfig, train_a2c
from minigrpo.control.agents import ActorCritic
from minigrpo.control.onpolicy import (
    OnPolicyConfig,
    Rollout,
    TrainResult,
    explained_variance,
    make_vec_env,
)
from minigrpo.control.policies import CategoricalMLPPolicy, MLPValue, mlp
from minigrpo.control.ppo import PPOConfig, train_ppo
from minigrpo.control.reinforce import ReinforceConfig, ReinforceResult, train_reinforce
from minigrpo.control.rollouts import Episode, collect_episodes, evaluate, make_envs
from minigrpo.control.trpo import TRPOConfig, train_trpo

__all__ = [
    "A2CConfig",
    "train_a2c",
    "ActorCritic",
    "CategoricalMLPPolicy",
    "Episode",
    "MLPValue",
    "OnPolicyConfig",
    "PPOConfig",
    "ReinforceConfig",
    "ReinforceResult",
    "Rollout",
    "TRPOConfig",
    "TrainResult",
    "collect_episodes",
    "evaluate",
    "explained_variance",
    "make_envs",
    "make_vec_env",
    "mlp",
    "train_ppo",
    "train_reinforce",
    "train_trpo",
]
