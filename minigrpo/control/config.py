"""The settings every control trainer shares, under CleanRL's names.

``ReinforceConfig`` (lesson 01) and ``OnPolicyConfig`` (A2C, TRPO, PPO: lessons 02–04) both start from
:class:`ControlConfig`, so a field means the same thing in every trainer: ``learning_rate`` is the policy's
Adam step size, ``vf_lr`` / ``vf_iters`` the value function's, ``num_envs`` the parallel environments,
``num_iterations`` the number of policy updates, ``norm_adv`` the batch standardisation of the advantages.
A name from before this scheme (``lr``, ``iterations``, ...) is refused with the name that replaced it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from minigrpo.infra.checks import at_least, check_config_types, in_unit_interval
from minigrpo.infra.tracking import check_report_to

#: Field names the control configs used before they took CleanRL's names, and their replacements.
RENAMED = {
    "lr": "learning_rate",
    "value_lr": "vf_lr",
    "value_iters": "vf_iters",
    "iterations": "num_iterations",
    "episodes_per_iter": "num_envs",
    "normalize_advantages": "norm_adv",
    "eval_every": "eval_every_steps",
}


def _renamed_error(cls: type, name: str) -> str | None:
    new = RENAMED.get(name)
    if new is None or new not in {f.name for f in dataclasses.fields(cls)}:
        return None
    return f"{cls.__name__} has no field {name!r}; it is called {new!r}"


@dataclass
class ControlConfig:
    """Fields shared by every control trainer's config (subclasses add their own and may change defaults)."""

    env_id: str = "CartPole-v1"  #: gymnasium id; flat Box observations, Discrete or Box actions
    seed: int = 0  #: seeds python, numpy, torch and the envs
    num_envs: int = 8  #: parallel environments in the vector env
    gamma: float = 0.99  #: discount
    norm_adv: bool = True  #: standardise the advantages (REINFORCE: the weights) over the batch
    hidden_sizes: tuple[int, ...] = (64, 64)  #: hidden widths of the policy and value MLPs
    eval_every_steps: int = 5_000  #: evaluate the greedy policy each time this many more env steps are done (0: never)
    eval_episodes: int = 10  #: episodes per evaluation
    target_return: float | None = None  #: stop once an evaluation's mean reaches this (None: never)
    #: trackers to log to: "none", "tensorboard", "trackio", "wandb", or a list of them (see minigrpo.infra.tracking);
    #: the step axis is env_steps, as in CleanRL
    report_to: str | list[str] = "none"
    logging_dir: str | Path | None = None  #: where the trackers write (None: runs/<trainer>-<env_id>-<timestamp>)
    logging_steps: int = 1  #: send the metrics to the trackers every this many iterations (and at the last)

    def __new__(cls, *args, **kwargs):
        # Runs before the dataclass __init__, which would only say "unexpected keyword argument 'lr'".
        for name in kwargs:
            message = _renamed_error(cls, name)
            if message is not None:
                raise TypeError(message)
        return super().__new__(cls)

    def __getattr__(self, name: str):
        # Only called for a missing attribute: point an old name (cfg.lr) to its new one.
        raise AttributeError(_renamed_error(type(self), name)
                             or f"{type(self).__name__!r} object has no attribute {name!r}")

    def __post_init__(self):
        # Subclasses call this first (super().__post_init__()), then check their own fields.
        check_config_types(self)
        at_least(self, 0, "seed", "eval_every_steps")  # gymnasium refuses negative seeds
        at_least(self, 1, "num_envs", "eval_episodes", "hidden_sizes", "logging_steps")
        in_unit_interval(self, "gamma")
        check_report_to(self)
