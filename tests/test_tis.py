"""Truncated importance sampling in the GRPO trainer (``vllm_importance_sampling_correction``).

w = min(exp(old_logp_trainer − sampler_logp), C), detached, multiplies each token's clipped surrogate.
"""

import math

import pytest
import torch

import minigrpo.llm.grpo as grpo_module
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.sampling import generate
from minigrpo.llm.tasks import AdditionTask
from minigrpo.llm.tokenizer import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _step(tok, monkeypatch=None, shift=0.0, model_seed=7, **kw):
    """One GRPO step with lr = 0 on a fresh model made with ``model_seed``; returns (metrics, flat gradient).

    ``shift`` is subtracted from the sampler's recorded log-probs: a synthetic sampler/trainer mismatch
    (the sampler believes its tokens were exp(shift) times less likely than the trainer does)."""
    if shift:
        def shifted(*args, **kwargs):
            g = generate(*args, **kwargs)
            g.sampler_logprobs = (g.sampler_logprobs - shift) * g.completion_mask
            return g
        monkeypatch.setattr(grpo_module, "generate", shifted)
    model = make_tiny_model(tok, "llama", seed=model_seed, hidden_size=32)
    cfg = GRPOConfig(prompts_per_step=4, num_generations=4, eval_every=0, max_steps=1, learning_rate=0.0,
                     max_grad_norm=1e9, loss_type="dapo", **kw)
    trainer = GRPOTrainer(model, tok, AdditionTask(eval_size=10), cfg)
    trainer.task.reward = lambda p, t, f=True: float(len(t))  # a spread in (almost) every group
    metrics = trainer.step()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    return metrics, grad


#: Float32 rounding bounds of the sampler's and the trainer's code paths at the same weights.
GAP_MAX, WEIGHT_OFF_ONE_MAX = 1e-5, 1e-4


def test_without_a_mismatch_the_correction_changes_nothing(tok):
    """Measured (benchmarks/margins_models.py, model seeds 0–7, the test's 7 included, × torch threads 1, 2):
    sampler/trainer gap 6.4e-8–1.6e-7 (asserted < 1e-5), max |w − 1| 4.8e-7 in every run (asserted < 1e-4)."""
    off_metrics, off = _step(tok)
    on_metrics, on = _step(tok, vllm_importance_sampling_correction=True)
    assert off.abs().max() > 0
    torch.testing.assert_close(on, off, rtol=1e-4, atol=1e-8)
    # same weights, same fp32 path: every weight is 1 up to float32 rounding of the two code paths
    assert abs(on_metrics["sampling/importance_sampling_ratio/min"] - 1) < WEIGHT_OFF_ONE_MAX
    assert abs(on_metrics["sampling/importance_sampling_ratio/max"] - 1) < WEIGHT_OFF_ONE_MAX
    assert on_metrics["sampling/sampling_logp_difference/mean"] < GAP_MAX
    assert "sampling/importance_sampling_ratio/mean" not in off_metrics  # off: the dashboard is as before


def test_weights_are_capped_at_c(tok, monkeypatch):
    """Sampler log-probs 2 nats lower: every raw weight is e² ≈ 7.4 > C = 3, so all are capped and the
    (token-mean, ratio-1) gradient is exactly C times the uncorrected one."""
    _, off = _step(tok, monkeypatch, shift=2.0)
    metrics, on = _step(tok, monkeypatch, shift=2.0, vllm_importance_sampling_correction=True,
                        vllm_importance_sampling_clip_max=3.0)
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(3.0)
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(3.0)
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx(2.0, abs=1e-4)
    torch.testing.assert_close(on, 3.0 * off, rtol=1e-4, atol=1e-8)


def test_weights_below_the_cap_are_the_likelihood_ratio(tok, monkeypatch):
    """Sampler log-probs 1 nat higher: the weight is e^−1 for every token (no truncation from below)."""
    _, off = _step(tok, monkeypatch, shift=-1.0)
    metrics, on = _step(tok, monkeypatch, shift=-1.0, vllm_importance_sampling_correction=True)
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(math.exp(-1), rel=1e-4)
    torch.testing.assert_close(on, math.exp(-1) * off, rtol=1e-4, atol=1e-8)


def test_cap_must_be_positive():
    with pytest.raises(ValueError, match="clip_max"):
        GRPOConfig(vllm_importance_sampling_clip_max=0.0)
