"""Classic control on gymnasium: policies, rollouts and the trainers of lessons 01–04."""

from minigrpo.control.policies import CategoricalMLPPolicy, MLPValue, mlp
from minigrpo.control.reinforce import ReinforceConfig, ReinforceResult, train_reinforce
from minigrpo.control.rollouts import Episode, collect_episodes, evaluate, make_envs

__all__ = [
    "CategoricalMLPPolicy",
    "Episode",
    "MLPValue",
    "ReinforceConfig",
    "ReinforceResult",
    "collect_episodes",
    "evaluate",
    "make_envs",
    "mlp",
    "train_reinforce",
]
