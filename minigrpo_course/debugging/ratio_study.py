"""Why the ratio of an "on-policy" GRPO loop is not 1: each cause alone, measured.

``log_ratios(model, tokenizer, cause)`` samples a batch, then returns the per-token log-ratio
``log π_new(token) − log π_old(token)`` over the completion tokens, where "old" is the distribution the
loop believes produced the data and "new" is what the trainer computes, with exactly one cause
switched on. The baseline (μ = 1, eval mode, the same transforms, fp32, old and new from the same single
forward pass) gives exactly 0.

Two families (see :data:`CAUSES`):

- **by design**: the policy has moved since it sampled (μ > 1 optimizer steps on a batch, or several
  minibatches). The ratio is the importance weight PPO/GRPO's clip is built for.
- **mismatch**: the sampler and the trainer are not the same distribution even at the same weights
  (dropout left on, sampling transforms not re-applied, bf16, a different forward path, stale sampler
  weights). Nothing in the objective accounts for it; it must be fixed, or corrected by truncated
  importance sampling (``GRPOConfig.vllm_importance_sampling_correction``).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from minigrpo_course.debugging.buggy_step import RolloutBatch, StepConfig, buggy_grpo_step, make_batch
from minigrpo.llm.sampling import Generation, completion_logits, process_logits

#: cause → (family, what is compared, what to check in a real pipeline)
CAUSES: dict[str, tuple[str, str, str]] = {
    "baseline": ("—", "old and new: the same single fp32 forward, eval mode, same temperature",
                 "nothing: this is the invariant (max |log ρ| < 1e-5)"),
    "mu_gt_1": ("by design", "new: after one optimizer step on the batch (the 2nd of μ = 2 iterations)",
                "log the ratio per inner iteration: exactly 1 at the first, spread after"),
    "minibatches": ("by design", "the 2nd minibatch, scored after the optimizer step on the 1st",
                    "ratio per minibatch: 1 on the first, spread on later ones"),
    "dropout": ("mismatch", "new: the training forward with dropout on (p = 0.1); old: eval mode",
                "score the same batch twice in train mode: if the two disagree, dropout is on (call model.eval())"),
    "temperature": ("mismatch", "sampled at T = 0.7; new: rescored at T = 1",
                    "the temperature passed to the scoring function equals the sampler's"),
    "top_k": ("mismatch", "sampled with top-k = 5; new: rescored without the top-k truncation",
              "log π_new < log π_sampler on every token (a truncated distribution has more mass per kept token)"),
    "top_p": ("mismatch", "sampled with top-p = 0.8; new: rescored without the nucleus",
              "as for top-k; compare the sampler's log-probs with the trainer's, token by token"),
    "bf16": ("mismatch", "old: fp32 forward; new: the same weights in bf16",
             "dtype of each path; rescore one batch in fp32 on both sides"),
    "kv_cache_fp32": ("mismatch", "old: KV-cached, left-padded, token-by-token sampler (fp32); new: one forward",
                      "the sampler's recorded log-probs vs one forward, same dtype"),
    "kv_cache_bf16": ("mismatch", "the same two paths, both in bf16",
                      "the sampler's recorded log-probs vs one forward, same dtype"),
    "attn_backend_bf16": ("mismatch", "sampler: fused SDPA attention with a KV cache; trainer: eager attention, one "
                          "forward; both bf16 (two engines, two kernels)",
                          "attention implementation and dtype of each engine; rescore the sampler's batch in fp32"),
    "stale_weights": ("mismatch", "sampler: weights one optimizer step behind the trainer",
                      "weight version of the sampler vs the trainer (checksum or step counter per rollout)"),
}

PROMPTS = ("12+34=", "45+67=", "50+50=", "7+8=", "23+19=", "81+11=", "66+66=", "30+4=")


def score(model, gen: Generation, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``[B, C]`` log-probs of the completion tokens under ``model`` with the sampler's transforms, one forward
    pass in ``model``'s current mode and dtype (the log-softmax in at least fp32)."""
    logits = completion_logits(model, gen.prompt_ids, gen.prompt_mask, gen.completion_ids, shared_prefix=False)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp = torch.log_softmax(process_logits(logits, temperature, top_k, top_p), -1)
    return logp.gather(-1, gen.completion_ids.unsqueeze(-1)).squeeze(-1)


def with_dropout(model, p: float):
    """A copy of ``model`` with dropout ``p`` in its attention (Llama/Qwen2) and in every ``nn.Dropout``."""
    m = copy.deepcopy(model)
    for module in m.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = p
        if isinstance(module, torch.nn.Dropout):
            module.p = p
    return m


def _subset(batch: RolloutBatch, rows: slice) -> RolloutBatch:
    g = batch.gen
    gen = Generation(g.prompt_ids[rows], g.prompt_mask[rows], g.completion_ids[rows], g.completion_mask[rows],
                     g.sampler_logprobs[rows], g.finished[rows])
    return replace(batch, gen=gen, rewards=batch.rewards[rows])


def _updated(model, batch: RolloutBatch, lr: float):
    """A copy of ``model`` after one correct GRPO optimizer step (Adam) on ``batch``."""
    m = copy.deepcopy(model)
    buggy_grpo_step(m, None, batch, torch.optim.Adam(m.parameters(), lr=lr), StepConfig(), bugs=())
    return m.eval()


@torch.no_grad()
def _no_grad_score(*args, **kwargs):
    return score(*args, **kwargs)


def log_ratios(model, tokenizer, cause: str, prompts: tuple[str, ...] = PROMPTS, group_size: int = 8,
               max_new_tokens: int = 6, temperature: float = 0.7, lr: float = 3e-4, seed: int = 0) -> torch.Tensor:
    """Per-token ``log π_new − log π_old`` over the completion tokens (1-D, float64) with one ``cause`` on.

    ``lr`` is the Adam step size of the causes that take an optimizer step (μ > 1, minibatches, stale weights).
    """
    if cause not in CAUSES:
        raise ValueError(f"unknown cause {cause!r}; known: {list(CAUSES)}")
    model = copy.deepcopy(model).eval()
    T, G, prompts = temperature, group_size, list(prompts)
    torch.manual_seed(seed)  # dropout masks

    def batch_from(m, batch_seed=seed, **kw):
        return make_batch(m, tokenizer, prompts, G, max_new_tokens, T, seed=batch_seed, **kw)

    if cause in ("kv_cache_bf16", "bf16", "attn_backend_bf16"):
        low = copy.deepcopy(model).to(torch.bfloat16)
    if cause in ("kv_cache_bf16", "attn_backend_bf16"):  # both sides bf16: only the forward path differs
        b = batch_from(low)
        scorer = low
        if cause == "attn_backend_bf16":
            scorer = copy.deepcopy(low)
            scorer.set_attn_implementation("eager")
        old, new, mask = b.gen.sampler_logprobs, _no_grad_score(scorer, b.gen, T), b.gen.completion_mask
    elif cause == "stale_weights":
        sampler = model  # weights θ_{k−1}
        trainer = _updated(model, batch_from(model, seed + 1), lr)  # θ_k: one step (on the previous batch) ahead
        b = batch_from(sampler)
        old, new, mask = b.gen.sampler_logprobs, _no_grad_score(trainer, b.gen, T), b.gen.completion_mask
    else:
        kw = {"top_k": 5} if cause == "top_k" else {"top_p": 0.8} if cause == "top_p" else {}
        b = batch_from(model, **kw)
        mask = b.gen.completion_mask
        if cause in ("top_k", "top_p", "temperature", "kv_cache_fp32"):
            old = b.gen.sampler_logprobs  # the distribution the tokens were actually drawn from
        else:
            old = _no_grad_score(model, b.gen, T)  # the trainer's π_old: one fp32 forward in eval mode
        if cause == "baseline":
            new = score(model, b.gen, T)  # a second forward, with the graph, as the loss computes it
        elif cause == "mu_gt_1":
            new = _no_grad_score(_updated(model, b, lr), b.gen, T)
        elif cause == "minibatches":
            half = b.gen.completion_ids.shape[0] // 2
            updated = _updated(model, _subset(b, slice(0, half)), lr)
            second = slice(half, None)
            old, mask = old[second], mask[second]
            new = _no_grad_score(updated, _subset(b, second).gen, T)
        elif cause == "dropout":
            new = score(with_dropout(model, 0.1).train(), b.gen, T)
        elif cause == "temperature":
            new = score(model, b.gen, 1.0)
        elif cause in ("top_k", "top_p", "kv_cache_fp32"):
            new = score(model, b.gen, T)
        elif cause == "bf16":
            new = _no_grad_score(low, b.gen, T)
    return (new.detach().double() - old.double())[mask.bool()]


def summarise(log_ratio: torch.Tensor, clip: float = 0.2) -> dict[str, float]:
    """max and mean |log ρ|, and the share of tokens whose ratio is outside [1 − clip, 1 + clip]."""
    r = log_ratio.exp()
    return {"max_abs": log_ratio.abs().max().item(), "mean_abs": log_ratio.abs().mean().item(),
            "outside_clip": ((r < 1 - clip) | (r > 1 + clip)).double().mean().item(), "tokens": log_ratio.numel()}


__all__ = ["CAUSES", "PROMPTS", "log_ratios", "score", "summarise", "with_dropout"]
