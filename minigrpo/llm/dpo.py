"""Direct Preference Optimization (Rafailov et al. 2023): learning from preference pairs without a reward function.

Given a prompt x, a preferred completion y_w ("chosen") and a dispreferred one y_l ("rejected"), DPO minimises

    −log σ( β · [ (log π_θ(y_w|x) − log π_ref(y_w|x)) − (log π_θ(y_l|x) − log π_ref(y_l|x)) ] )

(TRL's ``loss_type="sigmoid"``). It is the Bradley–Terry likelihood of the pair under the *implicit reward*
``r̂(x, y) = β · log π_θ(y|x) / π_ref(y|x)``: the reward for which the KL-regularised RL optimum (maximise
E[r] − β · KL(π‖π_ref)) is π_θ. Log-probs are of whole completions: the sum over their tokens.

Names follow TRL's ``DPOTrainer``: the four log-prob arguments, ``beta``, and the logged metrics
``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``, ``logps/chosen``,
``logps/rejected``. (TRL 1.16 computes its loss inside ``DPOTrainer._compute_loss``, a method that runs the
model; it exposes no pure loss function to compare with, so the tests check a hand-computed value and autograd.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from minigrpo.infra.checks import check_finite
from minigrpo.infra.divergence import (check_weights_before_training, stop_if_not_finite,
                                       stop_if_weights_diverged)
from minigrpo.llm.sampling import completion_mask, sequence_logprobs
from minigrpo.utils import float32_masters

_NAMES = ("policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps")


def _check_logps(tensors: tuple) -> None:
    for name, t in zip(_NAMES, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"dpo_loss: {name} must be a torch tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"dpo_loss: {name} must be a floating tensor of log-probs, got {t.dtype}")
        if t.ndim != 1 or t.numel() == 0:
            raise ValueError(f"dpo_loss: {name} must be 1-D [num_pairs] and non-empty (one summed log-prob per "
                             f"completion), got shape {tuple(t.shape)}")
        if t.shape != tensors[0].shape:
            raise ValueError(f"dpo_loss: {name} has shape {tuple(t.shape)} but {_NAMES[0]} has "
                             f"{tuple(tensors[0].shape)}: one value per pair in each")
        check_finite(t.detach(), f"dpo_loss: {name}")
        if (t.detach() > 1e-6).any():
            raise ValueError(f"dpo_loss: {name} has a positive entry ({t.detach().max().item():.3g}); log-probs are ≤ 0")


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor,
             ref_rejected_logps: torch.Tensor, beta: float = 0.1) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO's sigmoid loss, averaged over pairs, and the metrics TRL logs.

    Each argument is ``[num_pairs]``: a completion's summed log-prob under the policy (with gradient) or the frozen
    reference. ``beta`` sets how far from the reference the implicit reward lets the policy go (TRL default 0.1).
    Returns ``(loss, metrics)``; the metrics are batch means of the implicit rewards ``β · (log π_θ − log π_ref)``
    of the chosen and rejected completions, their margin, the share of pairs whose chosen reward is higher, and
    the policy's mean log-probs.
    """
    _check_logps((policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps))
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"dpo_loss: beta must be a finite number > 0, got {beta!r}")
    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    loss = -F.logsigmoid(beta * (chosen_logratios - rejected_logratios)).mean()
    chosen_rewards, rejected_rewards = beta * chosen_logratios.detach(), beta * rejected_logratios.detach()
    metrics = {"rewards/chosen": chosen_rewards.mean().item(), "rewards/rejected": rejected_rewards.mean().item(),
               "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
               "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
               "logps/chosen": policy_chosen_logps.detach().mean().item(),
               "logps/rejected": policy_rejected_logps.detach().mean().item()}
    return loss, metrics


def completion_logps(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                     eos_id: int, temperature: float = 1.0) -> torch.Tensor:
    """``[B]``: each completion's summed log-prob under ``model``, over its tokens up to and including the first
    ``eos_id`` (the same mask as GRPO's, lesson 06 section 6). Left-padded prompts, as ``sampling.generate`` makes."""
    logp = sequence_logprobs(model, prompt_ids, prompt_mask, completion_ids, temperature, shared_prefix=False)
    return (logp * completion_mask(completion_ids, eos_id)).sum(-1)


@dataclass
class PairBatch:
    """One step's preference pairs: left-padded prompts, chosen / rejected completion ids (``[n, ·]``)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    chosen_ids: torch.Tensor
    rejected_ids: torch.Tensor
    chosen_reward: torch.Tensor  #: the task's reward of each chosen completion (DPO never sees it)
    rejected_reward: torch.Tensor


def pair_logps(model, batch: PairBatch, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen and the rejected completions' summed log-probs ``([n], [n])``, one forward pass."""
    ids = torch.cat([batch.prompt_ids, batch.prompt_ids])
    mask = torch.cat([batch.prompt_mask, batch.prompt_mask])
    logps = completion_logps(model, ids, mask, torch.cat([batch.chosen_ids, batch.rejected_ids]), eos_id)
    return logps.chunk(2)


def train_dpo(model, ref_model, tokenizer, batches: list[PairBatch], beta: float = 0.1,
              learning_rate: float = 3e-4, max_grad_norm: float = 1.0) -> dict[str, np.ndarray]:
    """One DPO optimizer step (AdamW, global-norm clip) per batch of pairs, in order; ``model`` is
    trained in place (float32 master weights, whatever dtype it arrived in). Returns the per-step
    history: the loss and TRL's ``rewards/*`` and ``logps/*`` metrics."""
    float32_masters(model)  # AdamW steps float32 weights, even from a bf16 checkpoint
    check_weights_before_training(model, "DPO")
    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    eos = tokenizer.eos_token_id
    history: dict[str, list] = {}
    for step, batch in enumerate(batches, 1):
        if batch.chosen_ids.shape[0] == 0:
            continue
        with torch.no_grad():
            ref_chosen, ref_rejected = pair_logps(ref_model, batch, eos)  # (n,) each
        model.train()
        chosen, rejected = pair_logps(model, batch, eos)  # (n,) each, with gradient
        stop_if_not_finite(float(torch.cat([chosen, rejected]).detach().sum()), "DPO", step,
                           "the policy's log-probs", learning_rate)
        loss, metrics = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm).item()
        stop_if_not_finite(grad_norm, "DPO", step, "the gradient norm", learning_rate)  # weights intact
        opt.step()
        stop_if_weights_diverged(model, "DPO", step, learning_rate)
        for k, v in {"loss": loss.item(), "pairs": float(batch.chosen_ids.shape[0]), **metrics}.items():
            history.setdefault(k, []).append(v)
    model.eval()
    return {k: np.asarray(v, dtype=float) for k, v in history.items()}


__all__ = ["PairBatch", "completion_logps", "dpo_loss", "pair_logps", "train_dpo"]
