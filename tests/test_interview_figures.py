"""Every figure the interview bank quotes equals the package's computation (or the lesson's committed
measurement), and the facts corrected in issue 17 stay corrected."""

import math
import re
from pathlib import Path

import nbformat
import pytest
import torch

from minigrpo.advantages import group_advantages
from minigrpo.attention import decode_attention, elu_feature_map, kv_cache_bytes
from minigrpo_course.interview import QUESTIONS, get
from minigrpo_course.interview import figures
from minigrpo.losses import kl_estimate

ROOT = Path(__file__).resolve().parents[1]


def _text(qid: str) -> str:
    q = get(qid)
    return q.answer + "\n" + "\n".join(q.checklist)


def _cell_output(notebook: str, fragment: str) -> str:
    """The printed output of the one code cell of ``notebook`` whose source contains ``fragment``."""
    nb = nbformat.read(ROOT / "notebooks" / notebook, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and fragment in c.source]
    assert len(cells) == 1, f"{notebook}: {len(cells)} code cells contain {fragment!r}"
    return "".join(o.get("text", "") for o in cells[0].outputs if o.output_type == "stream")


# ----------------------------------------------------------------------------- group normalisation


def test_group_weight_matches_hand_values():
    # G = 2: two different binary rewards always get ±1/√2 (sample std 1/√2), so w = √2/2 at every p.
    for p in (0.1, 0.5, 0.9):
        assert figures.group_weight(p, 2) == pytest.approx(1 / math.sqrt(2), abs=1e-3)
    # mean-centring only: w_G(p) = (G − 1)/G for every p
    assert figures.group_weight(0.3, 8, scale="none") == pytest.approx(7 / 8, abs=1e-12)


def test_group_normalisation_quotes_the_exact_finite_g_weights():
    text = _text("group-normalisation")
    assert "3.5 times" not in text and "about 3.5" not in text, "3.5× is the G → ∞ limit, not a finite-G figure"
    r8, r32 = figures.group_weight_ratio(0.02, 8), figures.group_weight_ratio(0.02, 32)
    assert (round(r8, 1), round(r32, 1)) == (1.4, 2.4)
    assert f"{r8:.1f}× at G = 8" in text and f"{r32:.1f}× at G = 32" in text
    c8, c32 = figures.group_weight_ceiling_ratio(8), figures.group_weight_ceiling_ratio(32)
    assert f"{c8:.1f}× and {c32:.1f}×" in text  # lesson 05's 1.4× and 2.8× at the extremes
    assert f"about {figures.group_weight_limit_ratio(0.02):.1f}×" in text
    win, loss = figures.lone_success_advantages(50)
    assert f"+{win:.1f}" in text and f"{loss:.2f}".replace("-", "−") in text  # +6.9 and −0.14
    assert abs(win - math.sqrt(0.98 / 0.02)) < 0.1 and abs(loss + math.sqrt(0.02 / 0.98)) < 0.005


def test_worked_group_example_and_group_size_figures():
    adv = group_advantages(torch.tensor([85.0, 92.0, 70.0], dtype=torch.float64), 3)
    text = _text("group-advantage-example")
    for a in adv.tolist():
        assert f"{a:+.2f}".replace("-", "−") in text
    text = _text("group-size")
    assert f"{figures.p_mixed(0.1, 4):.0%} at G = 4" in text and f"{figures.p_mixed(0.1, 16):.0%} at G = 16" in text


def test_group_advantages_need_no_absolute_reward_scale():
    r = torch.tensor([0.2, 0.9, 0.4, 0.4, 1.0, 3.0, 2.0, 0.0], dtype=torch.float64)
    base = group_advantages(r, 4, eps=0.0)
    assert torch.allclose(group_advantages(3.0 * r - 7.0, 4, eps=0.0), base, atol=1e-12)
    assert "does not require absolute rewards" in _text("preference-data")


# ----------------------------------------------------------------------------- KL estimators as losses


def test_k3_loss_gradient_is_the_reverse_kl_gradient_and_k1_has_none():
    """Exact expectations over a 6-token vocabulary (no sampling): E_πθ[∇k3] = ∇KL(π_ref ‖ π_θ) and
    E_πθ[∇k1] = 0, with the package's estimators."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    ref_logp = torch.log_softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    p = logp.exp().detach()

    def expected_grad(kind):
        per_token = kl_estimate(logp, ref_logp, kind)
        return torch.autograd.grad((p * per_token).sum(), theta, retain_graph=True)[0]  # Σ π_θ(a) ∇k(a)

    reverse_kl = (ref_logp.exp() * (ref_logp - logp)).sum()
    forward_kl = (p * (logp - ref_logp)).sum()
    g_reverse = torch.autograd.grad(reverse_kl, theta, retain_graph=True)[0]
    g_forward = torch.autograd.grad(forward_kl, theta, retain_graph=True)[0]
    assert torch.allclose(expected_grad("k3"), g_reverse, atol=1e-12)
    assert not torch.allclose(g_reverse, g_forward, atol=1e-3), "the two KL directions differ here"
    assert torch.allclose(expected_grad("k1"), torch.zeros(6, dtype=torch.float64), atol=1e-12)
    text = _text("kl-placement")
    assert "∇KL(π_ref ‖ π_θ)" in text and "expectation is exactly zero" in text and "slightly different" not in text


# ----------------------------------------------------------------------------- ratio magnitudes (lesson 07)


def test_ratio_magnitudes_quote_lesson_07s_measurements():
    out = _cell_output("07_debugging_grpo.ipynb", "study = {cause: log_ratios(")
    measured = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+)\s+mismatch\s+\d+\s+(\S+)", out, re.M)}
    text = _text("ratio-not-one")
    for cause in ("bf16", "attn_backend_bf16"):
        assert 1e-5 < measured[cause] < 1e-1, f"{cause}: {measured[cause]} is outside the precision band the bank states"
    assert f"{measured['bf16']:.1g} for bf16" in text and f"{measured['attn_backend_bf16']:.1g} for two bf16" in text
    assert "1e-6–1e-3" not in text and "up to ~1e-1" in text and "systematic shift" in text


def test_the_clip_is_not_said_to_fix_a_sampler_mismatch():
    clip, tis = get("ppo-clip"), get("truncated-is")
    assert "or a sampler mismatch" not in clip.answer
    assert "bounds π_θ/π_old and nothing else" in clip.answer and "importance weight π_old/μ" in clip.answer
    assert "centred on π_old" in clip.answer and "centred on π_old" in tis.answer


# ----------------------------------------------------------------------------- diffusion: mean vs sum over pixels


def test_pixel_mean_shrinks_log_ratios_by_d_and_the_bank_says_so():
    from minigrpo.diffusion.sampler import gaussian_logprob

    g = torch.Generator().manual_seed(1)
    x, m_old = torch.randn(2, 1, 16, 16, generator=g, dtype=torch.float64), torch.randn(2, 1, 16, 16, generator=g,
                                                                                           dtype=torch.float64)
    m_new, std = m_old + 0.01 * torch.randn(2, 1, 16, 16, generator=g, dtype=torch.float64), torch.full((2, 1, 1, 1), 0.3,
                                                                                                        dtype=torch.float64)
    log_ratio = {red: gaussian_logprob(x, m_new, std, red) - gaussian_logprob(x, m_old, std, red) for red in ("mean", "sum")}
    assert torch.allclose(log_ratio["sum"], 256 * log_ratio["mean"], rtol=1e-10)
    out = _cell_output("09_grpo_diffusion.ipynb", 'for reduction in ("mean", "sum"):')
    # rows "mean, ε = 0.001  0.265 ± 0.016 (0.248–0.279)  0.007 ± 0.002 (...)": clip fraction, max |log ratio|
    rows = {(m.group(1), float(m.group(2))): (float(m.group(3)), float(m.group(4)))
            for m in re.finditer(r"^\s*(mean|sum), ε = ([\d.]+)\s+([\d.]+) ± \S+ \(\S+\)\s+([\d.]+) ±", out, re.M)}
    assert len(rows) == 4, out
    text = _text("diffusion-loss")
    assert f"{rows[('mean', 0.001)][1]:.2g} with the mean and {rows[('sum', 0.001)][1]:.2g} with the sum" in text
    assert rows[("mean", 0.2)][0] == 0.0 and "on the mean never clips" in text
    assert "reacts strongly" not in text and "ε must shrink by about D" in text


# ----------------------------------------------------------------------------- attention


def test_causal_linear_attention_is_not_low_rank():
    g = torch.Generator().manual_seed(0)
    n, d = 16, 4
    fq, fk = (elu_feature_map(torch.randn(n, d, generator=g, dtype=torch.float64)) for _ in range(2))
    sim = fq @ fk.T
    assert torch.linalg.matrix_rank(sim) == d
    assert torch.linalg.matrix_rank(sim.tril()) == n
    text = _text("linear-attention")
    assert "only without the causal mask" in text and "fixed d × d_v state" in text


def test_gqa_shares_keys_within_a_group_and_shrinks_the_cache():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 16, generator=g, dtype=torch.float64)
    k, v = torch.randn(1, 2, 5, 16, generator=g, dtype=torch.float64), torch.randn(1, 2, 5, 16, generator=g,
                                                                                    dtype=torch.float64)
    # GQA-2 = MHA whose 8 heads read their group's K/V (heads 0-3 the first, 4-7 the second)
    kr, vr = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
    weights = torch.softmax((q[:, :, None] @ kr.transpose(-2, -1))[:, :, 0] / 4.0, -1)  # √16 = 4
    assert torch.allclose(decode_attention(q, k, v), (weights[:, :, None] @ vr)[:, :, 0], atol=1e-12)
    assert not torch.allclose(weights[:, 0], weights[:, 1])  # same keys, different queries: different patterns
    assert kv_cache_bytes(32, 32, 128, 4096, 1) == 4 * kv_cache_bytes(32, 8, 128, 4096, 1)
    text = _text("gqa")
    assert "attention pattern per query head are unchanged" not in text and "no longer independent" in text


def test_kv_cache_figures():
    text = _text("kv-cache-4x")
    sizes = [kv_cache_bytes(32, h, 128, 4096, 1) for h in (32, 8, 1)]
    assert sizes == [2 * 2**30, 512 * 2**20, 64 * 2**20]
    assert "2 GiB per sequence with 32 KV heads, 512 MiB with 8, 64 MiB with 1" in text


def test_attention_passes_half_the_flops_at_12_d_model():
    d = 4096
    n = figures.attention_half_length(d)
    assert n == 12 * d == 49152
    assert figures.attention_flops_per_token(n, d) == figures.MATMUL_FLOPS_PER_TOKEN * d * d
    text = _text("softmax-still-wins")
    assert "12·d_model" in text and f"{n:,} tokens for d_model = {d}" in text and "several times d_model" not in text


# ----------------------------------------------------------------------------- wording fixes and seed claims


def test_gae_does_not_call_the_advantage_the_ideal_weight():
    assert "ideal weight" not in _text("gae") and "variance-optimal" in _text("gae")


@pytest.mark.parametrize("qid,claim", [
    ("grpo-vs-reinforce", "\"REINFORCE uses one sample per update\" is false"),
    ("preference-data", "group normalisation does not require absolute rewards"),
    ("grpo-vs-ppo", "GRPO does not remove the reward model"),
    ("kl-placement", "The pseudocode of the “GRPO in depth” question set"),
    ("implement-grpo", "β·mean(logp_new − logp_ref)"),
])
def test_wrong_seed_claims_are_corrected_explicitly(qid, claim):
    normalise = " ".join
    assert normalise(claim.split()) in normalise(get(qid).answer.split())


def test_no_answer_repeats_a_corrected_claim():
    for q in QUESTIONS:
        text = q.answer + " ".join(q.checklist)
        assert "ideal weight" not in text and "low-rank attention\"," not in text, q.id


def test_group_advantages_are_not_a_ranking():
    first = group_advantages(torch.tensor([85.0, 92.0, 70.0], dtype=torch.float64), 3)[0].item()
    second = group_advantages(torch.tensor([71.0, 92.0, 70.0], dtype=torch.float64), 3)[0].item()
    assert first > 0 > second
    text = _text("group-normalisation")
    assert f"{first:+.2f} in the first group and {second:+.2f}".replace("-", "−") in text


@pytest.mark.parametrize("qid,claim", [
    ("group-advantage-example", "That is mean-centring only"),
    ("group-size", "is dated: DeepSeekMath sampled 64 per question"),
    ("memory", "π_old needs no stored logits"),
    ("diffusion-grpo", "you do not have the log-probability of a sampled image"),
])
def test_dated_or_wrong_seed_claims_are_corrected_explicitly(qid, claim):
    assert claim in get(qid).answer
