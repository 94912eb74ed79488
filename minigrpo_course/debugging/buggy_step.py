"""TEACHING COPY WITH PLANTED BUGS. NEVER IMPORTED BY THE REAL TRAINER (minigrpo.llm.grpo).

A small GRPO step for lesson 07 and exercise 07, on the same objective as the trainers
(``losses.grpo_loss``, DAPO's token mean over one batch: ``loss_type="bnpo"``). Every classic bug of a GRPO loop is
planted here behind a switch: ``buggy_grpo_step(..., bugs={"eos_masked"})`` runs the step with that
one bug, ``bugs=()`` runs it correctly. The step records what a debugger wants to look at (log-probs,
ratios, KL, advantages, the gradient) in a :class:`StepRecord`, so that the detections of
:mod:`minigrpo_course.debugging.detections` can test one invariant each.

Layout: ``ids = [prompt (left-padded, P columns) | completion (C columns)]``; log-probs are computed
for every position, ``[B, T − 1]`` (column t scores token t + 1), and a loss mask ``[B, T − 1]``
says which of them count. The completion's columns are ``P − 1 .. T − 2``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from minigrpo.advantages import group_advantages
from minigrpo.llm.sampling import Generation, generate, position_ids_from_mask
from minigrpo.losses import grpo_loss, kl_estimate, token_logprobs

#: The planted bugs, each switchable on its own, and what goes wrong.
BUGS: dict[str, str] = {
    "logprob_off_by_one": "each token is scored by the logits at its own position instead of the previous one",
    "prompt_in_loss": "the prompt's tokens are counted in the loss (and the KL and log-prob sums)",
    "pad_in_loss": "the padding after the first EOS is counted in the loss",
    "eos_masked": "the mask is `ids != pad_id`; with pad == eos it drops the EOS the model must learn to emit",
    "batch_norm_adv": "advantages normalised with the mean and std of the whole batch, not of each group",
    "no_eps": "advantages divided by the group std with no epsilon and no all-equal guard (NaN on a flat group)",
    "adv_not_detached": "the KL-shaped reward (hence the advantage) is computed from the current log-probs with "
                        "their gradient: gradients flow into the advantage",
    "adv_from_current_policy": "the advantage is recomputed from the current policy at every inner step instead "
                               "of once from the rollout's",
    "old_logp_after_step": "the old log-probs are refreshed after each optimizer step: the ratio is 1 at every "
                           "inner step, so the clip never acts",
    "no_temperature_rescoring": "the loss's forward pass forgets the sampling temperature (the old and reference "
                                "log-probs use it)",
    "ref_no_temperature": "the reference model is scored without the sampling temperature",
}


#: Bugs the shared objective cannot express (it detaches the advantages and refuses NaN ones): with one of them on,
#: the step computes the loss with :func:`planted_loss`, a local copy of the objective that lets them through.
OBJECTIVE_BUGS = frozenset({"adv_not_detached", "no_eps"})


def check_bugs(bugs: Iterable[str] | None) -> frozenset[str]:
    """``bugs`` as a frozenset, refusing unknown names (a typo must not silently mean 'no bug')."""
    bugs = frozenset(bugs or ())
    unknown = bugs - set(BUGS)
    if unknown:
        raise ValueError(f"unknown bug(s) {sorted(unknown)}; known: {sorted(BUGS)}")
    return bugs


@dataclass
class RolloutBatch:
    """G completions per prompt (rows grouped by prompt), one scalar reward per completion."""

    gen: Generation
    rewards: torch.Tensor  #: [B]
    group_size: int
    temperature: float  #: the temperature the completions were sampled at
    pad_token_id: int


def make_batch(model, tokenizer, prompts: list[str], group_size: int = 4, max_new_tokens: int = 6,
               temperature: float = 0.7, rewards: torch.Tensor | None = None, seed: int = 0,
               top_k: int = 0, top_p: float = 1.0) -> RolloutBatch:
    """Sample a batch with the KV-cached sampler; ``rewards`` default to seeded random values (a spread in
    every group), since most detections need advantages, not a task."""
    gen = generate(model, tokenizer, prompts, group_size, max_new_tokens, temperature, top_k=top_k, top_p=top_p,
                   generator=torch.Generator().manual_seed(seed))
    if rewards is None:
        rewards = torch.randn(len(prompts) * group_size, generator=torch.Generator().manual_seed(seed + 1))
    return RolloutBatch(gen, torch.as_tensor(rewards, dtype=torch.float32, device=gen.completion_ids.device),
                        group_size, temperature, tokenizer.pad_token_id)


@dataclass
class StepConfig:
    num_iterations: int = 1  #: μ, optimizer steps on the batch
    epsilon: float = 0.2  #: clip range
    beta: float = 0.0  #: weight of the k3 KL to the reference in the loss
    kl_in_reward: float = 0.0  #: weight of a KL penalty folded into each completion's reward instead
    eps: float = 1e-4  #: added to the group std


@dataclass
class StepRecord:
    """What one call saw. Per inner step: ``loss``, ``ratio``, ``old_logp``, ``advantages``; ``[B, C]`` tensors
    cover the completion's columns. ``advantages`` are kept as used (a tensor that requires grad, if it did)."""

    loss: list[float] = field(default_factory=list)
    ratio: list[torch.Tensor] = field(default_factory=list)
    old_logp: list[torch.Tensor] = field(default_factory=list)
    advantages: list[torch.Tensor] = field(default_factory=list)
    logp: torch.Tensor | None = None  #: [B, C] the loss's log-probs at the first inner step (detached)
    kl: torch.Tensor | None = None  #: [B, C] per-token k3 to the reference at the first inner step
    loss_mask: torch.Tensor | None = None  #: [B, T − 1] the tokens that counted
    grad: torch.Tensor | None = None  #: the flat gradient of the first inner step's loss

    def add(self, inner_step: int, first_col: int, model, loss, logp, kl, ratio, old_logp, advantages) -> None:
        """Record inner step ``inner_step`` after its backward pass, keeping the columns from ``first_col`` on (the
        completion's); the first inner step also keeps its log-probs, KL and flat gradient."""
        if inner_step == 0:
            self.logp, self.kl = logp.detach()[:, first_col:], kl.detach()[:, first_col:]
            self.grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).clone()
        self.loss.append(loss.item())
        self.ratio.append(ratio.detach()[:, first_col:])
        self.old_logp.append(old_logp[:, first_col:])
        self.advantages.append(advantages)


def buggy_grpo_step(model, ref_model, batch: RolloutBatch, optimizer, cfg: StepConfig | None = None,
                    bugs: Iterable[str] = ()) -> StepRecord:
    """One GRPO update (μ inner optimizer steps) on ``batch``, with the ``bugs`` of :data:`BUGS` switched on."""
    cfg, bugs, rec = cfg or StepConfig(), check_bugs(bugs), StepRecord()
    gen, G, T = batch.gen, batch.group_size, batch.temperature
    ids, attn = gen.sequences, gen.attention_mask
    P = gen.prompt_ids.shape[1]
    if (cfg.beta or cfg.kl_in_reward) and ref_model is None:
        raise ValueError("beta > 0 or kl_in_reward > 0 needs a reference model")

    def score(m, temperature):  # [B, T - 1]: column t is the log-prob of token t + 1
        logits = m(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits
        if "logprob_off_by_one" in bugs:  # logits at t score token t: one position late
            lp = torch.log_softmax(logits[:, 1:].float() / temperature, -1)
            return lp.gather(-1, ids[:, 1:, None]).squeeze(-1)
        return token_logprobs(logits, ids, temperature)

    # which tokens count: the completion up to and including its first EOS, nothing of the prompt
    comp = gen.completion_mask
    if "eos_masked" in bugs:
        comp = (gen.completion_ids != batch.pad_token_id).long()
    if "pad_in_loss" in bugs:
        comp = torch.ones_like(comp)
    prompt_part = gen.prompt_mask[:, 1:] if "prompt_in_loss" in bugs else torch.zeros_like(gen.prompt_mask[:, 1:])
    mask = torch.cat([prompt_part, comp], 1).float()
    rec.loss_mask = mask

    with torch.no_grad():
        old = score(model, T)  # π_old: the policy that sampled the batch, before any update
        ref = score(ref_model, 1.0 if "ref_no_temperature" in bugs else T) if ref_model is not None else None

    def advantages(policy_logp):
        r = batch.rewards
        if cfg.kl_in_reward:  # PPO-RLHF style: the KL to the reference as a penalty in each reward
            r = r - cfg.kl_in_reward * ((policy_logp - ref) * mask).sum(-1)
        if "batch_norm_adv" in bugs:
            return (r - r.mean()) / (r.std() + cfg.eps)
        if "no_eps" in bugs:
            g = r.view(-1, G)
            return ((g - g.mean(1, keepdim=True)) / g.std(1, keepdim=True)).reshape(-1)
        return group_advantages(r, G, "group", cfg.eps)

    adv = advantages(old)  # once, from the rollout's log-probs (no gradient)
    for it in range(cfg.num_iterations):
        logp = score(model, 1.0 if "no_temperature_rescoring" in bugs else T)
        if "adv_not_detached" in bugs:
            a = advantages(logp)
        elif "adv_from_current_policy" in bugs:
            a = advantages(logp.detach())
        else:
            a = adv
        if bugs & OBJECTIVE_BUGS:
            loss = planted_loss(logp, old, a, mask, ref, cfg)
        else:  # the objective of the trainers: one mean over the counted tokens
            loss, _ = grpo_loss(logp, old, a, mask, "bnpo", cfg.epsilon, ref_logp=ref if cfg.beta else None,
                                beta=cfg.beta)
        with torch.no_grad():
            ratio = torch.exp(logp - old)
            kl = kl_estimate(logp, ref, "k3") if ref is not None else torch.zeros_like(logp)
        optimizer.zero_grad()
        loss.backward()
        rec.add(it, P - 1, model, loss, logp, kl, ratio, old, a)
        optimizer.step()
        if "old_logp_after_step" in bugs:
            with torch.no_grad():
                old = score(model, T)
    return rec


def planted_loss(logp, old, advantages, mask, ref, cfg: StepConfig) -> torch.Tensor:
    """The objective of :func:`~minigrpo.losses.grpo_loss` (``"bnpo"``, k3) written out, *without* its guards: the
    advantages are neither detached nor checked, so the planted bugs of :data:`OBJECTIVE_BUGS` take effect."""
    ratio = torch.exp(logp - old)
    a_tok = advantages.unsqueeze(-1)
    per_tok = -torch.min(ratio * a_tok, torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.epsilon) * a_tok)
    if cfg.beta:
        per_tok = per_tok + cfg.beta * kl_estimate(logp, ref, "k3")
    return (per_tok * mask).sum() / mask.sum().clamp(min=1)


__all__ = ["BUGS", "OBJECTIVE_BUGS", "RolloutBatch", "StepConfig", "StepRecord", "buggy_grpo_step", "check_bugs",
           "make_batch", "planted_loss"]
