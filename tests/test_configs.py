"""Every trainer config refuses a wrong type or a bad value at construction, in one sentence naming
``Class.field`` (issue 11), and keeps accepting what the lessons, benchmarks and tests use."""

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytest

from minigrpo.infra.checks import check_config_types, check_value
from minigrpo.control.a2c import A2CConfig
from minigrpo.control.onpolicy import OnPolicyConfig
from minigrpo.control.ppo import PRESETS, PPOConfig
from minigrpo.control.reinforce import ReinforceConfig
from minigrpo.control.trpo import TRPOConfig
from minigrpo.diffusion.ddpm import pretrained_base
from minigrpo.diffusion.grpo import DIGITS_RECIPE, DiffusionGRPOConfig
from minigrpo.llm.grpo import GRPOConfig
from minigrpo.llm.recipes import RECIPES, Recipe
from minigrpo.llm.sft import SFTConfig

CONFIGS = [GRPOConfig, SFTConfig, Recipe, DiffusionGRPOConfig, OnPolicyConfig, PPOConfig, TRPOConfig, A2CConfig,
           ReinforceConfig]

# (config, keyword arguments with a value of the wrong type, the field the message must name)
WRONG_TYPES = [
    (GRPOConfig, dict(num_generations="8"), "num_generations"),
    (GRPOConfig, dict(beta="0.1"), "beta"),
    (GRPOConfig, dict(max_completion_length=2.5), "max_completion_length"),
    (GRPOConfig, dict(filter_zero_std_groups=1), "filter_zero_std_groups"),
    (GRPOConfig, dict(loss_type=None), "loss_type"),
    (SFTConfig, dict(steps=10.0), "steps"),
    (SFTConfig, dict(learning_rate=True), "learning_rate"),
    (Recipe, dict(sft=dict(steps=3)), "sft"),
    (Recipe, dict(task_kwargs=None), "task_kwargs"),
    (DiffusionGRPOConfig, dict(num_inference_steps="10"), "num_inference_steps"),
    (DiffusionGRPOConfig, dict(epsilon_high="0.3"), "epsilon_high"),
    (OnPolicyConfig, dict(total_timesteps=1e5), "total_timesteps"),
    (OnPolicyConfig, dict(env_id=1), "env_id"),
    (PPOConfig, dict(anneal_lr="yes"), "anneal_lr"),
    (PPOConfig, dict(hidden_sizes=64), "hidden_sizes"),
    (TRPOConfig, dict(cg_iters=10.5), "cg_iters"),
    (A2CConfig, dict(learning_rate="1e-3"), "learning_rate"),
    (ReinforceConfig, dict(target_return="475"), "target_return"),
    (ReinforceConfig, dict(norm_adv=None), "norm_adv"),
]

# (config, keyword arguments with a value of the right type but out of range, the field)
BAD_VALUES = [
    (GRPOConfig, dict(report_to="tb"), "report_to"),
    (GRPOConfig, dict(logging_steps=0), "logging_steps"),
    (GRPOConfig, dict(save_steps=-1), "save_steps"),
    (PPOConfig, dict(save_steps=-1), "save_steps"),
    (PPOConfig, dict(report_to="tb"), "report_to"),
    (DiffusionGRPOConfig, dict(report_to="tb"), "report_to"),
    (GRPOConfig, dict(beta=-1), "beta"),
    (GRPOConfig, dict(epsilon=0.0), "epsilon"),
    (GRPOConfig, dict(epsilon=-0.2), "epsilon"),
    (GRPOConfig, dict(epsilon_high=0.0), "epsilon_high"),
    (GRPOConfig, dict(learning_rate=-1e-3), "learning_rate"),
    (GRPOConfig, dict(learning_rate=float("nan")), "learning_rate"),
    (GRPOConfig, dict(learning_rate=float("inf")), "learning_rate"),
    (GRPOConfig, dict(max_steps=0), "max_steps"),
    (GRPOConfig, dict(prompts_per_step=0), "prompts_per_step"),
    (GRPOConfig, dict(max_completion_length=0), "max_completion_length"),
    (GRPOConfig, dict(kl_estimator="k4"), "kl_estimator"),
    (GRPOConfig, dict(scale_rewards="std"), "scale_rewards"),
    (GRPOConfig, dict(max_grad_norm=0.0), "max_grad_norm"),
    (GRPOConfig, dict(eval_every=-1), "eval_every"),
    (SFTConfig, dict(steps=0), "steps"),
    (SFTConfig, dict(learning_rate=0.0), "learning_rate"),
    (SFTConfig, dict(demo_error_rate=1.5), "demo_error_rate"),
    (SFTConfig, dict(weight_decay=-0.1), "weight_decay"),
    (Recipe, dict(task="multiplication"), "task"),
    (Recipe, dict(arch="bert"), "arch"),
    (DiffusionGRPOConfig, dict(beta=-0.1), "beta"),
    (DiffusionGRPOConfig, dict(epsilon=0.0), "epsilon"),
    (DiffusionGRPOConfig, dict(epsilon_high=-1.0), "epsilon_high"),
    (DiffusionGRPOConfig, dict(learning_rate=0.0), "learning_rate"),
    (DiffusionGRPOConfig, dict(num_inference_steps=0), "num_inference_steps"),
    (DiffusionGRPOConfig, dict(prompts_per_step=11), "prompts_per_step"),
    (DiffusionGRPOConfig, dict(sampler="ddpm", eta=-1.0), "eta"),
    (DiffusionGRPOConfig, dict(max_grad_norm=-1.0), "max_grad_norm"),
    (OnPolicyConfig, dict(gamma=1.01), "gamma"),
    (OnPolicyConfig, dict(gae_lambda=-0.1), "gae_lambda"),
    (OnPolicyConfig, dict(num_envs=0), "num_envs"),
    (OnPolicyConfig, dict(seed=-1), "seed"),
    (OnPolicyConfig, dict(reward_scale=0.0), "reward_scale"),
    (PPOConfig, dict(clip_coef=0.0), "clip_coef"),
    (PPOConfig, dict(learning_rate=-2.5e-4), "learning_rate"),
    (PPOConfig, dict(num_minibatches=0), "num_minibatches"),
    (PPOConfig, dict(target_kl=0.0), "target_kl"),
    (PPOConfig, dict(ent_coef=-0.01), "ent_coef"),
    (PPOConfig, dict(gamma=2.0), "gamma"),  # an inherited field is named after the class that was built
    (TRPOConfig, dict(max_kl=0.0), "max_kl"),
    (TRPOConfig, dict(vf_iters=0), "vf_iters"),
    (TRPOConfig, dict(damping=-0.1), "damping"),
    (A2CConfig, dict(learning_rate=0.0), "learning_rate"),
    (A2CConfig, dict(vf_coef=-0.5), "vf_coef"),
    (ReinforceConfig, dict(gamma=-0.5), "gamma"),
    (ReinforceConfig, dict(learning_rate=0.0), "learning_rate"),
    (ReinforceConfig, dict(vf_iters=0), "vf_iters"),
    (ReinforceConfig, dict(num_iterations=0), "num_iterations"),
    (ReinforceConfig, dict(baseline="critic"), "baseline"),
]


def _name(cls, kwargs):
    return f"{cls.__name__}-{'-'.join(kwargs)}"


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_defaults_construct(cls):
    cfg = cls()
    assert dataclasses.replace(cfg) == cfg  # the checks are idempotent: a checked config passes again


@pytest.mark.parametrize("cls, kwargs, field", WRONG_TYPES, ids=[_name(c, k) for c, k, _ in WRONG_TYPES])
def test_wrong_type_is_a_type_error_naming_the_field(cls, kwargs, field):
    with pytest.raises(TypeError, match=re.escape(f"{cls.__name__}.{field} must be")):
        cls(**kwargs)


@pytest.mark.parametrize("cls, kwargs, field", BAD_VALUES, ids=[_name(c, k) for c, k, _ in BAD_VALUES])
def test_bad_value_is_a_value_error_naming_the_field(cls, kwargs, field):
    with pytest.raises(ValueError, match=re.escape(f"{cls.__name__}.{field} must be")):
        cls(**kwargs)


def test_every_config_has_a_wrong_type_and_a_bad_value_case():
    for cls in CONFIGS:
        assert any(c is cls for c, _, _ in WRONG_TYPES), cls.__name__
        assert any(c is cls for c, _, _ in BAD_VALUES), cls.__name__


def test_the_issue_examples():
    with pytest.raises(ValueError, match=r"^GRPOConfig\.beta must be >= 0, got -1\.0$"):
        GRPOConfig(beta=-1)
    with pytest.raises(TypeError, match=r"^GRPOConfig\.num_generations must be an int, got str '8'$"):
        GRPOConfig(num_generations="8")
    with pytest.raises(ValueError, match=r"^GRPOConfig\.epsilon must be > 0, got 0\.0$"):
        GRPOConfig(epsilon=0)


def test_types_are_normalised():
    cfg = GRPOConfig(learning_rate=1, beta=0, num_generations=np.int64(4), prompts_per_step=np.int32(2),
                     max_completion_length=np.uint8(6), epsilon=np.float32(0.25))
    assert type(cfg.learning_rate) is float and cfg.learning_rate == 1.0
    assert type(cfg.beta) is float and cfg.beta == 0.0
    assert type(cfg.num_generations) is int and cfg.num_generations == 4
    assert type(cfg.prompts_per_step) is int and cfg.prompts_per_step == 2
    assert type(cfg.max_completion_length) is int and cfg.max_completion_length == 6
    assert type(cfg.epsilon) is float and cfg.epsilon == 0.25
    ppo = PPOConfig(hidden_sizes=[np.int64(32), 16], target_return=475, gamma=1, num_envs=np.int16(4))
    assert ppo.hidden_sizes == (32, 16) and all(type(h) is int for h in ppo.hidden_sizes)
    assert type(ppo.target_return) is float and type(ppo.gamma) is float and type(ppo.num_envs) is int
    json.dumps(dataclasses.asdict(ppo))  # numpy scalars would not serialise: the trainers log asdict(cfg)
    assert SFTConfig(steps=np.int64(5)).steps == 5
    reinforce = ReinforceConfig(hidden_sizes=(np.int64(8),), norm_adv=np.bool_(False))
    assert reinforce.norm_adv is False and type(reinforce.hidden_sizes[0]) is int


def test_edge_values_the_lessons_and_tests_use_are_accepted():
    assert GRPOConfig(learning_rate=0.0).learning_rate == 0.0  # tests freeze the weights this way
    GRPOConfig(max_grad_norm=float("inf"), vllm_importance_sampling_clip_max=float("inf"))  # no clip / no cap
    GRPOConfig(checkpoint_dir="runs/x", checkpoint_every=0, eval_every=0)
    for lam in (0.0, 1.0):  # lesson 02's λ sweep
        A2CConfig(gae_lambda=lam)
    PPOConfig(ent_coef=0.0, target_return=None)
    OnPolicyConfig(hidden_sizes=())  # a linear policy
    ReinforceConfig(gamma=1.0, target_return=None, eval_every_steps=0)
    DiffusionGRPOConfig(beta=0.0, min_step_std=0.0, sampler="ddpm", eta=0.0)  # DDPM ignores η
    DiffusionGRPOConfig(**DIGITS_RECIPE)
    for preset in PRESETS.values():
        PPOConfig(**preset)
    assert set(RECIPES) == {"addition", "countdown", "sort", "gsm8k"}


def test_existing_messages_still_match():
    # The phrases other tests match on, now prefixed with the class.
    with pytest.raises(ValueError, match="temperature must be > 0.*stochastic"):
        GRPOConfig(temperature=0.0)
    with pytest.raises(ValueError, match="must divide"):
        GRPOConfig(prompts_per_step=3, num_generations=3, gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="DiffusionGRPOConfig.eta must be > 0"):
        DiffusionGRPOConfig(eta=0.0)
    with pytest.raises(ValueError, match="PPOConfig.num_minibatches .* must divide"):
        PPOConfig(num_envs=3, num_steps=10, num_minibatches=4)


def test_hidden_sizes_entries_are_named():
    with pytest.raises(TypeError, match=re.escape("TRPOConfig.hidden_sizes[1] must be an int, got str 'a'")):
        TRPOConfig(hidden_sizes=(64, "a"))
    with pytest.raises(ValueError, match=re.escape("ReinforceConfig.hidden_sizes[0] must be >= 1, got 0")):
        ReinforceConfig(hidden_sizes=(0, 32))


def test_base_model_overrides_are_checked_before_any_training(tmp_path):
    with pytest.raises(TypeError, match=re.escape("BASE_CONFIG.steps must be an int, got str '50'")):
        pretrained_base(cache_dir=tmp_path, steps="50", progress=False)
    with pytest.raises(ValueError, match=re.escape("BASE_CONFIG.p_uncond must be in [0, 1]")):
        pretrained_base(cache_dir=tmp_path, p_uncond=1.5, progress=False)
    with pytest.raises(ValueError, match=re.escape("BASE_CONFIG.batch_size must be >= 1")):
        pretrained_base(cache_dir=tmp_path, batch_size=0, progress=False)
    assert not list(tmp_path.iterdir())  # nothing was trained or written


@dataclass
class _Toy:
    mode: Literal["a", "b"] = "a"
    pair: tuple[int, float] = (1, 2.0)
    scale: float | None = None
    names: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        check_config_types(self)


def test_literal_fixed_tuples_unions_and_lists():
    assert _Toy(pair=[3, 4]).pair == (3, 4.0) and type(_Toy(pair=[3, 4]).pair[1]) is float
    assert _Toy(scale=2).scale == 2.0 and _Toy(scale=None).scale is None
    with pytest.raises(ValueError, match=re.escape("_Toy.mode must be one of ('a', 'b'), got 'c'")):
        _Toy(mode="c")
    with pytest.raises(ValueError, match=re.escape("_Toy.pair must have 2 entries, got 3")):
        _Toy(pair=(1, 2.0, 3.0))
    with pytest.raises(TypeError, match=re.escape("_Toy.pair[1] must be a number (int or float), got str 'x'")):
        _Toy(pair=(1, "x"))
    with pytest.raises(TypeError, match=re.escape("_Toy.scale must be a number (int or float) or None, got bool True")):
        _Toy(scale=True)
    with pytest.raises(TypeError, match=re.escape("_Toy.names[1] must be a str, got int 2")):
        _Toy(names=["a", 2])


def test_check_value_directly():
    assert check_value(np.int64(3), int, "x") == 3 and type(check_value(np.int64(3), int, "x")) is int
    assert type(check_value(np.float32(0.5), float, "x")) is float
    for value, tp in [(True, int), (1.0, int), ("1", int), (False, float), ("1.0", float), (1, bool), (b"a", str)]:
        with pytest.raises(TypeError, match="^x must be"):
            check_value(value, tp, "x")
    with pytest.raises(ValueError, match="^x must be a number, not NaN"):
        check_value(float("nan"), float, "x")
