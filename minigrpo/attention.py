"""Attention for policy models: MHA / GQA / MQA in one module, causal linear attention, KV-cache size.

- ``Attention(d_model, n_heads, n_kv_heads)``: ``n_kv_heads == n_heads`` is multi-head attention,
  ``1`` is multi-query attention, anything between (dividing ``n_heads``) is grouped-query
  attention: each group of ``n_heads / n_kv_heads`` query heads shares one key/value head.
- ``linear_attention_parallel`` / ``linear_attention_recurrent``: causal linear attention
  (Katharopoulos et al. 2020) with a positive feature map φ. Replacing softmax(qkᵀ) by φ(q)φ(k)ᵀ
  lets the sum over keys be re-associated: out_t = φ(q_t)ᵀ S_t / φ(q_t)ᵀ z_t with the running
  state S_t = Σ_{s≤t} φ(k_s) v_sᵀ and z_t = Σ_{s≤t} φ(k_s): O(n) time and O(1) memory per step.
- ``kv_cache_bytes``: memory of the key/value cache of a decoder at inference.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 > 0 (Katharopoulos et al. 2020): keeps every similarity positive."""
    return F.elu(x) + 1.0


class Attention(nn.Module):
    """Causal (or full) softmax attention with ``n_kv_heads`` key/value heads shared by groups of queries."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, causal: bool = True,
                 bias: bool = False):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must be >= 1 and divide n_heads ({n_heads})")
        self.d_model, self.n_heads, self.n_kv_heads, self.causal = d_model, n_heads, n_kv_heads, causal
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[B, T, d_model]`` → ``[B, T, d_model]``."""
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"expected input [B, T, {self.d_model}], got {tuple(x.shape)}")
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        group = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, nh, T, hd)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, nh, T, T): the n x n term
        if self.causal:
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def kv_cache_bytes(self, seq_len: int, batch_size: int, bytes_per_elem: int = 2) -> int:
        """KV-cache bytes of this one layer."""
        return kv_cache_bytes(1, self.n_kv_heads, self.head_dim, seq_len, batch_size, bytes_per_elem)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.ndim != 4 or q.shape != k.shape or q.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"expected q, k of shape [B, H, T, d] and v of shape [B, H, T, d_v]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def linear_attention_parallel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              feature_map: Callable[[torch.Tensor], torch.Tensor] = elu_feature_map,
                              eps: float = 1e-6) -> torch.Tensor:
    """Causal linear attention computed for all positions at once: O(n²) like softmax, but with
    φ(q)φ(k)ᵀ in place of exp(qkᵀ) and no softmax. ``[B, H, T, d]`` → ``[B, H, T, d_v]``."""
    _check_qkv(q, k, v)
    fq, fk = feature_map(q), feature_map(k)
    T = q.shape[-2]
    sim = (fq @ fk.transpose(-2, -1)) * torch.ones(T, T, device=q.device).tril()  # (B, H, T, T)
    return (sim @ v) / (sim.sum(-1, keepdim=True) + eps)


def linear_attention_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               feature_map: Callable[[torch.Tensor], torch.Tensor] = elu_feature_map,
                               eps: float = 1e-6) -> torch.Tensor:
    """The same outputs as :func:`linear_attention_parallel`, one step at a time with a fixed-size
    state (S: d x d_v, z: d): O(n) time, O(1) memory per step, like an RNN."""
    _check_qkv(q, k, v)
    fq, fk = feature_map(q), feature_map(k)
    B, H, T, d = q.shape
    S = q.new_zeros(B, H, d, v.shape[-1])  # Σ φ(k_s) v_sᵀ
    z = q.new_zeros(B, H, d)  # Σ φ(k_s)
    outs = []
    for t in range(T):
        S = S + fk[:, :, t, :, None] * v[:, :, t, None, :]
        z = z + fk[:, :, t]
        num = (fq[:, :, t, :, None] * S).sum(-2)  # φ(q_t)ᵀ S_t
        den = (fq[:, :, t] * z).sum(-1, keepdim=True)  # φ(q_t)ᵀ z_t
        outs.append(num / (den + eps))
    return torch.stack(outs, dim=2)


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, batch_size: int,
                   bytes_per_elem: int = 2) -> int:
    """Bytes of a decoder's KV cache: keys and values (×2), for every layer, KV head, head
    dimension, cached position and sequence in the batch. Query heads do not appear: that is why
    GQA/MQA (fewer KV heads) shrink the cache. ``bytes_per_elem``: 2 for fp16/bf16, 1 for int8/fp8.

    >>> kv_cache_bytes(32, 32, 128, 4096, 1)      # a Llama-2-7B-sized model, fp16: 2 GiB
    2147483648
    """
    for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                        ("seq_len", seq_len), ("batch_size", batch_size), ("bytes_per_elem", bytes_per_elem)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_elem
