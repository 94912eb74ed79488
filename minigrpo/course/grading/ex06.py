"""Exercise 06 — GRPO for an LLM: the completion tokens' log-probs, and the GRPO loss."""

from __future__ import annotations


import torch

from minigrpo.course.grading.core import Case, Item, WrongAnswer, checked_by

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


def _gather(logp_all, input_ids, P):
    return logp_all.gather(-1, input_ids[:, P:].unsqueeze(-1)).squeeze(-1)


def _ctl_off_by_one(logits, input_ids, mask, P, temperature=1.0):
    logp_all = torch.log_softmax(logits[:, P:] / temperature, dim=-1)
    return _gather(logp_all, input_ids, P) * mask


def _ctl_no_temperature(logits, input_ids, mask, P, temperature=1.0):
    logp_all = torch.log_softmax(logits[:, P - 1:-1], dim=-1)
    return _gather(logp_all, input_ids, P) * mask


def _ctl_temperature_after(logits, input_ids, mask, P, temperature=1.0):
    logp_all = torch.log_softmax(logits[:, P - 1:-1], dim=-1) / temperature
    return _gather(logp_all, input_ids, P) * mask


def _ctl_no_mask(logits, input_ids, mask, P, temperature=1.0):
    logp_all = torch.log_softmax(logits[:, P - 1:-1] / temperature, dim=-1)
    return _gather(logp_all, input_ids, P)


def _ctl_softmax(logits, input_ids, mask, P, temperature=1.0):
    probs = torch.softmax(logits[:, P - 1:-1] / temperature, dim=-1)
    return _gather(probs, input_ids, P) * mask


def _batch(seed, B=2, P=3, C=4, V=6, lengths=None):
    """Random float64 logits [B, P + C, V], token ids, and a completion mask (row i keeps lengths[i] tokens)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, P + C, V, generator=g, dtype=torch.float64) * 2.0
    ids = torch.randint(0, V, (B, P + C), generator=g)
    lengths = lengths if lengths is not None else [C] * B
    mask = (torch.arange(C)[None, :] < torch.tensor(lengths)[:, None]).long()
    return logits, ids, mask


def _ctl_case(seed, P, C, lengths=None, temperature=None, B=2, V=6):
    def run(f):
        logits, ids, mask = _batch(seed, B, P, C, V, lengths)
        return f(logits, ids, mask, P) if temperature is None else f(logits, ids, mask, P, temperature=temperature)
    return run


def _ctl_bad_mask(f):
    logits, ids, mask = _batch(0, 2, 3, 4)
    return f(logits, ids, torch.ones(2, 5, dtype=torch.long), 3)


CTL_CASES = [
    Case("alignment: every completion token kept, temperature 1",
         "logits [2, 7, 6] (random float64, seed 0), input_ids [2, 7], prompt_len=3, completion_mask all ones [2, 4]",
         _ctl_case(0, 3, 4)),
    Case("temperature 0.7", "logits [2, 7, 6] (seed 1), prompt_len=3, completion_mask all ones, temperature=0.7",
         _ctl_case(1, 3, 4, temperature=0.7)),
    Case("masked positions (after the EOS) are 0",
         "logits [2, 7, 6] (seed 2), prompt_len=3, completion lengths 2 and 4 (mask [[1,1,0,0],[1,1,1,1]])",
         _ctl_case(2, 3, 4, lengths=[2, 4])),
    Case("temperature 1.5 and a mask", "logits [3, 9, 6] (seed 3), prompt_len=4, lengths 1, 5, 3, temperature=1.5",
         _ctl_case(3, 4, 5, lengths=[1, 5, 3], temperature=1.5, B=3)),
    Case("a mask of the wrong shape is refused with a ValueError",
         "logits [2, 7, 6], input_ids [2, 7], prompt_len=3, completion_mask [2, 5] (should be [2, 4])",
         _ctl_bad_mask,
         hint="raise ValueError when completion_mask is not [B, T − prompt_len] (or logits and input_ids disagree): "
              "a silent broadcast would score the wrong tokens."),
    Case("prompt_len=1 (only <bos> before the completion)", "logits [4, 8, 11] (seed 4), prompt_len=1, lengths 7, 2, 5, 1",
         _ctl_case(4, 1, 7, lengths=[7, 2, 5, 1], B=4, V=11), quick=False, rtol=1e-9, atol=1e-12),
    Case("a larger batch, temperature 0.6", "logits [6, 16, 20] (seed 5), prompt_len=6, random lengths, temperature=0.6",
         _ctl_case(5, 6, 10, lengths=[10, 3, 7, 1, 9, 5], temperature=0.6, B=6, V=20),
         quick=False, rtol=1e-9, atol=1e-12),
]

COMPLETION_TOKEN_LOGPROBS = Item(
    exercise="06", number=1, function="completion_token_logprobs", title="log-probs of the completion tokens",
    reference=completion_token_logprobs, cases=CTL_CASES,
    wrong_answers=[
        WrongAnswer("off by one", checked_by(completion_token_logprobs, _ctl_off_by_one),
                    "off by one: the logits at position t predict token t + 1, so completion token P + j is scored by "
                    "logits[:, P − 1 + j] — take logits[:, P − 1 : T − 1], not logits[:, P:]."),
        WrongAnswer("temperature forgotten", checked_by(completion_token_logprobs, _ctl_no_temperature),
                    "divide the logits by the temperature before the log-softmax: the sampler drew from "
                    "softmax(logits / T), so that is the distribution whose log-probs you need."),
        WrongAnswer("temperature after log_softmax", checked_by(completion_token_logprobs, _ctl_temperature_after),
                    "you divided the log-probs by T; the temperature scales the logits *before* normalising: "
                    "log_softmax(logits / T). log_softmax(logits) / T is not a log-distribution."),
        WrongAnswer("mask not applied", checked_by(completion_token_logprobs, _ctl_no_mask),
                    "set the masked positions (tokens after the first EOS, which were never sampled) to 0: "
                    "multiply by completion_mask, or use torch.where."),
        WrongAnswer("softmax", checked_by(completion_token_logprobs, _ctl_softmax),
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


def _terms(logp, old_logp, advantages, epsilon):
    ratio = torch.exp(logp - old_logp.detach())
    a = advantages.detach().unsqueeze(-1)
    return ratio, a, torch.min(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a)


def _token_mean(x, mask):
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum()


def _gl_k1(logp, old_logp, ref_logp, advantages, mask, epsilon=0.2, beta=0.04):
    _, _, s = _terms(logp, old_logp, advantages, epsilon)
    return _token_mean(-s + beta * (logp - ref_logp), mask)


def _gl_kl_sign(logp, old_logp, ref_logp, advantages, mask, epsilon=0.2, beta=0.04):
    _, _, s = _terms(logp, old_logp, advantages, epsilon)
    return _token_mean(-s + beta * _k3(ref_logp, logp), mask)


def _gl_kl_in_advantage(logp, old_logp, ref_logp, advantages, mask, epsilon=0.2, beta=0.04):
    ratio = torch.exp(logp - old_logp.detach())
    a = advantages.unsqueeze(-1) - beta * _k3(logp, ref_logp).detach()  # the PPO-RLHF way: a penalty in the reward
    s = torch.min(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a)
    return _token_mean(-s, mask)


def _gl_no_mask(logp, old_logp, ref_logp, advantages, mask, epsilon=0.2, beta=0.04):
    _, _, s = _terms(logp, old_logp, advantages, epsilon)
    return (-s + beta * _k3(logp, ref_logp)).mean()


def _gl_seq_mean(logp, old_logp, ref_logp, advantages, mask, epsilon=0.2, beta=0.04):
    _, _, s = _terms(logp, old_logp, advantages, epsilon)
    m = mask.to(logp.dtype)
    per_token = -s + beta * _k3(logp, ref_logp)
    return ((per_token * m).sum(-1) / m.sum(-1)).mean()


def _gl_max(logp, old_logp, ref_logp, advantages, mask, epsilon=0.2, beta=0.04):
    ratio, a, _ = _terms(logp, old_logp, advantages, epsilon)
    s = torch.max(ratio * a, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a)
    return _token_mean(-s + beta * _k3(logp, ref_logp), mask)


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def _loss_and_grad(f, logp, old_logp, ref_logp, advantages, mask, **kwargs):
    """Call f on a fresh leaf ``logp``; return the loss and d loss / d logp."""
    logp = logp.clone().requires_grad_(True)
    loss = f(logp, old_logp, ref_logp, advantages, mask, **kwargs)
    loss.backward()
    grad = logp.grad if logp.grad is not None else torch.zeros_like(logp)
    return {"loss": loss.detach(), "grad": grad}


# A hand-sized batch: 2 completions of lengths 3 and 2 (the third token of row 1 comes after its EOS).
# Ratios ρ = exp(logp − old): row 0 (A = +1): 1.5, 1.0, 0.9; row 1 (A = −1): 0.5, 1.1.
_HAND_OLD = _t([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]])
_HAND_LOGP = _HAND_OLD + torch.log(_t([[1.5, 1.0, 0.9], [0.5, 1.1, 1.0]]))
_HAND_REF = _t([[-1.2, -0.4, -1.5], [-0.9, -1.0, -3.0]])
_HAND_ADV = _t([1.0, -1.0])
_HAND_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def _hand(f, **kw):
    return _loss_and_grad(f, _HAND_LOGP, _HAND_OLD, _HAND_REF, _HAND_ADV, _HAND_MASK, **kw)


def _random_batch(seed, B=6, C=8):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, C, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = old + torch.randn(B, C, generator=g, dtype=torch.float64) * 0.3
    ref = old + torch.randn(B, C, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, C + 1, (B,), generator=g)
    mask = (torch.arange(C)[None, :] < lengths[:, None]).long()
    return logp, old, ref, adv, mask


def _on_policy(f):
    """μ = 1: old_logp is logp itself (detached), so every ratio is exactly 1."""
    logp, _, ref, adv, mask = _random_batch(1, B=4, C=5)
    return _loss_and_grad(f, logp, logp.clone(), ref, adv, mask)


def _all_equal(f):
    logp, old, ref, _, mask = _random_batch(2, B=4, C=5)
    return _loss_and_grad(f, logp, old, ref, torch.zeros(4, dtype=torch.float64), mask)


def _junk_after_eos(f):
    """The masked positions hold values far from the others: they must change neither the loss nor the gradient."""
    logp, old, ref, adv, mask = _random_batch(3, B=4, C=5)
    junk = mask == 0
    logp, old, ref = logp.masked_fill(junk, -0.01), old.masked_fill(junk, -3.0), ref.masked_fill(junk, -4.0)
    return _loss_and_grad(f, logp, old, ref, adv, mask)


GL_CASES = [
    Case("a hand-sized batch: ratios 1.5, 1.0, 0.9 (A = +1) and 0.5, 1.1 (A = −1), lengths 3 and 2",
         "logp = old + log ρ with ρ = [[1.5, 1.0, 0.9], [0.5, 1.1, ·]], old = [[-1, -0.5, -2], [-0.3, -1.2, -0.7]], "
         "ref = [[-1.2, -0.4, -1.5], [-0.9, -1.0, -3.0]], advantages = [1, -1], mask = [[1,1,1],[1,1,0]], "
         "epsilon=0.2, beta=0.04; compared: the loss and d loss / d logp",
         _hand),
    Case("μ = 1 (old_logp = logp): ratio 1, gradient = −A/N + β·∇k3",
         "random float64 batch [4, 5] (seed 1), old_logp = logp.detach(); compared: loss and gradient",
         _on_policy),
    Case("every advantage 0 (all-equal groups): only the KL term moves logp",
         "random float64 batch [4, 5] (seed 2), advantages = 0; compared: loss and gradient",
         _all_equal),
    Case("tokens after the EOS (mask 0) change neither the loss nor the gradient",
         "random float64 batch [4, 5] (seed 3) with unusual values at the masked positions",
         _junk_after_eos),
    Case("beta = 0: the clipped surrogate alone", "the hand-sized batch with beta=0",
         lambda f: _hand(f, beta=0.0)),
    Case("epsilon = 0.1, beta = 0.1, a random batch", "random float64 batch [6, 8] (seed 4), epsilon=0.1, beta=0.1",
         lambda f: _loss_and_grad(f, *_random_batch(4), epsilon=0.1, beta=0.1), quick=False, rtol=1e-9, atol=1e-12),
    Case("a larger random batch, defaults", "random float64 batch [16, 12] (seed 5)",
         lambda f: _loss_and_grad(f, *_random_batch(5, B=16, C=12)), quick=False, rtol=1e-9, atol=1e-12),
]

GRPO_LOSS = Item(
    exercise="06", number=2, function="grpo_loss", title="the GRPO loss (clipped ratio + β·k3, token mean)",
    reference=grpo_loss, cases=GL_CASES,
    wrong_answers=[
        WrongAnswer("k1 instead of k3", _gl_k1,
                    "you used the k1 estimator logp − ref_logp; GRPO uses k3 = exp(ref − logp) − 1 − (ref − logp), "
                    "which is ≥ 0 for every token and whose gradient vanishes when logp = ref_logp."),
        WrongAnswer("KL sign", _gl_kl_sign,
                    "k3 is written with log r = ref_logp − logp: k3 = exp(log r) − 1 − log r. You swapped the two "
                    "log-probs (that estimates KL(π_ref ‖ π) from the wrong samples)."),
        WrongAnswer("KL in the advantage", _gl_kl_in_advantage,
                    "you folded the KL into the advantage (PPO-RLHF puts a KL penalty in the reward); GRPO adds "
                    "β·k3 to the per-token loss, outside the clipped min, and the advantage stays the group "
                    "comparison."),
        WrongAnswer("mask ignored", _gl_no_mask,
                    "average over the completion tokens only: Σ mask·loss / Σ mask. Tokens after the EOS were "
                    "never sampled and must not count (nor change the denominator)."),
        WrongAnswer("per-sequence mean", _gl_seq_mean,
                    "that is the per-sequence mean (DeepSeekMath's GRPO: each completion weighs the same); this "
                    "exercise asks for DAPO's token mean: one mean over all unmasked tokens of the batch."),
        WrongAnswer("max instead of min", _gl_max,
                    "take the *min* of ρ·A and clip(ρ)·A (the pessimistic bound, then negate it for the loss); the "
                    "max lets ratios run away exactly where the clip should stop them."),
    ],
)

ITEMS = [COMPLETION_TOKEN_LOGPROBS, GRPO_LOSS]
