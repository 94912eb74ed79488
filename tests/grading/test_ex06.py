"""Grading tests for exercise 06 (GRPO for an LLM).

By default they grade solutions/06_grpo_llm.ipynb (and must pass). To grade your own work:
    python -m pytest tests/grading/test_ex06.py --grade-source exercises
Each item's cases run from tests/grading/test_items.py; the properties below go further than fixed
cases: they compare with the package on random batches, on a real model's samples, and check what
must hold for any input (what the off-by-one, the mask and the clip imply for values and gradients).
"""

import pytest
import torch

from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.sampling import generate, position_ids_from_mask
from minigrpo.llm.tokenizer import build_char_tokenizer
from minigrpo.losses import grpo_loss, token_logprobs

EXERCISE = "06"


def _batch(seed, B=5, P=4, C=6, V=13):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, P + C, V, generator=g, dtype=torch.float64) * 2
    ids = torch.randint(0, V, (B, P + C), generator=g)
    lengths = torch.randint(1, C + 1, (B,), generator=g)
    mask = (torch.arange(C)[None] < lengths[:, None]).long()
    return logits, ids, mask, P


# ----------------------------------------------------------------------------- 06.1 completion_token_logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.5, 1.3])
@pytest.mark.parametrize("seed", range(3))
def test_logprobs_match_the_package(learner_fn, seed, temperature):
    fn = learner_fn(EXERCISE, "completion_token_logprobs")
    logits, ids, mask, P = _batch(seed)
    expected = token_logprobs(logits[:, P - 1:], ids[:, P - 1:], temperature) * mask
    torch.testing.assert_close(fn(logits, ids, mask, P, temperature=temperature), expected, rtol=1e-9, atol=1e-12)


def test_only_the_predicting_columns_matter(learner_fn):
    """Logits before column P − 1 and at the last column predict no completion token: changing them changes nothing;
    changing column P − 1 changes the first completion token's log-prob."""
    fn = learner_fn(EXERCISE, "completion_token_logprobs")
    logits, ids, mask, P = _batch(10)
    base = fn(logits, ids, mask, P)
    other = logits.clone()
    other[:, : P - 1] = torch.randn_like(other[:, : P - 1])
    other[:, -1] = torch.randn_like(other[:, -1])
    torch.testing.assert_close(fn(other, ids, mask, P), base, rtol=1e-12, atol=1e-12)
    moved = logits.clone()
    moved[:, P - 1] += torch.randn_like(moved[:, P - 1])
    assert (fn(moved, ids, mask, P)[:, 0] - base[:, 0]).abs().min() > 0


def test_logprobs_are_nonpositive_and_zero_where_masked(learner_fn):
    fn = learner_fn(EXERCISE, "completion_token_logprobs")
    logits, ids, mask, P = _batch(11, B=8)
    out = fn(logits, ids, mask, P, temperature=0.7)
    assert out.shape == mask.shape
    assert (out <= 0).all()
    assert (out[mask == 0] == 0).all()
    assert (out[mask == 1] < 0).all()


def test_logprobs_match_a_real_samplers(learner_fn):
    """A tiny Llama samples with a KV cache; one forward pass over prompt + completion must score the same tokens."""
    fn = learner_fn(EXERCISE, "completion_token_logprobs")
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = make_tiny_model(tok, "llama", seed=0, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1).eval()
    gen = generate(model, tok, ["3,5,7>22:", "1+2=", "9,9>0:"], 4, 6, 0.9, generator=torch.Generator().manual_seed(0))
    ids, attn = gen.sequences, gen.attention_mask
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits
    out = fn(logits, ids, gen.completion_mask, gen.prompt_ids.shape[1], temperature=0.9)
    torch.testing.assert_close(out, gen.sampler_logprobs, rtol=0, atol=1e-4)


# ----------------------------------------------------------------------------- 06.2 grpo_loss


def _loss_batch(seed, B=6, C=7, spread=0.4):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, C, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = old + torch.randn(B, C, generator=g, dtype=torch.float64) * spread
    ref = old + torch.randn(B, C, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, C + 1, (B,), generator=g)
    mask = (torch.arange(C)[None] < lengths[:, None]).long()
    return logp, old, ref, adv, mask


def _value_and_grad(fn, logp, *args, **kwargs):
    logp = logp.clone().requires_grad_(True)
    loss = fn(logp, *args, **kwargs)
    loss.backward()
    return loss.detach(), logp.grad


def _package_loss(logp, old, ref, adv, mask, epsilon=0.2, beta=0.04):
    """The trainer's objective, ``losses.grpo_loss`` with loss_type="dapo" (one token mean), in float64."""
    return grpo_loss(logp, old, adv, mask, "dapo", epsilon, ref_logp=ref, beta=beta)[0]


@pytest.mark.parametrize("epsilon,beta", [(0.2, 0.04), (0.1, 0.0), (0.3, 0.5)])
@pytest.mark.parametrize("seed", range(3))
def test_loss_and_gradient_match_the_trainer(learner_fn, seed, epsilon, beta):
    fn = learner_fn(EXERCISE, "grpo_loss")
    batch = _loss_batch(seed)
    got = _value_and_grad(fn, *batch, epsilon=epsilon, beta=beta)
    expected = _value_and_grad(_package_loss, *batch, epsilon=epsilon, beta=beta)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-9, atol=1e-12)


def test_gradient_at_ratio_one_is_the_policy_gradient(learner_fn):
    """μ = 1, β = 0: d loss / d logp = −A · mask / (number of tokens) — REINFORCE with the group baseline."""
    fn = learner_fn(EXERCISE, "grpo_loss")
    logp, _, ref, adv, mask = _loss_batch(20)
    _, grad = _value_and_grad(fn, logp, logp.clone(), ref, adv, mask, beta=0.0)
    expected = -adv[:, None] * mask / mask.sum()
    torch.testing.assert_close(grad, expected.to(grad.dtype), rtol=1e-9, atol=1e-12)


def test_kl_gradient_is_one_minus_the_ratio_to_the_reference(learner_fn):
    """Zero advantages: only β·k3 is left, whose derivative in logp is β(1 − π_ref/π)."""
    fn = learner_fn(EXERCISE, "grpo_loss")
    logp, old, ref, _, mask = _loss_batch(21)
    beta = 0.3
    loss, grad = _value_and_grad(fn, logp, old, ref, torch.zeros(logp.shape[0], dtype=torch.float64), mask, beta=beta)
    n = mask.sum()
    torch.testing.assert_close(grad, beta * (1 - torch.exp(ref - logp)) * mask / n, rtol=1e-9, atol=1e-12)
    assert loss >= 0, "k3 is non-negative for every token, so with zero advantages the loss must be >= 0"


def test_clipped_tokens_get_no_surrogate_gradient(learner_fn):
    """A > 0 and ρ > 1 + ε, or A < 0 and ρ < 1 − ε: the min picks the constant clipped term; β = 0 leaves no gradient."""
    fn = learner_fn(EXERCISE, "grpo_loss")
    old = torch.full((2, 3), -1.0, dtype=torch.float64)
    logp = old + torch.log(torch.tensor([[1.5, 1.3, 1.05], [0.5, 0.7, 0.95]], dtype=torch.float64))
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    _, grad = _value_and_grad(fn, logp, old, old.clone(), adv, torch.ones(2, 3, dtype=torch.long), beta=0.0)
    assert (grad[:, :2] == 0).all(), "clipped tokens must not receive a gradient"
    assert (grad[:, 2] != 0).all(), "tokens inside the clip range must receive a gradient"


def test_padding_the_batch_changes_nothing(learner_fn):
    """Extra masked columns (a wider batch) with any values: same loss, same gradient on the real tokens."""
    fn = learner_fn(EXERCISE, "grpo_loss")
    logp, old, ref, adv, mask = _loss_batch(22)
    base = _value_and_grad(fn, logp, old, ref, adv, mask)
    extra = torch.full((logp.shape[0], 3), -0.2, dtype=torch.float64)
    wide = [torch.cat([t, extra * k], 1) for t, k in [(logp, 1.0), (old, 5.0), (ref, 9.0)]]
    wide_mask = torch.cat([mask, torch.zeros(mask.shape[0], 3, dtype=mask.dtype)], 1)
    loss, grad = _value_and_grad(fn, *wide, adv, wide_mask)
    torch.testing.assert_close(loss, base[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad[:, : mask.shape[1]], base[1], rtol=1e-12, atol=1e-12)
    assert (grad[:, mask.shape[1]:] == 0).all()


def test_every_token_weighs_the_same(learner_fn):
    """DAPO's token mean: the loss is unchanged when each sequence is split into one-token sequences."""
    fn = learner_fn(EXERCISE, "grpo_loss")
    logp, old, ref, adv, mask = _loss_batch(23)
    keep = mask.bool()
    flat = [t[keep].reshape(-1, 1) for t in (logp, old, ref)]
    flat_adv = adv[:, None].expand_as(logp)[keep]
    whole = fn(logp, old, ref, adv, mask)
    split = fn(*flat, flat_adv, torch.ones_like(flat[0], dtype=torch.long))
    torch.testing.assert_close(split, whole, rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- 06.3 aggregate_loss


def _token_losses(seed, B=6, C=9):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, C, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, C + 1, (B,), generator=g)
    lengths[0] = C  # at least one full row, and (often) an empty one
    return x, (torch.arange(C)[None] < lengths[:, None]).long()


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("seed", range(3))
def test_aggregation_matches_the_package(learner_fn, seed, loss_type):
    """TRL's three reductions as the package's losses.aggregate computes them, on random float64 batches."""
    from minigrpo.losses import aggregate

    fn = learner_fn(EXERCISE, "aggregate_loss")
    x, mask = _token_losses(seed)
    L = 16 if seed == 2 else None
    got = fn(x, mask, loss_type, L) if L is not None else fn(x, mask, loss_type)
    torch.testing.assert_close(got, aggregate(x, mask, loss_type, max_completion_length=L), rtol=1e-9, atol=1e-12)


def test_dr_grpo_weights_do_not_depend_on_any_length(learner_fn):
    """Dr. GRPO's point: a token's weight (d loss / d its loss) is 1 / (B · L_max) whatever the lengths of its
    completion and of the others; with 'grpo' it is 1 / (B · L_b), with 'dapo' 1 / Σ L."""
    fn = learner_fn(EXERCISE, "aggregate_loss")
    x, mask = _token_losses(5)
    B, C = x.shape
    lengths = mask.sum(-1, keepdim=True).double()
    expected = {"dr_grpo": torch.full_like(x, 1 / (B * 20)), "grpo": 1 / (B * lengths.clamp(min=1)).expand_as(x),
                "dapo": torch.full_like(x, 1 / float(mask.sum()))}
    for loss_type, weight in expected.items():
        leaf = x.clone().requires_grad_(True)
        fn(leaf, mask, loss_type, 20).backward() if loss_type == "dr_grpo" else fn(leaf, mask, loss_type).backward()
        torch.testing.assert_close(leaf.grad, weight * mask, rtol=1e-12, atol=1e-15, msg=loss_type)
