"""LoRA through `peft`, the way TRL takes it: ``GRPOTrainer(..., peft_config=LoraConfig(...))``.

LoRA (Hu et al. 2021, arXiv:2106.09685) freezes the model and learns a low-rank update ``W + (α/r)·B·A`` of
chosen linear layers. Two consequences the trainers use:

- only the adapters' parameters need gradients and optimizer state (a few MB instead of the model's GB);
- the reference policy of GRPO's KL term is the *same* model with the adapters switched off
  (``with model.disable_adapter():``), as TRL does: no second copy of the weights in memory. With the
  adapters initialised at ``B = 0`` the policy starts equal to its reference.

``ModelConfig`` / ``get_peft_config`` carry TRL's field names (``use_peft``, ``lora_r``, ``lora_alpha``,
``lora_dropout``, ``lora_target_modules``) for configs written as flat fields (a command line, a YAML file).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minigrpo.infra.checks import check_config_types, in_unit_interval, positive


def is_peft_model(model: torch.nn.Module) -> bool:
    """True for a ``peft.PeftModel`` (a model wrapped with adapters)."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def apply_peft(model: torch.nn.Module, peft_config) -> torch.nn.Module:
    """``peft.get_peft_model(model, peft_config)``: the base weights frozen, the adapters trainable."""
    from peft import PeftConfig, get_peft_model

    if is_peft_model(model):
        raise ValueError("the model already has adapters (a PeftModel): pass peft_config=None to train them, "
                         "or pass the base model with peft_config")
    if not isinstance(peft_config, PeftConfig):
        raise TypeError(f"peft_config must be a peft config such as peft.LoraConfig, got {type(peft_config).__name__}")
    return get_peft_model(model, peft_config)


@dataclass
class ModelConfig:
    """The LoRA fields of TRL's ``ModelConfig`` (same names and meanings)."""

    use_peft: bool = False  #: train LoRA adapters instead of every weight
    lora_r: int = 16  #: rank r of each adapter
    lora_alpha: int = 32  #: scale α: the update is (α / r)·B·A
    lora_dropout: float = 0.05  #: dropout on the adapters' input
    #: which modules get adapters: names (e.g. ["q_proj", "v_proj"]), "all-linear", or None (peft's default per model)
    lora_target_modules: list[str] | str | None = None

    def __post_init__(self):
        check_config_types(self)
        positive(self, "lora_r", "lora_alpha")
        in_unit_interval(self, "lora_dropout")


def get_peft_config(model_args: ModelConfig):
    """A ``peft.LoraConfig`` for a causal LM from ``model_args``, or None when ``use_peft`` is False (TRL's name)."""
    if not model_args.use_peft:
        return None
    from peft import LoraConfig

    return LoraConfig(r=model_args.lora_r, lora_alpha=model_args.lora_alpha, lora_dropout=model_args.lora_dropout,
                      target_modules=model_args.lora_target_modules, task_type="CAUSAL_LM")


__all__ = ["ModelConfig", "apply_peft", "get_peft_config", "is_peft_model"]
