import pytest
import torch

from minigrpo.attention import (
    Attention,
    kv_cache_bytes,
    linear_attention_parallel,
    linear_attention_recurrent,
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
