"""Lesson 07, beyond the per-token cap: importance sampling at the level of sequences, and three more causes of a
sampler/trainer mismatch that the tiny model of the ratio study cannot show.

- :func:`sequence_is_bias`: exact expectations on a small sequence model (every sequence enumerated, no sampling
  noise): the gradient of the expected reward under the trainer's policy, against the estimates made from
  sequences drawn by a mismatched sampler with per-token TIS, sequence-level IS (summed or mean log-ratio,
  truncated or masked outside a band) or no correction.
- :func:`retokenisation_demo`: a completion decoded to text and encoded again is not always the token sequence
  that was sampled, so its log-probs are those of another event.
- :func:`moe_routing_flips`: a top-k router whose input differs by bf16 rounding picks other experts for some
  tokens: a discrete jump in the computed function, not a small numeric difference.
"""

from __future__ import annotations

import itertools

import torch

from minigrpo.losses import sequence_importance_weights, truncated_importance_weights

#: estimator → how the weights of a sequence's tokens are made (see :func:`sequence_is_bias`)
ESTIMATORS = ("no correction", "token TIS", "sequence IS (sum)", "sequence TIS (sum)", "sequence IS (mean)",
              "masked sequence IS (sum)")


def _weights(name: str, lp: torch.Tensor, lmu: torch.Tensor, clip_max: float, band: tuple[float, float]):
    """``[N, L]`` weights of each sequence's tokens, from the trainer's and the sampler's token log-probs."""
    mask = torch.ones_like(lp)
    if name == "no correction":
        return torch.ones_like(lp)
    if name == "token TIS":
        return truncated_importance_weights(lp, lmu, clip_max)[0]
    level = "mean" if "mean" in name else "sum"
    kw = {"clip_max": clip_max} if name.startswith("sequence TIS") else {}
    if name.startswith("masked"):
        kw = {"band": band}
    w, _ = sequence_importance_weights(lp, lmu, mask, level, **kw)
    return w[:, None].expand_as(lp)


def sequence_is_bias(vocab: int = 6, length: int = 4, taus=(1.0, 0.9, 0.8, 0.7, 0.5), clip_max: float = 3.0,
                     band: tuple[float, float] = (0.5, 2.0), seed: int = 0) -> list[dict]:
    """Exact gradient errors of each of :data:`ESTIMATORS` on a sequence model.

    The trainer's policy draws each of ``length`` tokens from its own softmax ``p_t = softmax(z_t)`` (``vocab``
    outcomes); the sampler draws from ``μ_t = softmax(z_t / τ)``; each of the ``vocab ** length`` sequences has a
    fixed random reward. The target is ``∇_z E_p[R]`` (baseline ``E_p[R]``); each estimator is
    ``E_μ[Σ_t W_t (R − b) ∇ log p_t(o_t)]`` with its weights ``W``, computed exactly by enumeration. Returns one
    row per (τ, estimator): relative error, cosine with the true gradient, ``E_μ[W²]`` over tokens (the weights'
    second moment: 1 is no extra variance) and the share of sequences a band masks out."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(length, vocab, generator=g, dtype=torch.float64) * 1.5
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=length)))  # [N, L]
    reward = torch.rand(len(seqs), generator=g, dtype=torch.float64)
    rows = []
    for tau in taus:
        lmu = torch.log_softmax(z / tau, -1).gather(-1, seqs.T).T  # [N, L]
        mu_seq = lmu.sum(-1).exp()
        grads = {}
        for name in ("true", *ESTIMATORS):
            zz = z.clone().requires_grad_(True)
            lp = torch.log_softmax(zz, -1).gather(-1, seqs.T).T
            p_seq = lp.detach().sum(-1).exp()
            adv = reward - (p_seq * reward).sum()
            if name == "true":
                surrogate = (p_seq * adv * lp.sum(-1)).sum()
                weights = None
            else:
                weights = _weights(name, lp.detach(), lmu, clip_max, band)
                surrogate = (mu_seq[:, None] * weights * adv[:, None] * lp).sum()
            surrogate.backward()
            grads[name] = (zz.grad.reshape(-1), weights)
        true = grads["true"][0]
        for name in ESTIMATORS:
            est, w = grads[name]
            rows.append({"tau": tau, "estimator": name, "rel_error": ((est - true).norm() / true.norm()).item(),
                         "cos": torch.nn.functional.cosine_similarity(est, true, 0).item(),
                         "second_moment": (mu_seq[:, None] * w**2).sum(0).mean().item(),
                         "masked": (mu_seq * (w[:, 0] == 0)).sum().item()})
    return rows


def retokenisation_demo(text: str = "12+34=46", sampled: tuple[str, ...] = ("1", "2", "+", "3", "4", "=", "4", "6")):
    """``(sampled ids, re-encoded ids, tokenizer)`` with a small BPE tokenizer trained here (merges such as ``"12"``):
    the sampler emitted ``sampled`` piece by piece; the trainer receives the text and encodes it again."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("=", "isolated")
    corpus = ["12+34=46", "12+12=24", "34+12=46", "46+12=58"] * 50
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=40, special_tokens=["?"], show_progress=False))
    ids = [tok.token_to_id(s) for s in sampled]
    if "".join(sampled) != text or any(i is None for i in ids):
        raise ValueError("retokenisation_demo: the sampled pieces must be single tokens that spell the text")
    return ids, tok.encode(text).ids, tok


def moe_routing_flips(tokens: int = 4096, hidden: int = 64, experts: int = 8, top_k: int = 2, seed: int = 0):
    """A toy MoE layer (router + ``experts`` linear experts, top-``top_k``) run on the same tokens in fp32 and with
    the input rounded to bf16: the share of tokens whose expert set changes, and the largest output change with and
    without a change of route (relative to the output's norm)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    router = torch.randn(hidden, experts, generator=g) / hidden**0.5
    w_exp = torch.randn(experts, hidden, hidden, generator=g) / hidden**0.5

    def layer(inp):
        logits = inp @ router
        top = logits.topk(top_k, -1)
        gates = torch.softmax(top.values, -1)
        every = torch.einsum("nh,ehd->ned", inp, w_exp)  # [N, E, d]: each expert's output (dense, for a toy)
        chosen = every.gather(1, top.indices[..., None].expand(-1, -1, every.shape[-1]))  # [N, k, d]
        out = (gates[..., None] * chosen).sum(1)
        return out, top.indices.sort(-1).values

    out32, route32 = layer(x)
    out16, route16 = layer(x.to(torch.bfloat16).float())
    flipped = (route32 != route16).any(-1)
    rel = (out16 - out32).norm(dim=-1) / out32.norm(dim=-1)
    return {"flipped": flipped.float().mean().item(),
            "rel_change_same_route": rel[~flipped].max().item() if (~flipped).any() else 0.0,
            "rel_change_flipped": rel[flipped].max().item() if flipped.any() else 0.0}


__all__ = ["ESTIMATORS", "moe_routing_flips", "retokenisation_demo", "sequence_is_bias"]
