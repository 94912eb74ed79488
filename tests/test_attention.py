import pytest
import torch

from minigrpo.attention import (
    Attention,
    crossover_length,
    decode_attention,
    fit_loglog_slope,
    format_scaling_table,
    kv_cache_bytes,
    linear_attention_chunked,
    linear_attention_parallel,
    linear_attention_recurrent,
    measure_attention_scaling,
    peak_memory_bytes,
    scaling_slopes,
    softmax_attention,
)


def test_gqa_with_as_many_kv_heads_as_query_heads_equals_torch_mha():
    """n_kv_heads == n_heads is plain multi-head attention: compare with torch.nn.MultiheadAttention."""
    torch.manual_seed(0)
    d, h, T = 32, 4, 7
    ours = Attention(d, h, n_kv_heads=h, causal=True)
    ref = torch.nn.MultiheadAttention(d, h, bias=False, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.out_proj.weight.copy_(ours.o_proj.weight)
    x = torch.randn(2, T, d)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    expected, _ = ref(x, x, x, attn_mask=mask, need_weights=False)
    torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-6)


def test_gqa_equals_mha_with_repeated_kv_weights():
    """GQA is MHA whose key/value projections are shared within each group of query heads."""
    torch.manual_seed(1)
    d, h, kv = 32, 8, 2
    gqa = Attention(d, h, n_kv_heads=kv)
    mha = Attention(d, h, n_kv_heads=h)
    hd, group = d // h, h // kv
    with torch.no_grad():
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.o_proj.weight.copy_(gqa.o_proj.weight)
        for proj in ("k_proj", "v_proj"):
            w = getattr(gqa, proj).weight.view(kv, hd, d).repeat_interleave(group, 0).reshape(h * hd, d)
            getattr(mha, proj).weight.copy_(w)
    x = torch.randn(3, 5, d)
    torch.testing.assert_close(gqa(x), mha(x), rtol=1e-5, atol=1e-6)


def test_attention_is_causal():
    torch.manual_seed(2)
    attn = Attention(16, 4, n_kv_heads=1)  # MQA
    x = torch.randn(1, 6, 16)
    y = attn(x)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 16)  # change the future
    torch.testing.assert_close(attn(x2)[:, :4], y[:, :4])


@pytest.mark.parametrize("T", [1, 5, 33])
def test_linear_attention_recurrent_equals_parallel(T):
    torch.manual_seed(T)
    q, k, v = torch.randn(2, 3, T, 8), torch.randn(2, 3, T, 8), torch.randn(2, 3, T, 6)
    torch.testing.assert_close(linear_attention_recurrent(q, k, v), linear_attention_parallel(q, k, v),
                               rtol=1e-5, atol=1e-5)


def test_linear_attention_first_position_returns_its_value():
    q, k, v = torch.randn(1, 1, 4, 3), torch.randn(1, 1, 4, 3), torch.randn(1, 1, 4, 2)
    torch.testing.assert_close(linear_attention_parallel(q, k, v)[..., 0, :], v[..., 0, :], rtol=1e-4, atol=1e-5)


def test_kv_cache_bytes_hand_computed():
    # Llama-2-7B shape (32 layers, 32 KV heads of 128), 4096 tokens, batch 1, fp16: 2 GiB
    assert kv_cache_bytes(32, 32, 128, 4096, 1, 2) == 2 * 32 * 32 * 128 * 4096 * 2 == 2 * 1024**3
    # 8 KV heads instead of 32 (GQA): a quarter of it
    assert kv_cache_bytes(32, 8, 128, 4096, 1, 2) == 512 * 1024**2
    assert Attention(64, 8, n_kv_heads=2).kv_cache_bytes(seq_len=10, batch_size=3) == 2 * 2 * 8 * 10 * 3 * 2
    with pytest.raises(ValueError, match="n_kv_heads"):
        kv_cache_bytes(1, -1, 1, 1, 1)


def test_bad_configurations():
    with pytest.raises(ValueError, match="divide"):
        Attention(32, 8, n_kv_heads=3)
    with pytest.raises(ValueError, match="divisible"):
        Attention(30, 8)
    with pytest.raises(ValueError, match=r"\[B, T, 32\]"):
        Attention(32, 4)(torch.zeros(2, 32))


@pytest.mark.parametrize("T, chunk", [(1, 4), (5, 1), (33, 8), (33, 64), (64, 16)])
def test_linear_attention_chunked_equals_parallel(T, chunk):
    """Chunked (state across chunks, masked matmul inside) = parallel, including a ragged last chunk."""
    torch.manual_seed(T + chunk)
    q, k, v = torch.randn(2, 3, T, 8), torch.randn(2, 3, T, 8), torch.randn(2, 3, T, 6)
    torch.testing.assert_close(linear_attention_chunked(q, k, v, chunk_size=chunk),
                               linear_attention_parallel(q, k, v), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_attention_chunked(q, k, v, chunk_size=0)


def test_linear_attention_float64_against_explicit_sums():
    """out_t = Σ_{s≤t} φ(q_t)·φ(k_s) v_s / Σ_{s≤t} φ(q_t)·φ(k_s), written as a double loop in float64."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 1, 6, 3, dtype=torch.float64) for _ in range(3))
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    expected = torch.zeros_like(v)
    for t in range(6):
        w = torch.stack([(fq[0, 0, t] * fk[0, 0, s]).sum() for s in range(t + 1)])
        expected[0, 0, t] = (w[:, None] * v[0, 0, : t + 1]).sum(0) / w.sum()
    for fn in (linear_attention_parallel, linear_attention_recurrent, linear_attention_chunked):
        torch.testing.assert_close(fn(q, k, v, eps=0.0), expected, rtol=1e-12, atol=1e-12)


def test_softmax_attention_matches_torch_sdpa():
    torch.manual_seed(4)
    q, k, v = torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 5)
    for causal in (True, False):
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(softmax_attention(q, k, v, causal=causal), expected, rtol=1e-5, atol=1e-6)


def test_peak_memory_bytes_counts_live_tensors():
    assert peak_memory_bytes(lambda: torch.ones(1000, dtype=torch.float32)) == 4000
    x = torch.randn(100, 100)  # made outside: not counted
    assert peak_memory_bytes(lambda: x.view(-1)) == 0
    # (x @ x) then its softmax: both 40,000-byte results alive at once, the first freed after
    assert peak_memory_bytes(lambda: (x @ x).softmax(-1)) == 2 * 100 * 100 * 4
    # five 4,000-byte tensors alive together, vs made and freed one at a time (only the 4-byte sums stay)
    assert peak_memory_bytes(lambda: [torch.zeros(1000) for _ in range(5)]) == 5 * 4000
    assert peak_memory_bytes(lambda: [torch.zeros(1000).sum() for _ in range(5)]) == 4000 + 5 * 4


def test_measure_attention_scaling_shape_not_timing():
    rows = measure_attention_scaling([8, 16], methods=("softmax", "linear", "sdpa"), n_heads=2, head_dim=4,
                                     repeats=1)
    assert [(r["seq_len"], r["method"]) for r in rows] == [
        (8, "softmax"), (8, "linear"), (8, "sdpa"), (16, "softmax"), (16, "linear"), (16, "sdpa")]
    assert all(r["seconds"] > 0 and r["peak_bytes"] > 0 for r in rows)
    by = {(r["method"], r["seq_len"]): r["peak_bytes"] for r in rows}
    assert by[("softmax", 16)] >= 2 * 16 * 16 * 4  # at least the [B=1, H=2, 16, 16] float32 scores
    with pytest.raises(ValueError, match="unknown method"):
        measure_attention_scaling([8], methods=("flash",))
    with pytest.raises(ValueError, match="positive ints"):
        measure_attention_scaling([0])
    with pytest.raises(ValueError, match="one CPU thread"):
        measure_attention_scaling([8], threads=2, timer="cpu")
    assert len(measure_attention_scaling([8], methods=("sdpa",), threads=2, timer="wall", repeats=1)) == 1


def test_fit_loglog_slope_and_crossover():
    xs = [64, 128, 256, 512]
    assert fit_loglog_slope(xs, [3e-9 * x**2 for x in xs]) == pytest.approx(2.0, abs=1e-12)
    assert fit_loglog_slope(xs, [5e-6 * x for x in xs]) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="positive"):
        fit_loglog_slope([1, 2], [0.0, 1.0])
    rows = [{"method": m, "seq_len": n, "seconds": t} for m, ts in
            (("softmax", [1, 2, 8, 32]), ("linear", [4, 1, 9, 16])) for n, t in zip(xs, ts)]
    assert crossover_length(rows) == 512  # faster at 128 too, but not from there on
    rows[-2]["seconds"] = 7
    assert crossover_length(rows) == 128  # now faster from 128 on
    assert crossover_length(rows, slow="linear", fast="softmax") is None


@pytest.mark.parametrize("kv", [4, 2, 1])
def test_decode_attention_equals_last_row_of_full_attention(kv):
    """The last token's output from a grouped cache = full causal attention with K/V repeated per group."""
    torch.manual_seed(kv)
    B, H, L, d = 2, 4, 7, 8
    q, k, v = torch.randn(B, H, L, d), torch.randn(B, kv, L, d), torch.randn(B, kv, L, 5)
    full = softmax_attention(q, k.repeat_interleave(H // kv, 1), v.repeat_interleave(H // kv, 1), causal=True)
    torch.testing.assert_close(decode_attention(q[:, :, -1], k, v), full[:, :, -1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="Hkv dividing"):
        decode_attention(q[:, :3, -1], k, v) if kv != 1 else decode_attention(q[:, :, -1, :4], k, v)


def test_scaling_slopes_and_table_on_synthetic_rows():
    """softmax ∝ n² and linear ∝ n with linear faster from 256 on: slopes 2 and 1, fitted on [256, 512, 1024]."""
    lengths = [64, 128, 256, 512, 1024]
    rows = []
    for n in lengths:
        rows.append({"method": "softmax", "seq_len": n, "seconds": 1e-8 * n * n, "peak_bytes": 4 * n * n})
        rows.append({"method": "linear", "seq_len": n, "seconds": 1e-5 + 2e-6 * n if n >= 256 else 1.0,
                     "peak_bytes": 100 * n})
    cross, fit, slopes = scaling_slopes(rows)
    assert cross == 256 and fit == [256, 512, 1024]
    assert slopes["softmax"] == pytest.approx((2.0, 2.0), abs=1e-12)
    assert slopes["linear"][1] == pytest.approx(1.0, abs=1e-12)
    assert 0.9 < slopes["linear"][0] < 1.0  # the constant term bends it a little below 1
    _, fit, _ = scaling_slopes(rows, min_points=4)  # not enough points past the crossover: upper half
    assert fit == [256, 512, 1024]
    table = format_scaling_table(rows).splitlines()
    assert len(table) == 1 + len(lengths) and "softmax ms" in table[0] and "linear MiB" in table[0]
    assert table[-1].split("|")[1].strip() == f"{1e-8 * 1024 * 1024 * 1e3:.3f}"
