"""Lesson 06's ablation plumbing (``minigrpo_course.experiments.grpo_ablations``), its task (``tasks.PrefixTask``), and
lesson 07's training runs of planted bugs (``minigrpo_course.debugging.bug_runs``)."""

import random

import pytest
import torch

import minigrpo_course.debugging.bug_runs as bug_runs
from minigrpo_course.debugging.bug_runs import RunConfig, StaleSampler, train_teaching_step
from minigrpo_course.debugging.detections import debugging_setup
from minigrpo_course.experiments.grpo_ablations import LengthByCorrectness, length_table, temperature_mismatch
from minigrpo.llm.grpo import GRPOConfig
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.tasks import AdditionTask, PrefixTask
from minigrpo.llm.tokenizer import build_char_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread_module")


def test_prefix_task_accepts_every_prefix_in_range():
    task = PrefixTask(min_len=2, max_len=8, eval_size=10)
    p = task.problem_from_prompt("copy 37159264:")
    assert [task.correctness_reward(p, c) for c in ("3", "37", "3715", "37159264", "37259264", "371592640")] == \
        [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert task.correctness_reward(p, "37", finished=False) == 0.0
    rng = random.Random(0)
    lengths = set()
    for _ in range(200):
        q = task.sample(rng)
        lengths.add(len(q.answer))
        assert task.correctness_reward(q, q.answer) == 1.0
        slip = task.noisy_answer(q, rng)
        assert len(slip) == len(q.answer) and task.correctness_reward(q, slip) == 0.0
    assert lengths == set(range(2, 9))  # the teacher's lengths cover the range
    with pytest.raises(ValueError, match="min_len"):
        PrefixTask(min_len=5, max_len=3)
    with pytest.raises(ValueError, match="not a prompt"):
        task.problem_from_prompt("copy 12:")


def test_length_by_correctness_splits_lengths():
    task = LengthByCorrectness(PrefixTask(eval_size=10))
    p = task.task.problem_from_prompt("copy 37159264:")
    rewards, m = task.score([p] * 3, ["37", "3715", "99"], [True] * 3, [[1, 2, 0], [1, 2, 3, 4, 0], [5, 5, 0]])
    assert rewards == [1.1, 1.1, 0.1]
    assert m["length/correct"] == 4.0 and m["length/wrong"] == 3.0  # tokens incl. EOS: (3 + 5) / 2; 3


def test_length_table_reports_mean_and_spread():
    rows = [{"loss_type": "grpo", "seed": s, "length_start": 5.0, "length_end": e, "length_right_end": 3.0,
             "length_wrong_end": float("nan"), "correct_end": 0.5} for s, e in ((0, 3.0), (1, 5.0))]
    text = length_table(rows)
    assert "4.00 ±  1.00" in text and "—" in text


def test_temperature_mismatch_leaves_the_ratio_at_one_and_shows_in_the_gap():
    """The trainer rescores π_old at its own temperature: ρ = 1 whatever the sampler did; the sampler–trainer gap
    is float rounding when the temperatures agree and large when they do not."""
    tok = build_char_tokenizer()
    model = make_tiny_model(tok, "llama", seed=0, hidden_size=32)
    cfg = GRPOConfig(prompts_per_step=2, num_generations=4, max_steps=1, eval_every=0)
    same, diff = temperature_mismatch(model, tok, AdditionTask(eval_size=10), ((0.7, 0.7), (0.7, 1.0)), cfg)
    for row in (same, diff):
        assert row["ratio_min"] == row["ratio_max"] == 1.0
    assert same["gap_max"] < 1e-4 and diff["gap_max"] > 1e-2
    assert abs(same["is_mean"] - 1) < 1e-4 and abs(diff["is_mean"] - 1) > 1e-3


def test_stale_sampler_samples_with_the_weights_of_lag_rollouts_ago(monkeypatch):
    seen = []
    monkeypatch.setattr(bug_runs, "generate", lambda m, *a, **k: seen.append(m.weight.item()))
    model = torch.nn.Linear(1, 1, bias=False)
    sampler = StaleSampler(lag=2)
    for version in range(5):
        with torch.no_grad():
            model.weight.fill_(version)
        sampler(model)
    assert seen == [0.0, 0.0, 0.0, 1.0, 2.0]  # not stale until there are lag older versions
    with pytest.raises(ValueError, match="lag"):
        StaleSampler(lag=0)


@pytest.fixture(scope="module")
def setup():
    return debugging_setup(seed=0)


def test_old_logp_after_step_switches_the_clip_off(setup):
    """At μ = 4 the correct step's ratio leaves 1 after the first inner step and some tokens are clipped (seed 0:
    max |ρ − 1| ≈ 1 at the last inner step); with the planted bug ρ = 1 at every inner step and nothing is clipped."""
    cfg = RunConfig(steps=2, prompts=4, num_iterations=4, learning_rate=3e-3)
    good = train_teaching_step(*setup, (), cfg)
    bad = train_teaching_step(*setup, ("old_logp_after_step",), cfg)
    assert set(good) >= {"reward", "length", "finished", "ratio_first", "ratio_last", "clip_frac", "nan"}
    assert good["ratio_first"].max() < 1e-6 and good["ratio_last"].min() > 0.05
    assert bad["ratio_last"].max() < 1e-6 and bad["clip_frac"].max() == 0.0


def test_pass_at_k_unbiased_estimate():
    from minigrpo_course.experiments.grpo_ablations import pass_at_k
    # n = 4, c = 1: pass@1 = 1/4, pass@2 = 1 − C(3,2)/C(4,2) = 1/2; c = 0 → 0; c = 4 → 1
    assert pass_at_k([1], 4, 1) == pytest.approx(0.25) and pass_at_k([1], 4, 2) == pytest.approx(0.5)
    assert pass_at_k([0, 4], 4, 3) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k([1], 4, 5)
