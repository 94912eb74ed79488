"""Grading tests for exercise 07 (debugging a GRPO step).

By default they grade solutions/07_debugging_grpo.ipynb (and must pass). To grade your own work:
    python -m pytest tests/grading/test_ex07.py --grade-source exercises
Each item's cases run from tests/grading/test_items.py; the properties below go further: the repaired step
against a float64 autograd reference, on a second seed and another temperature, with the KL in the loss, and the
truncated-IS weights against their definition on random inputs.
"""

import copy

import pytest
import torch

from minigrpo.advantages import group_advantages
from minigrpo_course.debugging.buggy_step import StepConfig, buggy_grpo_step, make_batch
from minigrpo_course.debugging.detections import debugging_setup, run_detections
from minigrpo.losses import kl_estimate
from minigrpo_course.debugging.ratio_study import score

EXERCISE = "07"


pytestmark = pytest.mark.usefixtures("one_torch_thread_module")  # one torch thread, restored afterwards (conftest.py)


@pytest.fixture(scope="module")
def setup():
    return debugging_setup(seed=1)  # another model than the notebook's checks use


def test_every_detection_passes_on_another_model(learner_fn, setup):
    step = learner_fn(EXERCISE, "grpo_step")
    failed = [str(d) for d in run_detections(*setup, step=step) if not d.passed]
    assert not failed, failed


def _flat_grad(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("temperature", [0.6, 1.3])
def test_on_policy_gradient_is_reinforce_plus_the_kl_gradient(learner_fn, setup, temperature):
    """μ = 1, β = 0.1, float64: the gradient is −Σ A·∇log π / N + β·∇k3 (autograd on the package's pieces)."""
    step = learner_fn(EXERCISE, "grpo_step")
    model, tok = setup
    m = copy.deepcopy(model).double()
    ref = copy.deepcopy(m).eval().requires_grad_(False)
    with torch.no_grad():  # move the reference away from the policy so that the KL has a gradient
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    b = make_batch(m, tok, ["12+34=", "45+67=", "9+9="], 4, 6, temperature, seed=3)
    rec = step(m, ref, b, torch.optim.SGD(m.parameters(), lr=0.0), StepConfig(beta=0.1))
    m.zero_grad()
    logp, ref_logp = score(m, b.gen, temperature), score(ref, b.gen, temperature).detach()
    mask = b.gen.completion_mask.double()
    adv = group_advantages(b.rewards, 4).double()
    per_tok = -logp * adv[:, None] + 0.1 * kl_estimate(logp, ref_logp, "k3")
    ((per_tok * mask).sum() / mask.sum()).backward()
    torch.testing.assert_close(rec.grad, _flat_grad(m), rtol=1e-7, atol=1e-10)


def test_inner_steps_match_the_teaching_copy(learner_fn, setup):
    """μ = 3 with Adam: the same ratios and losses as the teaching copy with no bug."""
    step = learner_fn(EXERCISE, "grpo_step")
    model, tok = setup
    b = make_batch(model, tok, ["12+34=", "50+50="], 4, 6, 0.8, seed=5)
    records = []
    for fn in (step, lambda *a: buggy_grpo_step(*a, bugs=())):
        m = copy.deepcopy(model)
        records.append(fn(m, None, b, torch.optim.Adam(m.parameters(), lr=3e-3), StepConfig(num_iterations=3)))
    got, expected = records
    assert len(got.loss) == 3
    for i in range(3):
        assert got.loss[i] == pytest.approx(expected.loss[i], rel=1e-4, abs=1e-6)
        torch.testing.assert_close(got.ratio[i] * b.gen.completion_mask, expected.ratio[i] * b.gen.completion_mask,
                                   rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_tis_weights_match_their_definition(learner_fn, seed):
    fn = learner_fn(EXERCISE, "tis_weights")
    g = torch.Generator().manual_seed(seed)
    t = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 3
    s = t + torch.randn(5, 7, generator=g, dtype=torch.float64)
    mask = (torch.rand(5, 7, generator=g) > 0.2).long()
    cap = 1.0 + seed
    t.requires_grad_(True)
    w = fn(t, s, mask, cap)
    assert not w.requires_grad
    expected = torch.where(mask.bool(), torch.exp(t.detach() - s).clamp(max=cap), torch.zeros_like(s))
    torch.testing.assert_close(w, expected, rtol=1e-12, atol=1e-12)
    assert (w <= cap).all() and (w >= 0).all()


def test_tis_rejects_a_non_positive_cap(learner_fn):
    fn = learner_fn(EXERCISE, "tis_weights")
    with pytest.raises(ValueError):
        fn(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 0.0)


def test_by_design_excludes_every_mismatch(learner_fn):
    answer = set(learner_fn(EXERCISE, "ratio_by_design")())
    assert {"mu_gt_1", "minibatches"} <= answer
    assert not answer & {"dropout", "temperature", "top_k", "top_p", "bf16", "kv_cache_fp32", "attn_backend_bf16",
                         "stale_weights"}
