"""Attention for policy models: MHA / GQA / MQA in one module, causal linear attention, KV-cache size.

- ``Attention(d_model, n_heads, n_kv_heads)``: ``n_kv_heads == n_heads`` is multi-head attention,
  ``1`` is multi-query attention, anything between (dividing ``n_heads``) is grouped-query
  attention: each group of ``n_heads / n_kv_heads`` query heads shares one key/value head.
- ``linear_attention_parallel`` / ``linear_attention_recurrent``: causal linear attention
  (Katharopoulos et al. 2020) with a positive feature map φ. Replacing softmax(qkᵀ) by φ(q)φ(k)ᵀ
  lets the sum over keys be re-associated: out_t = φ(q_t)ᵀ S_t / φ(q_t)ᵀ z_t with the running
  state S_t = Σ_{s≤t} φ(k_s) v_sᵀ and z_t = Σ_{s≤t} φ(k_s): O(n) time and O(1) memory per step.
- ``linear_attention_chunked``: the same outputs again, computed chunk by chunk with matmuls
  (exact inside a chunk, a running state between chunks): O(n) time and memory, fast in practice.
- ``softmax_attention``: exact attention that materialises the n x n score matrix (the naive form);
  ``decode_attention``: one new token against a (grouped) KV cache.
- ``gated_linear_attention`` / ``gated_delta_rule``: linear attention's fixed-size state with a forget
  gate (S ← αS + k vᵀ) and with the delta rule (S ← α(S − β k kᵀS) + β k vᵀ, Gated DeltaNet).
- ``kv_cache_bytes``: memory of the key/value cache of a decoder at inference; ``mla_cache_bytes``
  (DeepSeek-V2's latent cache), ``sliding_window_cache_bytes`` (capped at the window) and
  ``recurrent_state_bytes`` (linear-attention layers: constant in the context length) beside it.
- ``measure_attention_scaling`` / ``fit_loglog_slope`` / ``crossover_length``: time and peak memory
  against sequence length, forward or forward + backward (used by lesson 10,
  ``benchmarks/attention_scaling.py`` and ``benchmarks/attention_gpu.py``).
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from minigrpo.utils import torch_threads


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
        y = softmax_attention(q, k, v, causal=self.causal)  # (B, nh, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def kv_cache_bytes(self, seq_len: int, batch_size: int, bytes_per_elem: int = 2) -> int:
        """KV-cache bytes of this one layer."""
        return kv_cache_bytes(1, self.n_kv_heads, self.head_dim, seq_len, batch_size, bytes_per_elem)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.ndim != 4 or q.shape != k.shape or q.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"expected q, k of shape [B, H, T, d] and v of shape [B, H, T, d_v]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Exact scaled dot-product attention, written out: the ``[B, H, T, T]`` score matrix is built,
    masked, softmax-ed and multiplied by ``v``: O(n²) time and memory. ``[B, H, T, d]`` → ``[B, H, T, d_v]``."""
    _check_qkv(q, k, v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T): the n x n term
    if causal:
        T = q.shape[-2]
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """One decoding step: the new token's ``Hq`` query heads ``[B, Hq, d]`` attend to a cache of
    ``Hkv`` key/value heads ``[B, Hkv, L, d]`` (``Hkv`` divides ``Hq``). The queries of a group are
    stacked against their shared head, so each cached K/V is read once and never copied per query
    head: the work is a pass over the cache, whose size is set by ``Hkv``. → ``[B, Hq, d_v]``."""
    if q.ndim != 3 or k_cache.ndim != 4 or k_cache.shape != v_cache.shape[:-1] + (k_cache.shape[-1],) \
            or k_cache.shape[-1] != q.shape[-1] or k_cache.shape[0] != q.shape[0] \
            or q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"expected q [B, Hq, d] and caches [B, Hkv, L, d], [B, Hkv, L, d_v] with Hkv dividing "
                         f"Hq; got {tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    B, Hq, d = q.shape
    Hkv = k_cache.shape[1]
    qg = q.view(B, Hkv, Hq // Hkv, d)  # (B, Hkv, group, d): the query heads of each group together
    w = torch.softmax(qg @ k_cache.transpose(-2, -1) / math.sqrt(d), dim=-1)  # (B, Hkv, group, L)
    return (w @ v_cache).reshape(B, Hq, v_cache.shape[-1])


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


def linear_attention_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int = 64,
                             feature_map: Callable[[torch.Tensor], torch.Tensor] = elu_feature_map,
                             eps: float = 1e-6) -> torch.Tensor:
    """The same outputs as :func:`linear_attention_parallel`, with the sequence cut into chunks of
    ``chunk_size``: inside a chunk the causal sums are a small masked matmul (C x C); across chunks
    they come from the running state S = Σ φ(k_s) v_sᵀ, z = Σ φ(k_s) of all earlier chunks (a cumulative
    sum over chunks). Time O(n·C·d + n·d·d_v), memory O(n·(C + d·d_v/C)): linear in n, and no Python
    loop over positions. ``[B, H, T, d]`` → ``[B, H, T, d_v]``."""
    _check_qkv(q, k, v)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    B, H, T, d = q.shape
    dv = v.shape[-1]
    fq, fk = feature_map(q), feature_map(k)
    pad = (-T) % chunk_size  # zero features after the map add nothing to any sum
    if pad:
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
    n = (T + pad) // chunk_size
    fq, fk = fq.view(B, H, n, chunk_size, d), fk.view(B, H, n, chunk_size, d)
    v = v.reshape(B, H, n, chunk_size, dv)
    kv = fk.transpose(-2, -1) @ v  # (B, H, n, d, dv): each chunk's Σ φ(k) vᵀ
    z = fk.sum(-2)  # (B, H, n, d)
    S_prev, z_prev = _exclusive_prefix_sum(kv), _exclusive_prefix_sum(z)  # state before each chunk
    sim = (fq @ fk.transpose(-2, -1)).tril()  # (B, H, n, C, C): causal inside the chunk
    num = fq @ S_prev + sim @ v
    den = (fq @ z_prev.unsqueeze(-1)).squeeze(-1) + sim.sum(-1)
    out = num / (den.unsqueeze(-1) + eps)
    return out.reshape(B, H, n * chunk_size, dv)[:, :, :T]


def _exclusive_prefix_sum(x: torch.Tensor) -> torch.Tensor:
    """``out[:, :, i] = x[:, :, :i].sum(2)`` (the chunks before chunk i), accumulated in float32 at least,
    as the kernels of linear attention do for half-precision inputs. On CPU a loop over the n/C chunks
    beats ``torch.cumsum`` along a middle dimension; on a GPU one cumsum beats n/C small kernels."""
    acc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if x.device.type == "cpu":
        out, running = torch.empty_like(acc), torch.zeros_like(acc[:, :, 0])
        for i in range(x.shape[2]):
            out[:, :, i] = running
            running = running + acc[:, :, i]
    else:
        out = torch.cat([torch.zeros_like(acc[:, :, :1]), acc[:, :, :-1].cumsum(2)], dim=2)
    return out.to(x.dtype)


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, batch_size: int,
                   bytes_per_elem: int = 2) -> int:
    """Bytes of a decoder's KV cache: keys and values (×2), for every layer, KV head, head
    dimension, cached position and sequence in the batch. Query heads do not appear: that is why
    GQA/MQA (fewer KV heads) shrink the cache. ``bytes_per_elem``: 2 for fp16/bf16, 1 for int8/fp8.

    >>> kv_cache_bytes(32, 32, 128, 4096, 1)      # a Llama-2-7B-sized model, fp16: 2 GiB
    2147483648
    """
    _check_counts(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, seq_len=seq_len,
                  batch_size=batch_size, bytes_per_elem=bytes_per_elem)
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_elem


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def mla_cache_bytes(n_layers: int, kv_lora_rank: int, rope_head_dim: int, seq_len: int, batch_size: int,
                    bytes_per_elem: int = 2) -> int:
    """Bytes of a multi-head latent attention (MLA) cache (DeepSeek-V2, Liu et al. 2024, §2.1).

    Per token and layer MLA caches one low-rank latent ``c_KV`` (``kv_lora_rank`` numbers) from which
    every head's keys and values are re-projected, plus one decoupled RoPE key (``rope_head_dim``
    numbers) shared by all heads — no factor 2 and no head count. The up-projections can be absorbed into
    the query and output projections, so decoding reads only the latent. DeepSeek-V2 (60 layers,
    ``kv_lora_rank`` 512, ``rope_head_dim`` 64) caches (512 + 64) = 4.5 × 128 numbers per token and layer,
    what GQA with 2.25 KV heads of 128 would cache; its 128 heads of 128 under MHA would cache 32,768.

    >>> mla_cache_bytes(60, 512, 64, 1, 1)          # DeepSeek-V2, bf16: 67.5 KiB per token
    69120
    """
    _check_counts(n_layers=n_layers, kv_lora_rank=kv_lora_rank, rope_head_dim=rope_head_dim, seq_len=seq_len,
                  batch_size=batch_size, bytes_per_elem=bytes_per_elem)
    return n_layers * (kv_lora_rank + rope_head_dim) * seq_len * batch_size * bytes_per_elem


def sliding_window_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, batch_size: int,
                               window: int, bytes_per_elem: int = 2) -> int:
    """Bytes of the KV cache of sliding-window attention: each token attends to the last ``window``
    positions only, so the cache keeps at most ``window`` of them (a ring buffer) — :func:`kv_cache_bytes`
    with ``min(seq_len, window)`` positions. Information from further back reaches a token only through
    the layers below (the receptive field grows by ``window`` per layer), which is why models mix such
    layers with full-attention ones (e.g. Gemma 2 alternates them).

    >>> sliding_window_cache_bytes(32, 8, 128, 32768, 1, window=4096) == 512 * 2**20   # Mistral-7B, fp16
    True
    """
    _check_counts(window=window)
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return kv_cache_bytes(n_layers, n_kv_heads, head_dim, min(seq_len, window), batch_size, bytes_per_elem)


def recurrent_state_bytes(n_layers: int, n_heads: int, key_dim: int, value_dim: int, batch_size: int,
                          bytes_per_elem: int = 4, normalizer: bool = False) -> int:
    """Bytes of the state of linear-attention layers: per head one ``key_dim`` x ``value_dim`` matrix
    S (plus a ``key_dim`` vector z when the layer divides by φ(q)ᵀz, as :func:`linear_attention_recurrent`
    does), whatever the context length. Gated and delta-rule layers (:func:`gated_linear_attention`,
    :func:`gated_delta_rule`) keep S only. ``bytes_per_elem`` defaults to 4: the state is a running sum,
    kept in float32.

    >>> recurrent_state_bytes(32, 32, 128, 128, 1)   # 32 layers x 32 heads x 128 x 128 x 4 bytes: 64 MiB
    67108864
    """
    _check_counts(n_layers=n_layers, n_heads=n_heads, key_dim=key_dim, value_dim=value_dim, batch_size=batch_size,
                  bytes_per_elem=bytes_per_elem)
    per_head = key_dim * value_dim + (key_dim if normalizer else 0)
    return n_layers * n_heads * per_head * batch_size * bytes_per_elem


def _gates(x: torch.Tensor | float | None, shape: torch.Size, like: torch.Tensor, name: str,
           default: float) -> torch.Tensor:
    """A per-(batch, head, position) gate in [0, 1], ``[B, H, T]``, from a tensor, a number or None."""
    if x is None:
        return torch.full(shape, default, dtype=like.dtype, device=like.device)
    g = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    try:
        g = g.expand(shape)
    except RuntimeError:
        raise ValueError(f"{name} must be a number or broadcast to [B, H, T] = {list(shape)}, "
                         f"got shape {tuple(g.shape)}") from None
    if not bool(((g >= 0) & (g <= 1)).all()):
        raise ValueError(f"{name} must lie in [0, 1]")
    return g


def gated_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           decay: torch.Tensor | float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear attention with a forget gate, as a recurrence:  S_t = α_t S_{t-1} + k_t v_tᵀ,  o_t = S_tᵀ q_t.

    The additive write of linear attention (no feature map, no normaliser, as in RetNet, GLA and
    Mamba-2) with a decay α_t in [0, 1] (``decay``: a number or ``[B, H, T]``; None is 1, no forgetting).
    The gate lets the layer fade old associations out instead of piling them up. ``q``, ``k``:
    ``[B, H, T, d]``, ``v``: ``[B, H, T, d_v]``. Returns the outputs ``[B, H, T, d_v]`` and the final
    state ``[B, H, d, d_v]`` — the layer's whole memory, the same size at any length.
    """
    _check_qkv(q, k, v)
    alpha = _gates(decay, q.shape[:3], q, "decay", 1.0)
    S = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])  # (B, H, d, dv)
    outs = []
    for t in range(q.shape[2]):
        S = alpha[:, :, t, None, None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((q[:, :, t, :, None] * S).sum(-2))  # S_tᵀ q_t
    return torch.stack(outs, dim=2), S


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor | float,
                     decay: torch.Tensor | float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The (gated) delta rule:  S_t = α_t (S_{t-1} − β_t k_t (k_tᵀ S_{t-1})) + β_t k_t v_tᵀ,  o_t = S_tᵀ q_t.

    DeltaNet (Schlag et al. 2021; Yang et al. 2024) writes the *correction* β_t k_t (v_t − S_{t-1}ᵀ k_t)ᵀ
    instead of adding k_t v_tᵀ: what the state returns for k_t moves a fraction β_t of the way to v_t, so
    with a unit key and β = 1 a new value replaces the old one rather than adding to it. Gated DeltaNet
    (Yang, Kautz & Hatamizadeh 2024) also decays the state by α_t (``decay``; None is 1). Keys are
    expected L2-normalised. ``beta``: a number or ``[B, H, T]`` in [0, 1]. Shapes and return as
    :func:`gated_linear_attention`.
    """
    _check_qkv(q, k, v)
    if beta is None:
        raise ValueError("beta (the delta rule's write strength in [0, 1]) is required")
    b = _gates(beta, q.shape[:3], q, "beta", 0.0)
    alpha = _gates(decay, q.shape[:3], q, "decay", 1.0)
    S = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])  # (B, H, d, dv)
    outs = []
    for t in range(q.shape[2]):
        kt, bt = k[:, :, t, :, None], b[:, :, t, None, None]  # (B, H, d, 1), (B, H, 1, 1)
        read = (kt * S).sum(-2, keepdim=True)  # k_tᵀ S_{t-1}: what the state returns for k_t, (B, H, 1, dv)
        S = alpha[:, :, t, None, None] * (S - bt * kt * read) + bt * kt * v[:, :, t, None, :]
        outs.append((q[:, :, t, :, None] * S).sum(-2))
    return torch.stack(outs, dim=2), S


# ---------------------------------------------------------------------------------------------
# Measuring time and memory against sequence length


class _PeakTensorMemory(TorchDispatchMode):
    """Tracks the bytes of tensor storages created by torch ops inside the block (inputs made before
    it are not counted) and the peak of the live total. A storage counts as live while any tensor
    the ops returned on it is alive. Kernel-internal scratch buffers are invisible to it."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, list] = {}  # storage pointer -> [nbytes, weakrefs of tensors on it]
        self.external: set[int] = set()
        self.current = self.peak = 0

    def _prune(self) -> None:
        for ptr in [p for p, (_, refs) in self.live.items() if all(r() is None for r in refs)]:
            self.current -= self.live.pop(ptr)[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.live:
                self.external.add(t.untyped_storage().data_ptr())
        out = func(*args, **(kwargs or {}))
        self._prune()
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in self.live:
                self.live[ptr][1].append(weakref.ref(t))
            elif ptr not in self.external and storage.nbytes() > 0:
                self.live[ptr] = [storage.nbytes(), [weakref.ref(t)]]
                self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out


def peak_memory_bytes(fn: Callable[[], object], grad: bool = False) -> int:
    """Peak bytes of tensors allocated while ``fn()`` runs (its result included), on any device,
    as seen by torch's dispatcher. Deterministic: it counts tensors, not the allocator's pages.
    ``grad=False`` runs ``fn`` under ``torch.no_grad()``; ``grad=True`` lets it build a graph and call
    ``backward`` (the backward pass's tensors and the gradients are counted too).

    >>> peak_memory_bytes(lambda: torch.ones(1000, dtype=torch.float32))
    4000
    """
    with torch.set_grad_enabled(grad), _PeakTensorMemory() as tracker:
        result = fn()
        del result
    return tracker.peak


ATTENTION_METHODS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "softmax": lambda q, k, v: softmax_attention(q, k, v, causal=True),
    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "linear": lambda q, k, v: linear_attention_chunked(q, k, v),
}
"""Causal attention implementations that ``measure_attention_scaling`` knows: naive exact softmax
(n x n scores), PyTorch's fused exact softmax (``scaled_dot_product_attention``) and chunked
linear attention."""


def _best_time(fn: Callable[[], object], repeats: int, clock: Callable[[], float], min_seconds: float = 0.0,
               max_repeats: int = 200) -> float:
    """Best of at least ``repeats`` timed calls, continuing (up to ``max_repeats``) until ``min_seconds``
    have been spent: short calls get more chances to run undisturbed."""
    best, spent, calls = math.inf, 0.0, 0
    while calls < repeats or (spent < min_seconds and calls < max_repeats):
        start = clock()
        fn()
        elapsed = clock() - start
        best, spent, calls = min(best, elapsed), spent + elapsed, calls + 1
    return best


def measure_attention_scaling(lengths: Sequence[int], methods: Sequence[str] = ("softmax", "sdpa", "linear"),
                              batch_size: int = 1, n_heads: int = 4, head_dim: int = 64, repeats: int = 3,
                              threads: int | None = 1, seed: int = 0, device: str | torch.device = "cpu",
                              dtype: torch.dtype = torch.float32, timer: str = "auto",
                              min_seconds: float = 0.0, backward: bool = False) -> list[dict]:
    """Time and peak memory of causal attention against sequence length: the forward pass, or with
    ``backward=True`` the forward and backward passes (gradients of q, k and v), as in training.

    For each length and method: random q, k, v of shape ``[batch_size, n_heads, T, head_dim]``, one
    warm-up call, then the best of ``repeats`` timed calls — more if they took less than ``min_seconds``
    in all (the minimum is the least disturbed by other work on the machine) — and the peak bytes of tensors allocated by one call
    (:func:`peak_memory_bytes`). ``threads``: torch threads while measuring (``None`` leaves them).
    ``timer``: ``"wall"`` (elapsed time), ``"cpu"`` (CPU time of the calling thread: on a shared
    machine it does not count the time other processes hold the core; valid for one thread on CPU)
    or ``"auto"`` (``"cpu"`` when measuring on CPU with ``threads=1``, else ``"wall"``).
    Returns one dict per (length, method): ``seq_len``, ``method``, ``seconds``, ``peak_bytes``, ``backward``.
    """
    unknown = [m for m in methods if m not in ATTENTION_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; expected some of {sorted(ATTENTION_METHODS)}")
    if not lengths or any(not isinstance(n, int) or n < 1 for n in lengths):
        raise ValueError(f"lengths must be a non-empty sequence of positive ints, got {lengths!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = torch.device(device)
    if timer == "auto":
        timer = "cpu" if device.type == "cpu" and threads == 1 else "wall"
    if timer == "cpu" and (device.type != "cpu" or threads != 1):
        raise ValueError("timer='cpu' measures one CPU thread: use it with device='cpu' and threads=1")
    if timer not in ("cpu", "wall"):
        raise ValueError(f"timer must be 'auto', 'cpu' or 'wall', got {timer!r}")
    clock = time.thread_time if timer == "cpu" else time.perf_counter
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    with torch_threads(threads or torch.get_num_threads()), torch.set_grad_enabled(backward):
        for T in lengths:
            q, k, v = (torch.randn(batch_size, n_heads, T, head_dim, generator=gen, dtype=dtype).to(device)
                       .requires_grad_(backward) for _ in range(3))
            grad_out = torch.randn(batch_size, n_heads, T, head_dim, generator=gen, dtype=dtype).to(device)
            for name in methods:
                def step(attend=ATTENTION_METHODS[name]):
                    out = attend(q, k, v)
                    if backward:
                        q.grad = k.grad = v.grad = None
                        out.backward(grad_out)

                def call():
                    step()
                    sync()

                call()  # warm-up
                rows.append({"seq_len": T, "method": name, "seconds": _best_time(call, repeats, clock, min_seconds),
                             "peak_bytes": peak_memory_bytes(step, grad=backward), "backward": backward})
    return rows


def fit_loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log y against log x: the exponent p in y ≈ c·xᵖ."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"need at least two (x, y) pairs of equal length, got {len(xs)} and {len(ys)}")
    if any(x <= 0 for x in xs) or any(y <= 0 for y in ys):
        raise ValueError("log-log fit needs positive x and y")
    lx = torch.tensor([math.log(x) for x in xs], dtype=torch.float64)
    ly = torch.tensor([math.log(y) for y in ys], dtype=torch.float64)
    lx, ly = lx - lx.mean(), ly - ly.mean()
    if float((lx * lx).sum()) == 0.0:
        raise ValueError("log-log fit needs at least two different x")
    return float((lx * ly).sum() / (lx * lx).sum())


def crossover_length(rows: Sequence[dict], slow: str = "softmax", fast: str = "linear",
                     key: str = "seconds") -> int | None:
    """The first measured length from which ``fast`` stays below ``slow`` (on ``key``) at every
    longer measured length; ``None`` if it never does."""
    by = {(r["method"], r["seq_len"]): r[key] for r in rows}
    lengths = sorted({n for (m, n) in by if m == slow} & {n for (m, n) in by if m == fast})
    if not lengths:
        raise ValueError(f"no common lengths for methods {slow!r} and {fast!r}")
    cross = None
    for n in reversed(lengths):
        if by[(fast, n)] < by[(slow, n)]:
            cross = n
        else:
            break
    return cross


def scaling_slopes(rows: Sequence[dict], slow: str = "softmax", fast: str = "linear",
                   min_points: int = 3) -> tuple[int | None, list[int], dict[str, tuple[float, float]]]:
    """Log-log slopes of time and memory for every method in ``rows`` (from :func:`measure_attention_scaling`),
    fitted on the lengths from the crossover (``fast`` below ``slow`` from there on) up; if that leaves fewer
    than ``min_points`` lengths, on the upper half of the lengths. Returns ``(crossover, fitted lengths,
    {method: (time slope, memory slope)})``."""
    lengths = sorted({r["seq_len"] for r in rows})
    cross = crossover_length(rows, slow=slow, fast=fast)
    fit = [n for n in lengths if cross is not None and n >= cross]
    if len(fit) < min_points:
        fit = lengths[len(lengths) // 2:]
    by = {(r["method"], r["seq_len"]): r for r in rows}
    methods = list(dict.fromkeys(r["method"] for r in rows))
    return cross, fit, {m: (fit_loglog_slope(fit, [by[(m, n)]["seconds"] for n in fit]),
                            fit_loglog_slope(fit, [by[(m, n)]["peak_bytes"] for n in fit])) for m in methods}


def format_scaling_table(rows: Sequence[dict]) -> str:
    """The rows of :func:`measure_attention_scaling` as a text table: one line per length, time (ms) and
    peak memory (MiB) per method."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(r["method"], r["seq_len"]): r for r in rows}
    lines = [f"{'n':>6} | " + " | ".join(f"{m + ' ms':>11}" for m in methods) + " | "
             + " | ".join(f"{m + ' MiB':>12}" for m in methods)]
    for n in sorted({r["seq_len"] for r in rows}):
        lines.append(f"{n:>6} | " + " | ".join(f"{by[(m, n)]['seconds'] * 1e3:11.3f}" for m in methods) + " | "
                     + " | ".join(f"{by[(m, n)]['peak_bytes'] / 2**20:12.2f}" for m in methods))
    return "\n".join(lines)
