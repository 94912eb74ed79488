"""Exercise 06 — GRPO for an LLM: the completion tokens' log-probs, and the GRPO loss."""

from __future__ import annotations

from functools import partial

import torch

from minigrpo_course.grading.core import (Case, Item, Made, Spread, WrongAnswer, checked_by, f64, grads, randn,
                                          with_ratios)

TITLE = "GRPO for an LLM"

# --------------------------------------------------------------------------- 06.1 completion_token_logprobs


def _check_shapes(logits, input_ids, completion_mask, prompt_len):
    if logits.ndim != 3 or input_ids.ndim != 2 or tuple(logits.shape[:2]) != tuple(input_ids.shape):
        raise ValueError(f"expected logits [B, T, V] and input_ids [B, T], got {tuple(logits.shape)} and "
                         f"{tuple(input_ids.shape)}")
    B, T = input_ids.shape
    if not 1 <= prompt_len < T:
        raise ValueError(f"prompt_len must be in [1, T), got {prompt_len} for T={T}")
    if tuple(completion_mask.shape) != (B, T - prompt_len):
        raise ValueError(f"completion_mask must be [B, T - prompt_len] = {(B, T - prompt_len)}, "
                         f"got {tuple(completion_mask.shape)}")


def completion_token_logprobs(logits, input_ids, completion_mask, prompt_len, temperature=1.0):
    """Reference: column j scores input_ids[:, P + j] with log_softmax(logits[:, P − 1 + j] / T); masked → 0."""
    _check_shapes(logits, input_ids, completion_mask, prompt_len)
    P, T = prompt_len, input_ids.shape[1]
    logp_all = torch.log_softmax(logits[:, P - 1:T - 1] / temperature, dim=-1)
    logp = logp_all.gather(-1, input_ids[:, P:].unsqueeze(-1)).squeeze(-1)
    return torch.where(completion_mask.bool(), logp, torch.zeros_like(logp))


def _ctl_variant(logits, input_ids, mask, P, temperature=1.0, *, shift=1, temp="before", masked=True, log=True):
    """Completion log-probs with one thing done wrong (each wrong answer below switches one knob)."""
    scores = logits[:, P - shift:logits.shape[1] - shift] / (temperature if temp == "before" else 1.0)
    out = (torch.log_softmax if log else torch.softmax)(scores, dim=-1) / (temperature if temp == "after" else 1.0)
    out = out.gather(-1, input_ids[:, P:].unsqueeze(-1)).squeeze(-1)
    return out * mask if masked else out


_ctl_mistake = partial(checked_by, completion_token_logprobs)  # refuses what the reference refuses, then errs


def token_batch(seed: int, P: int, C: int, lengths=None, B: int = 2, V: int = 6):
    """Random float64 logits [B, P + C, V], token ids [B, P + C], and a completion mask [B, C] that keeps
    the first lengths[i] tokens of row i (all C by default): a prompt of P tokens, then C completion tokens."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, P + C, V, generator=g, dtype=torch.float64) * 2.0
    ids = torch.randint(0, V, (B, P + C), generator=g)
    lengths = lengths if lengths is not None else [C] * B
    mask = (torch.arange(C)[None, :] < torch.tensor(lengths)[:, None]).long()
    return logits, ids, mask


CTL_CASES = [
    Case("alignment: every completion token kept, temperature 1", (Spread(token_batch, seed=0, P=3, C=4), 3)),
    Case("temperature 0.7", (Spread(token_batch, seed=1, P=3, C=4), 3), {"temperature": 0.7}),
    Case("masked positions (after the EOS) are 0", (Spread(token_batch, seed=2, P=3, C=4, lengths=[2, 4]), 3)),
    Case("temperature 1.5 and a mask", (Spread(token_batch, seed=3, P=4, C=5, lengths=[1, 5, 3], B=3), 4),
         {"temperature": 1.5}),
    Case("a mask of the wrong shape is refused with a ValueError",
         (Made(randn, 2, 7, 6, seed=0), Made(torch.zeros, 2, 7, dtype=torch.long),
          Made(torch.ones, 2, 5, dtype=torch.long), 3),
         hint="raise ValueError when completion_mask is not [B, T − prompt_len] (or logits and input_ids disagree): "
              "a silent broadcast would score the wrong tokens."),
    Case("prompt_len=1 (only <bos> before the completion)",
         (Spread(token_batch, seed=4, P=1, C=7, lengths=[7, 2, 5, 1], B=4, V=11), 1),
         quick=False, rtol=1e-9, atol=1e-12),
    Case("a larger batch, temperature 0.6",
         (Spread(token_batch, seed=5, P=6, C=10, lengths=[10, 3, 7, 1, 9, 5], B=6, V=20), 6),
         {"temperature": 0.6}, quick=False, rtol=1e-9, atol=1e-12),
]

COMPLETION_TOKEN_LOGPROBS = Item(
    exercise="06", number=1, function="completion_token_logprobs", title="log-probs of the completion tokens",
    reference=completion_token_logprobs, cases=CTL_CASES,
    wrong_answers=[
        WrongAnswer("off by one", _ctl_mistake(partial(_ctl_variant, shift=0)),
                    "off by one: the logits at position t predict token t + 1, so completion token P + j is scored by "
                    "logits[:, P − 1 + j] — take logits[:, P − 1 : T − 1], not logits[:, P:]."),
        WrongAnswer("temperature forgotten", _ctl_mistake(partial(_ctl_variant, temp="none")),
                    "divide the logits by the temperature before the log-softmax: the sampler drew from "
                    "softmax(logits / T), so that is the distribution whose log-probs you need."),
        WrongAnswer("temperature after log_softmax", _ctl_mistake(partial(_ctl_variant, temp="after")),
                    "you divided the log-probs by T; the temperature scales the logits *before* normalising: "
                    "log_softmax(logits / T). log_softmax(logits) / T is not a log-distribution."),
        WrongAnswer("mask not applied", _ctl_mistake(partial(_ctl_variant, masked=False)),
                    "set the masked positions (tokens after the first EOS, which were never sampled) to 0: "
                    "multiply by completion_mask, or use torch.where."),
        WrongAnswer("softmax", _ctl_mistake(partial(_ctl_variant, log=False)),
                    "you returned probabilities; return log-probabilities: log_softmax, not softmax (all values "
                    "should be <= 0)."),
    ],
)

# --------------------------------------------------------------------------- 06.2 grpo_loss


def _k3(logp, ref_logp):
    log_r = ref_logp - logp
    return torch.exp(log_r) - 1 - log_r


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, epsilon=0.2, beta=0.04):
    """Reference: per token −min(ρA, clip(ρ, 1 ± ε)A) + β·k3, DAPO token mean over the mask."""
    m = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp.detach())
    a = advantages.detach().unsqueeze(-1)
    surrogate = torch.min(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a)
    per_token = -surrogate + beta * _k3(logp, ref_logp.detach())
    return (per_token * m).sum() / m.sum().clamp(min=1)


def _gl_variant(logp, old_logp, ref_logp, advantages, mask, epsilon=0.2, beta=0.04, *, kl="k3", pick=torch.min,
                mean="token", kl_in_advantage=False, detach=True):
    """The GRPO loss with one thing done wrong (each wrong answer below switches one knob). Its token mean
    divides by mask.sum() unguarded (NaN for an all-masked batch; the reference clamps it to ≥ 1)."""
    if detach:
        old_logp, ref_logp = old_logp.detach(), ref_logp.detach()
    ratio = torch.exp(logp - old_logp)
    a = (advantages.detach() if detach else advantages).unsqueeze(-1)
    kl_term = {"k3": _k3(logp, ref_logp), "k1": logp - ref_logp, "swapped": _k3(ref_logp, logp)}[kl]
    if kl_in_advantage:  # the PPO-RLHF way: a penalty in the reward
        a, kl_term = a - beta * kl_term.detach(), 0.0
    per_token = -pick(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a) + beta * kl_term
    m = mask.to(logp.dtype)
    if mean == "all":
        return per_token.mean()
    if mean == "masked_all":
        return (per_token * m).mean()
    if mean == "guarded":
        return (per_token * m).sum() / m.sum().clamp(min=1)
    return ((per_token * m).sum(-1) / m.sum(-1)).mean() if mean == "sequence" else (per_token * m).sum() / m.sum()


# A hand-sized batch: 2 completions of lengths 3 and 2 (the third token of row 1 comes after its EOS).
# Ratios ρ = exp(logp − old): row 0 (A = +1): 1.5, 1.0, 0.9; row 1 (A = −1): 0.5, 1.1.
_HAND = (Spread(with_ratios, f64([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]), ratios=[[1.5, 1.0, 0.9], [0.5, 1.1, 1.0]]),
         f64([[-1.2, -0.4, -1.5], [-0.9, -1.0, -3.0]]), f64([1.0, -1.0]), torch.tensor([[1, 1, 1], [1, 1, 0]]))


def grpo_batch(seed: int, B: int = 6, C: int = 8, on_policy: bool = False, zero_advantages: bool = False,
               junk_after_eos: bool = False, all_masked: bool = False):
    """Random float64 (logp, old_logp, ref_logp, advantages, mask) for B completions of up to C tokens.
    ``on_policy``: old_logp = logp (every ratio 1); ``zero_advantages``: all-equal groups;
    ``junk_after_eos``: unusual values at the masked positions (they must change nothing)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, C, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = old + torch.randn(B, C, generator=g, dtype=torch.float64) * 0.3
    ref = old + torch.randn(B, C, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, C + 1, (B,), generator=g)
    mask = (torch.arange(C)[None, :] < lengths[:, None]).long()
    if on_policy:
        old = logp.clone()
    if zero_advantages:
        adv = torch.zeros_like(adv)
    if all_masked:  # every completion empty (e.g. a batch cut to zero new tokens): nothing counts
        mask = torch.zeros_like(mask)
    if junk_after_eos:
        junk = mask == 0
        logp, old, ref = logp.masked_fill(junk, -0.01), old.masked_fill(junk, -3.0), ref.masked_fill(junk, -4.0)
    return logp, old, ref, adv, mask


GL_CASES = [
    Case("a hand-sized batch: 2 completions (A = ±1) of lengths 3 and 2", _HAND,
         call=grads("logp")),
    Case("μ = 1 (old_logp = logp): ratio 1, gradient = −A/N + β·∇k3",
         (Spread(grpo_batch, 1, B=4, C=5, on_policy=True),),
         call=grads("logp")),
    Case("every advantage 0 (all-equal groups): only the KL term moves logp",
         (Spread(grpo_batch, 2, B=4, C=5, zero_advantages=True),), call=grads("logp")),
    Case("tokens after the EOS (mask 0) change neither the loss nor the gradient",
         (Spread(grpo_batch, 3, B=4, C=5, junk_after_eos=True),), call=grads("logp")),
    Case("beta = 0: the clipped surrogate alone", _HAND, {"beta": 0.0}, call=grads("logp")),
    Case("epsilon = 0.1, beta = 0.1, a random batch", (Spread(grpo_batch, 4),), {"epsilon": 0.1, "beta": 0.1},
         call=grads("logp"), quick=False, rtol=1e-9, atol=1e-12),
    Case("a larger random batch, defaults", (Spread(grpo_batch, 5, B=16, C=12),), call=grads("logp"), quick=False,
         rtol=1e-9, atol=1e-12),
    Case("old_logp, ref_logp and the advantages carry a graph: no gradient flows into them", _HAND,
         call=grads("old_logp", "ref_logp", "advantages", value=False,
                    requires_grad=("logp", "old_logp", "ref_logp", "advantages")), quick=False,
         hint="detach old_logp, ref_logp and the advantages: they are fixed data of the rollout (old log-probs "
              "computed with a graph, by a forgotten torch.no_grad(), must not be optimised)."),
    Case("an all-masked batch (no completion token counts): loss 0 and no NaN",
         (Spread(grpo_batch, 6, B=3, C=4, all_masked=True),), call=grads("logp"), quick=False,
         hint="guard the denominator: Σ mask·loss / max(Σ mask, 1), so that a batch with no counted token gives 0, "
              "not 0/0 = NaN (which would poison every weight at the next optimizer step)."),
]

GRPO_LOSS = Item(
    exercise="06", number=2, function="grpo_loss", title="the GRPO loss (clipped ratio + β·k3, token mean)",
    reference=grpo_loss, cases=GL_CASES,
    wrong_answers=[
        WrongAnswer("k1 instead of k3", partial(_gl_variant, kl="k1"),
                    "you used the k1 estimator logp − ref_logp; GRPO uses k3 = exp(ref − logp) − 1 − (ref − logp), "
                    "which is ≥ 0 for every token and whose gradient vanishes when logp = ref_logp."),
        WrongAnswer("KL sign", partial(_gl_variant, kl="swapped"),
                    "k3 is written with log r = ref_logp − logp: k3 = exp(log r) − 1 − log r. You swapped the two "
                    "log-probs (that estimates KL(π_ref ‖ π) from the wrong samples)."),
        WrongAnswer("KL in the advantage", partial(_gl_variant, kl_in_advantage=True),
                    "you folded the KL into the advantage (PPO-RLHF puts a KL penalty in the reward); GRPO adds "
                    "β·k3 to the per-token loss, outside the clipped min, and the advantage stays the group "
                    "comparison."),
        WrongAnswer("mask ignored", partial(_gl_variant, mean="all"),
                    "average over the completion tokens only: Σ mask·loss / Σ mask. Tokens after the EOS were "
                    "never sampled and must not count (nor change the denominator)."),
        WrongAnswer("per-sequence mean", partial(_gl_variant, mean="sequence"),
                    "that is the per-sequence mean (DeepSeekMath's GRPO: each completion weighs the same); this "
                    "exercise asks for DAPO's token mean: one mean over all unmasked tokens of the batch."),
        WrongAnswer("masked, then a mean over every position", partial(_gl_variant, mean="masked_all"),
                    "you zeroed the tokens after the EOS but still divided by every position (B·T): divide by the "
                    "number of counted tokens, Σ mask·loss / Σ mask."),
        WrongAnswer("old log-probs not detached", partial(_gl_variant, mean="guarded", detach=False),
                    "gradient flows into old_logp, ref_logp or the advantages: detach them (.detach()); the ratio's "
                    "denominator π_old is a fixed snapshot, not something to optimise.", quick=False),
        WrongAnswer("no guard for an empty mask", partial(_gl_variant),
                    "a batch with no counted token divides 0 by 0: use mask.sum().clamp(min=1) as the denominator.",
                    quick=False),
        WrongAnswer("max instead of min", partial(_gl_variant, pick=torch.max),
                    "take the *min* of ρ·A and clip(ρ)·A (the pessimistic bound, then negate it for the loss); the "
                    "max lets ratios run away exactly where the clip should stop them."),
    ],
)

# --------------------------------------------------------------------------- 06.3 aggregate_loss

LOSS_TYPES = ("grpo", "dapo", "dr_grpo")


def aggregate_loss(per_token, mask, loss_type="dapo", max_completion_length=None):
    """Reference: the per-token losses [B, C] as one number, with TRL's loss_type names.
    "grpo": each completion's masked mean, then the mean over completions (DeepSeekMath);
    "dapo": one mean over every counted token of the batch; "dr_grpo": the masked sum over the constant
    B · max_completion_length (default: C), so no token's weight depends on a length."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if per_token.ndim != 2 or per_token.shape != mask.shape:
        raise ValueError(f"per_token and mask must both be [B, C], got {tuple(per_token.shape)} and "
                         f"{tuple(mask.shape)}")
    m = mask.to(per_token.dtype)
    if loss_type == "grpo":
        return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()
    if loss_type == "dapo":
        return (per_token * m).sum() / m.sum().clamp(min=1)
    length = per_token.shape[1] if max_completion_length is None else max_completion_length
    return (per_token * m).sum() / (per_token.shape[0] * length)


def _agg_variant(per_token, mask, loss_type="dapo", max_completion_length=None, *, swap=False, dr_norm="constant",
                 masked=True, drop_empty=False):
    """aggregate_loss with one mistake per knob, behind the reference's refusals."""
    aggregate_loss(per_token, mask, loss_type, max_completion_length)
    if swap and loss_type != "dr_grpo":
        loss_type = {"grpo": "dapo", "dapo": "grpo"}[loss_type]
    m = mask.to(per_token.dtype)
    x = per_token * m if masked else per_token
    if loss_type == "grpo":
        rows = x.sum(-1) / m.sum(-1).clamp(min=1)
        return rows[m.sum(-1) > 0].mean() if drop_empty else rows.mean()
    if loss_type == "dapo":
        return x.sum() / m.sum().clamp(min=1)
    length = per_token.shape[1] if max_completion_length is None else max_completion_length
    norm = {"constant": per_token.shape[0] * length, "tokens": m.sum().clamp(min=1), "length_only": length,
            "longest": per_token.shape[0] * m.sum(-1).max().clamp(min=1)}[dr_norm]
    return x.sum() / norm


def token_losses(seed: int, lengths, C: int, junk: bool = False):
    """Random float64 per-token losses [B, C] and the mask keeping the first lengths[b] tokens of row b;
    ``junk``: large values after each completion's end (they must count for nothing)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), C, generator=g, dtype=torch.float64)
    mask = (torch.arange(C)[None, :] < torch.tensor(lengths)[:, None]).long()
    return (x.masked_fill(mask == 0, 50.0) if junk else x), mask


#: two completions of lengths 4 and 1 (C = 4): the per-token losses are 1 on the long one, 3 on the short one
_TWO = (f64([[1.0, 1.0, 1.0, 1.0], [3.0, 7.0, 7.0, 7.0]]), torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]]))
_WEIGHTS = grads("per_token")

AGG_CASES = [
    Case("loss_type='dapo': every counted token weighs 1/Σ mask", _TWO, {"loss_type": "dapo"}, call=_WEIGHTS),
    Case("loss_type='grpo': each completion's mean, then the mean over completions", _TWO, {"loss_type": "grpo"},
         call=_WEIGHTS),
    Case("loss_type='dr_grpo': the sum over B · C (C = 4 when max_completion_length is not given)", _TWO,
         {"loss_type": "dr_grpo"}, call=_WEIGHTS),
    Case("loss_type='dr_grpo' with max_completion_length = 16", _TWO, {"loss_type": "dr_grpo",
                                                                      "max_completion_length": 16}, call=_WEIGHTS),
    Case("an unknown loss_type is refused with a ValueError", _TWO, {"loss_type": "bnpo?"},
         hint="raise ValueError unless loss_type is 'grpo', 'dapo' or 'dr_grpo' (a typo must not fall back to one)."),
    Case("a random float64 batch, 'grpo', junk after each EOS",
         (Spread(token_losses, 1, lengths=[5, 1, 8, 3, 8, 2], C=8, junk=True),), {"loss_type": "grpo"},
         call=_WEIGHTS, quick=False, rtol=1e-9, atol=1e-12),
    Case("a random float64 batch, 'dapo', junk after each EOS",
         (Spread(token_losses, 2, lengths=[5, 1, 8, 3, 8, 2], C=8, junk=True),), {"loss_type": "dapo"},
         call=_WEIGHTS, quick=False, rtol=1e-9, atol=1e-12),
    Case("a random float64 batch, 'dr_grpo', max_completion_length = 12 (longer than any completion)",
         (Spread(token_losses, 3, lengths=[5, 1, 8, 3], C=8, junk=True),),
         {"loss_type": "dr_grpo", "max_completion_length": 12}, call=_WEIGHTS, quick=False, rtol=1e-9, atol=1e-12),
    Case("'grpo' with an empty completion: it still counts as one of the B sequences",
         (Spread(token_losses, 4, lengths=[3, 0, 2], C=3),), {"loss_type": "grpo"}, call=_WEIGHTS, quick=False,
         rtol=1e-9, atol=1e-12),
    Case("per_token and mask of different shapes are refused with a ValueError",
         (Made(torch.zeros, 2, 3), Made(torch.ones, 2, 4)), quick=False,
         hint="raise ValueError unless per_token and mask are both [B, C]: a silent broadcast counts the wrong tokens."),
]

AGGREGATE_LOSS = Item(
    exercise="06", number=3, function="aggregate_loss", title="GRPO, DAPO and Dr. GRPO: one number from the tokens",
    reference=aggregate_loss, cases=AGG_CASES,
    wrong_answers=[
        WrongAnswer("grpo and dapo swapped", partial(_agg_variant, swap=True),
                    "'grpo' and 'dapo' are swapped: 'grpo' (DeepSeekMath) averages each completion first and then the "
                    "completions, so a short completion's tokens weigh more; 'dapo' is one mean over every counted "
                    "token of the batch."),
        WrongAnswer("dr_grpo over the counted tokens", partial(_agg_variant, dr_norm="tokens"),
                    "for 'dr_grpo' divide by the constant B · max_completion_length, not by Σ mask: that would be "
                    "'dapo' again, and the point of Dr. GRPO is a normaliser that no length changes."),
        WrongAnswer("dr_grpo over the length only", partial(_agg_variant, dr_norm="length_only"),
                    "'dr_grpo' divides by B · max_completion_length: you left out B, the number of completions, so "
                    "the loss grows with the batch size."),
        WrongAnswer("dr_grpo over the longest completion", partial(_agg_variant, dr_norm="longest"),
                    "the normaliser is the configured max_completion_length (C when not given), not the longest "
                    "completion of this batch: that changes from batch to batch and brings the length bias back."),
        WrongAnswer("mask ignored in the sum", partial(_agg_variant, masked=False),
                    "multiply by the mask before summing: the per-token losses after each EOS are junk (never "
                    "sampled) and must count for nothing."),
        WrongAnswer("empty completions dropped", partial(_agg_variant, drop_empty=True),
                    "for 'grpo' an empty completion is still one of the B sequences (its mean is 0, TRL clamps its "
                    "token count to 1): average over all B rows.", quick=False),
    ],
)

ITEMS = [COMPLETION_TOKEN_LOGPROBS, GRPO_LOSS, AGGREGATE_LOSS]
