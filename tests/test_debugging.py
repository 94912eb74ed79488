"""Lesson 07's package: the teaching copy with planted bugs, the detections, the ratio study."""

import ast
from pathlib import Path

import pytest
import torch

from minigrpo_course.debugging.buggy_step import BUGS, StepConfig, buggy_grpo_step, check_bugs, make_batch
from minigrpo_course.debugging.detections import DETECTIONS, debugging_setup, run_detections
from minigrpo_course.debugging.ratio_study import CAUSES, log_ratios, summarise

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_torch_thread_module")  # one torch thread, restored afterwards (conftest.py)


@pytest.fixture(scope="module")
def setup():
    return debugging_setup(seed=0)


def test_the_real_trainer_never_imports_the_teaching_copy():
    for path in (ROOT / "minigrpo" / "llm").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not any("debugging" in name for name in names), f"{path.name} imports the teaching copy"


def test_setup_has_pad_equal_to_eos_and_completions_that_end(setup):
    model, tok = setup
    assert tok.pad_token_id == tok.eos_token_id
    b = make_batch(model, tok, ["12+34=", "45+67="], 4, 6, 0.7)
    assert b.gen.finished.any() and (b.gen.completion_mask == 0).any()  # there are tokens after an EOS


def test_every_detection_passes_without_bugs(setup):
    """Measured (benchmarks/margins_models.py, setup seeds 0–4 × torch threads 1, 2): every detection passes in
    all 10 runs; the largest value is 1.4% of its threshold (the exact-zero ones are exactly 0)."""
    failed = [str(d) for d in run_detections(*setup) if not d.passed]
    assert not failed, failed


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_bug_alone_is_caught(setup, bug):
    """Measured (benchmarks/margins_models.py, setup seeds 0–4 × torch threads 1, 2): every bug is caught in all
    10 runs, the catching detection's value at least 7,500 times its threshold (prompt_in_loss, the weakest)."""
    caught = [d.name for d in run_detections(*setup, bugs={bug}) if not d.passed]
    assert caught, f"no detection catches {bug}"


def test_a_detection_accepts_any_step_function(setup):
    def step(model, ref, batch, opt, cfg):
        return buggy_grpo_step(model, ref, batch, opt, cfg, bugs={"ref_no_temperature"})

    assert not DETECTIONS["kl_zero_at_step0"](*setup, step=step).passed
    assert DETECTIONS["logprobs_match_sampler"](*setup, step=step).passed


def test_detections_leave_the_callers_model_untouched(setup):
    model, tok = setup
    before = [p.detach().clone() for p in model.parameters()]
    DETECTIONS["old_logp_is_rollout_policy"](model, tok)  # takes Adam steps, on a copy
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_unknown_bug_name_is_an_error():
    with pytest.raises(ValueError, match="unknown bug"):
        check_bugs({"off_by_two"})


def test_step_without_reference_refuses_a_kl(setup):
    model, tok = setup
    b = make_batch(model, tok, ["1+1="], 2, 3, 0.7)
    with pytest.raises(ValueError, match="reference"):
        buggy_grpo_step(model, None, b, torch.optim.SGD(model.parameters(), lr=0.0), StepConfig(beta=0.1))


def test_on_policy_gradient_equals_reinforce_with_group_baseline(setup):
    """No bugs, μ = 1, β = 0: the step's gradient is the token-mean REINFORCE gradient (float64 autograd)."""
    import copy

    from minigrpo.advantages import group_advantages
    from minigrpo_course.debugging.ratio_study import score
    model, tok = setup
    m = copy.deepcopy(model).double()
    b = make_batch(m, tok, ["12+34=", "45+67="], 4, 6, 0.7)
    rec = buggy_grpo_step(m, None, b, torch.optim.SGD(m.parameters(), lr=0.0), StepConfig())
    m.zero_grad()
    logp = score(m, b.gen, 0.7)
    mask = b.gen.completion_mask.double()
    adv = group_advantages(b.rewards, 4).double()  # the step works with the batch's float32 rewards
    (-(logp * adv[:, None] * mask).sum() / mask.sum()).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in m.parameters() if p.grad is not None])
    torch.testing.assert_close(rec.grad, expected, rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- the ratio study

def ratio_deviations(model, tokenizer, seed: int = 0) -> dict[str, float]:
    """max |log ρ| over the completion tokens of one batch, for each cause of :data:`CAUSES` alone."""
    return {cause: summarise(log_ratios(model, tokenizer, cause, seed=seed))["max_abs"] for cause in CAUSES}


@pytest.fixture(scope="module")
def deviations(setup):
    return ratio_deviations(*setup)


#: max |log ρ| bounds: the baseline (two fp32 forwards of the same batch) stays below BASELINE_MAX; every
#: cause of a mismatch or a moved policy exceeds MIN_CAUSE_DEVIATION, except the two KV-cache ones, which
#: stay below KV_CACHE_MAX on CPU (see BELOW_THRESHOLD_ON_CPU).
BASELINE_MAX, MIN_CAUSE_DEVIATION, KV_CACHE_MAX = 1e-5, 1e-3, 1e-4

#: On CPU the KV-cached, left-padded sampler agrees with one forward pass to ~1e-6 in fp32 and exactly in
#: bf16 (as measured, see test_each_cause_moves_the_ratio), so those two are not "clearly above" the baseline;
#: a different attention kernel (SDPA vs eager) in bf16 is. The lesson reports all three.
BELOW_THRESHOLD_ON_CPU = {"kv_cache_fp32", "kv_cache_bf16"}


def test_baseline_ratio_is_one(deviations):
    """Old and new are the same fp32 forward of the same batch. Measured (benchmarks/margins_models.py, seeds
    0–4 of the setup and the batch × torch threads 1, 2): exactly 0.0 in all 10 runs; asserted < 1e-5."""
    assert deviations["baseline"] < BASELINE_MAX


@pytest.mark.parametrize("cause", [c for c in CAUSES if c != "baseline"])
def test_each_cause_moves_the_ratio(deviations, cause):
    """Each cause alone moves max |log ρ| clearly above the baseline, except the KV cache on CPU.

    Measured (benchmarks/margins_models.py, seeds 0–4 of the setup and the batch × torch threads 1, 2), range over
    the 10 runs: mu_gt_1 0.19–0.97, minibatches 0.15–1.5, dropout 0.88–5.7, temperature 1.3–1.8, top_k
    0.46–1.0, top_p 0.22–0.22, bf16 0.030–0.051, attn_backend_bf16 0.022–0.048, stale_weights 0.16–1.4:
    smallest 0.022, asserted > 1e-3. kv_cache_fp32 9.5e-7–1.9e-6 and kv_cache_bf16 exactly 0: asserted < 1e-4.
    """
    if cause in BELOW_THRESHOLD_ON_CPU:
        assert deviations[cause] < KV_CACHE_MAX, (cause, deviations[cause])
    else:
        assert deviations[cause] > MIN_CAUSE_DEVIATION, (cause, deviations[cause])


def test_top_k_rescored_without_truncation_lowers_every_log_prob(setup):
    """Truncating to the top k renormalises over fewer tokens: each kept token's sampler log-prob is higher."""
    lr = log_ratios(*setup, "top_k")
    assert (lr <= 1e-6).all() and (lr < 0).any()


def test_unknown_cause_is_an_error(setup):
    with pytest.raises(ValueError, match="unknown cause"):
        log_ratios(*setup, "cosmic_rays")


def test_the_grader_knows_every_planted_bug():
    """Exercise 07's items carry each bug as a typical mistake (tests/test_grading.py checks each fails with its hint)."""
    from minigrpo_course.grading.ex07 import ITEMS
    named = {w.name for item in ITEMS if item.function == "grpo_step" for w in item.wrong_answers}
    assert set(BUGS) <= named  # (and learner-style steps with the mistakes inner step 0 and ref = policy hide)
