"""Lesson 10's experiments: where attention puts its weight, what a fixed-size state can recall, the
memory of every kind of KV cache, and a key-value lookup task for MHA / GQA / MQA.

- ``lookup_weights`` / ``target_weight_sweeps``: the weight softmax and linear attention give the key a
  query asks for, as the query sharpens and as keys are added (section 3).
- ``state_recall``: write n (key, value) pairs, read each back; the exact KV cache against the fixed-size
  states of linear attention, gated, delta-rule and gated delta-rule (section 3).
- ``memory_options``: KV cache / state bytes of a 7B-like model under MHA, GQA, MQA, quantisation, MLA,
  sliding windows, linear and delta-rule layers and hybrids (section 8).
- ``lookup_batch`` / ``LookupModel`` / ``train_lookup``: the multi-query key-value lookup that shows what
  sharing K/V heads costs (section 7).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from minigrpo.attention import (Attention, elu_feature_map, gated_delta_rule, gated_linear_attention,
                                kv_cache_bytes, mla_cache_bytes, recurrent_state_bytes, sliding_window_cache_bytes)

# ---------------------------------------------------------------------------------------------
# Section 3: selectivity and recall


def lookup_weights(n_keys: int, beta: float, d: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention weights ``(softmax, linear)`` over ``n_keys`` random keys of a query that asks for key 0
    with sharpness ``beta`` (the query is ``beta`` times key 0). Linear attention uses elu + 1 features."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(n_keys, d, generator=g, dtype=torch.float64)
    q = beta * keys[0]
    soft = torch.softmax(keys @ q / math.sqrt(d), dim=0)
    sim = elu_feature_map(keys) @ elu_feature_map(q)
    return soft, sim / sim.sum()


def target_weight_sweeps(betas: Sequence[float], ns: Sequence[int], betas_by_n: Sequence[float] = (1.0, 2.0),
                         n_keys: int = 64, seeds: int = 5) -> tuple[np.ndarray, dict[float, np.ndarray]]:
    """The weight on the asked-for key: ``[len(betas), 2]`` (softmax, linear) against sharpness with
    ``n_keys`` keys, and ``{beta: [len(ns), 2]}`` against the number of keys (mean over ``seeds`` seeds)."""
    on_target = np.array([[w[0].item() for w in lookup_weights(n_keys, b)] for b in betas])
    by_n = {b: np.array([[np.mean([lookup_weights(m, b, seed=s)[i][0].item() for s in range(seeds)])
                          for i in (0, 1)] for m in ns]) for b in betas_by_n}
    return on_target, by_n


#: The memories ``state_recall`` compares: name -> how it reads every key back after all writes.
RECALL_METHODS = ("softmax over the KV cache", "linear (additive)", "gated linear (α = 0.95)",
                  "delta rule (β = 1)", "gated delta rule (α = 0.95)")


def state_recall(n_pairs: int, d: int = 64, seed: int = 0, last: int = 16,
                 temperature: float = 20.0) -> dict[str, tuple[float, float]]:
    """Write ``n_pairs`` (key, value) pairs — random unit vectors of dimension ``d`` — and read every key back.

    The softmax row attends with the key as query (scores scaled by ``temperature``) over all cached pairs:
    the KV cache, which grows with n. The others keep one ``d`` x ``d`` state whatever n:
    :func:`~minigrpo.attention.gated_linear_attention` (additive write, with and without a decay) and
    :func:`~minigrpo.attention.gated_delta_rule` (β = 1, with and without a decay); the read-out of key i
    is Sᵀ k_i. Returns ``{method: (mean cosine(read, value) over all pairs, over the last ``last`` written)}``.
    """
    g = torch.Generator().manual_seed(seed)
    k, v = (F.normalize(torch.randn(1, 1, n_pairs, d, generator=g, dtype=torch.float64), dim=-1) for _ in range(2))
    keys, values = k[0, 0], v[0, 0]

    def score(read: torch.Tensor) -> tuple[float, float]:
        cos = F.cosine_similarity(read, values, dim=-1)
        return cos.mean().item(), cos[-last:].mean().item()

    states = (gated_linear_attention(k, k, v)[1], gated_linear_attention(k, k, v, decay=0.95)[1],
              gated_delta_rule(k, k, v, beta=1.0)[1], gated_delta_rule(k, k, v, beta=1.0, decay=0.95)[1])
    reads = [torch.softmax(temperature * keys @ keys.T, dim=-1) @ values] + [keys @ S[0, 0] for S in states]
    return {name: score(read) for name, read in zip(RECALL_METHODS, reads)}


# ---------------------------------------------------------------------------------------------
# Section 8: what each design keeps per sequence


def memory_options(context: int, batch: int = 1, layers: int = 32, heads: int = 32,
                   head_dim: int = 128) -> list[tuple[str, int, str]]:
    """``(name, bytes, how it grows)`` of the KV cache (or state) of a decoder with ``layers`` layers of
    ``heads`` query heads of ``head_dim`` (a 7B-like model by default) at ``context`` tokens, for each design
    lesson 10 discusses. fp16 caches unless named; recurrent states in float32. MLA uses DeepSeek-V2's
    latent (512) and RoPE key (64) sizes; the windows are 4,096 tokens (Mistral-7B's); the hybrids keep
    one layer in four with full GQA-8 attention."""
    def kv(n_kv, nbytes=2, n_layers=layers):
        return kv_cache_bytes(n_layers, n_kv, head_dim, context, batch, nbytes)

    def swa(n_kv, n_layers=layers):
        return sliding_window_cache_bytes(n_layers, n_kv, head_dim, context, batch, window=4096)

    def state(n_layers=layers, normalizer=False):
        return recurrent_state_bytes(n_layers, heads, head_dim, head_dim, batch, normalizer=normalizer)

    full, rest = layers // 4, layers - layers // 4
    return [
        ("MHA, fp16", kv(heads), "∝ context"),
        ("GQA 8 KV heads, fp16", kv(8), "∝ context"),
        ("MQA 1 KV head, fp16", kv(1), "∝ context"),
        ("MHA, int8/fp8 cache", kv(heads, 1), "∝ context"),
        ("GQA 8 KV heads, int8/fp8", kv(8, 1), "∝ context"),
        ("MLA, latent 512 + RoPE key 64", mla_cache_bytes(layers, 512, 64, context, batch, 2), "∝ context"),
        ("sliding window 4k, MHA", swa(heads), "capped at 4k"),
        ("sliding window 4k, GQA-8", swa(8), "capped at 4k"),
        ("hybrid: 1/4 full, 3/4 window", kv(8, n_layers=full) + swa(8, n_layers=rest), "∝ context (1/4)"),
        ("linear attention (elu+1), fp32", state(normalizer=True), "constant"),
        ("gated delta rule, fp32", state(), "constant"),
        ("hybrid: 1/4 full, 3/4 delta rule", kv(8, n_layers=full) + state(n_layers=rest), "∝ context (1/4)"),
    ]


# ---------------------------------------------------------------------------------------------
# Section 7: a multi-query key-value lookup for MHA / GQA / MQA

N_KEYS, N_VALUES, N_PAIRS, N_QUERIES = 64, 64, 16, 8


def lookup_batch(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """``(keys, values, query_keys, targets)``: ``N_PAIRS`` distinct keys with random values per sequence,
    and ``N_QUERIES`` of those keys asked back (the targets are their values)."""
    keys = torch.rand(batch, N_KEYS, generator=gen).argsort(-1)[:, :N_PAIRS]  # distinct keys
    vals = torch.randint(N_VALUES, (batch, N_PAIRS), generator=gen)
    pick = torch.rand(batch, N_PAIRS, generator=gen).argsort(-1)[:, :N_QUERIES]  # which pairs are asked
    return keys, vals, keys.gather(1, pick), vals.gather(1, pick)


class LookupModel(nn.Module):
    """One causal attention layer (``n_heads`` query heads, ``n_kv_heads`` K/V heads), an MLP and a linear
    head over a context of (key, value) tokens followed by (key, ?) query tokens; logits at the queries."""

    def __init__(self, d_model: int = 32, n_heads: int = 8, n_kv_heads: int = 8):
        super().__init__()
        self.key_emb = nn.Embedding(N_KEYS, d_model)
        self.val_emb = nn.Embedding(N_VALUES + 1, d_model)  # last row: "?" for queries
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads, n_kv_heads=n_kv_heads)  # causal, as in a decoder
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.head = nn.Linear(d_model, N_VALUES)

    def forward(self, keys: torch.Tensor, vals: torch.Tensor, query_keys: torch.Tensor) -> torch.Tensor:
        context = self.key_emb(keys) + self.val_emb(vals)  # a (key, value) token
        queries = self.key_emb(query_keys) + self.val_emb.weight[N_VALUES]  # a (key, ?) token
        x = torch.cat([context, queries], dim=1)
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return self.head(x[:, N_PAIRS:])  # (B, N_QUERIES, N_VALUES)


def evaluate_lookup(model: nn.Module, data: tuple[torch.Tensor, ...]) -> tuple[float, float]:
    """(accuracy, cross-entropy) of ``model`` on a batch from :func:`lookup_batch`."""
    keys, vals, qk, target = data
    with torch.no_grad():
        logits = model(keys, vals, qk)
    return ((logits.argmax(-1) == target).float().mean().item(),
            F.cross_entropy(logits.reshape(-1, N_VALUES), target.reshape(-1)).item())


def train_lookup(n_kv_heads: int, seed: int, steps: int, held_out: tuple[torch.Tensor, ...], batch: int = 64,
                 lr: float = 3e-3, eval_every: int = 50) -> tuple[LookupModel, np.ndarray]:
    """Train a :class:`LookupModel` with AdamW on fresh batches; returns it and its held-out curve, rows
    ``(step, accuracy, cross-entropy)`` every ``eval_every`` steps and at the end."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = LookupModel(n_kv_heads=n_kv_heads)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    curve = []
    for step in range(1, steps + 1):
        keys, vals, qk, target = lookup_batch(batch, gen)
        loss = F.cross_entropy(model(keys, vals, qk).reshape(-1, N_VALUES), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % eval_every == 0 or step == steps:
            curve.append((step, *evaluate_lookup(model, held_out)))
    return model, np.array(curve)
