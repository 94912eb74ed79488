"""Derivation drills (each step's key against hand-computed values), blank-page coding drills (the
hidden tests fail on an empty file and pass on the reference answers; a verdict names the failing
case), and the "spot the flaw" cards."""

import io
import math
from datetime import datetime, timedelta
from itertools import product

import pytest
import torch

from minigrpo_course.cli import main
from minigrpo_course.interview import get
from minigrpo_course.interview.bank import BankFormatError
from minigrpo_course.interview.coding import (blank_page, check, elapsed, get_code_drill, load_code_drills, load_function,
                                              parse_code_drill, start, verdict)
from minigrpo_course.interview.drills import DRILLS, evaluate, get_drill, is_correct, key_text, run_drill
from minigrpo_course.interview.flaws import load_flaws, parse_flaws, run_flaws

# ----------------------------------------------------------------------------- derivation drills


def _w_by_enumeration(p: float, G: int, eps: float = 1e-4) -> float:
    """w_G(p) from first principles: every outcome of the other G − 1 answers, sample std, plain Python."""
    total = 0.0
    for r1 in (0, 1):
        for others in product((0, 1), repeat=G - 1):
            r = (r1, *others)
            mean = sum(r) / G
            std = math.sqrt(sum((x - mean) ** 2 for x in r) / (G - 1))
            a1 = 0.0 if std == 0 else (r1 - mean) / (std + eps)
            prob = math.prod(p if x else 1 - p for x in others)
            total += (1 if r1 else -1) * prob * a1
    return total


HAND = {
    # rewards [1, 0, 2], V [0.5, 1, 1.5], V(s_3) = 2, γ = 0.9, λ = 0.8: δ = [1.4, 0.35, 2.3]
    "gae": [2.3, 0.35, 0.35 + 0.72 * 2.3, 1.4 + 0.72 * (0.35 + 0.72 * 2.3), 1.4,
            1 + 0 + 0.81 * 2 + 0.729 * 2.0 - 0.5, "a"],
    # F = [[2, .5], [.5, 1]], g = [1, 1], δ = 0.01: x = [0.5, 1.5] / 1.75
    "trpo-step": [0.5 / 1.75, 1.5 / 1.75, 2 / 1.75, math.sqrt(0.02 / (2 / 1.75)), 0.01, "b"],
    "clip-gradient": [1.1 * 2, 0.0, 0.5, 0.0, -1.5],
    "group-weight": [1 / math.sqrt(2), 1 / math.sqrt(2), 7 / math.sqrt(8), 7 / 8,
                     _w_by_enumeration(0.02, 8) / _w_by_enumeration(0.5, 8), 1 / math.sqrt(0.02 * 0.98) / 2],
    "k3-gradient": [0.5 - 1 + math.log(2), 0.5, "b", "c", 0.5 * math.log(1.25) + 0.3 * math.log(0.75)],
    "kv-cache": [2 * 8 * 128 * 2, 2 * 8 * 128 * 2 * 32 / 1024, 16.0, 64.0, 8.0],
}


@pytest.mark.parametrize("drill_id", list(DRILLS))
def test_every_step_key_equals_the_hand_computation(drill_id):
    drill = DRILLS[drill_id]
    assert set(DRILLS) == set(HAND) and get(drill.bank)
    assert len(drill.steps) == len(HAND[drill_id])
    for step, hand in zip(drill.steps, HAND[drill_id]):
        key = step.answer()
        if isinstance(hand, str):
            assert step.is_choice and key == hand, step.prompt
        else:
            assert not step.is_choice and math.isclose(key, hand, rel_tol=1e-3, abs_tol=1e-3), (step.prompt, key, hand)
            assert is_correct(step, f"{hand:.4g}"), "a reply rounded to 4 digits is accepted"
            assert not is_correct(step, f"{hand * 1.05 + 0.1:.4g}"), "a reply 5% off is not"


def test_evaluate_accepts_numbers_and_arithmetic_only():
    assert evaluate("2.3") == 2.3 and evaluate("0.9*1.5 - 1") == pytest.approx(0.35)
    assert evaluate("sqrt(2*0.01/1.142857)") == pytest.approx(0.13229, rel=1e-4)
    assert evaluate("√2 / 2") == pytest.approx(2**-0.5) and evaluate("7/8") == 0.875 and evaluate("2^10") == 1024
    assert evaluate("−1.5") == -1.5 and evaluate("1,024") == 1024 and evaluate("ln(2)") == pytest.approx(math.log(2))
    for bad in ("__import__('os')", "x + 1", "1/0", "2**1000", "", "[1]"):
        with pytest.raises(ValueError, match="expected a number or arithmetic"):
            evaluate(bad)


def test_a_drill_checks_each_step_hints_then_reveals(capsys):
    drill = get_drill("clip-gradient")
    # step 1 right; step 2: a non-number (re-asked, no try lost), wrong, wrong -> revealed; steps 3-5 right
    replies = "2.2\nwhat?\n1\n1.2\n0.5\n0\n-1.5\n"
    out = io.StringIO()
    first, answered = run_drill(drill, io.StringIO(replies), out)
    text = out.getvalue()
    assert (first, answered) == (4, 5)
    assert "expected a number or arithmetic" in text and "✗ not quite. Hint: which of 1.5·A and 1.2·A" in text
    assert "✗ the answer is 0." in text and "4 of 5 steps right at the first try" in text


def test_a_drill_stops_on_q_and_lists():
    out = io.StringIO()
    assert run_drill(get_drill("kv-cache"), io.StringIO("4096\nq\n"), out) == (1, 1)
    assert "stopped: 1 of 1" in out.getvalue()
    with pytest.raises(ValueError, match="no derivation drill 'x'; drills: gae"):
        get_drill("x")
    assert key_text(get_drill("clip-gradient").steps[1]) == "0"


def test_the_drill_command(capsys):
    assert main(["interview", "--drill"]) == 0
    out = capsys.readouterr().out
    assert all(f"--drill {d} " in out for d in DRILLS)


# ----------------------------------------------------------------------------- coding drills

CODE = load_code_drills()


def test_the_six_coding_drills_reuse_the_graders_hidden_tests():
    assert set(CODE) == {"grpo-loss", "token-logprobs", "tis-weights", "diffusion-logprob", "gqa-decode",
                         "causal-linear-attention"}
    from minigrpo_course.grading import get_item

    assert CODE["grpo-loss"].item() is get_item("06.2") and CODE["token-logprobs"].item() is get_item("06.1")
    assert CODE["tis-weights"].item().function == "tis_weights" and CODE["diffusion-logprob"].item() is get_item("09.1")
    for d in CODE.values():
        assert len(d.item().cases) >= 4, f"{d.id}: too few hidden cases"


@pytest.mark.parametrize("drill_id", sorted(CODE))
def test_hidden_tests_fail_on_an_empty_file_and_pass_on_the_reference(tmp_path, drill_id):
    drill = CODE[drill_id]
    empty = tmp_path / "empty.py"
    empty.write_text("")
    result, _ = check(drill, empty)
    assert not result.passed and result.n_passed == 0
    assert "defines no function" in verdict(drill, result, None)
    blank, created = start(drill, tmp_path / "blank.py")
    assert created and blank.read_text().startswith("# Coding drill:")
    assert load_function(blank, drill.function) is None, "the blank page holds no code"
    assert not check(drill, blank)[0].passed
    answer = tmp_path / "answer.py"
    answer.write_text(drill.reference)
    result, _ = check(drill, answer)
    assert result.passed and len(result.cases) == len(drill.item().cases), result.report()


@pytest.mark.parametrize("drill_id,old,new,hint", [
    ("grpo-loss", "return (per_token * m).sum() / m.sum().clamp(min=1)", "return per_token.mean()",
     "average over the completion tokens only"),
    ("gqa-decode", "qg = q.reshape(B, Hkv, Hq // Hkv, d)",  # the classic: repeat tiles the KV heads (h % Hkv)
     "k_cache, v_cache = k_cache.repeat(1, Hq // Hkv, 1, 1), v_cache.repeat(1, Hq // Hkv, 1, 1); Hkv = Hq; "
     "qg = q.reshape(B, Hkv, 1, d)", "query head h belongs to KV head h // (Hq/Hkv)"),
    ("causal-linear-attention", ".cumsum(dim=2)  # [B, H, T, d, d_v]",
     ".sum(dim=2, keepdim=True)  # [B, H, T, d, d_v]", None),
    ("tis-weights", ".clamp(max=cap)", ".clamp(1 / cap, cap)", "truncated IS caps the weight from above only"),
])
def test_the_verdict_names_the_failing_case(tmp_path, drill_id, old, new, hint):
    drill = CODE[drill_id]
    assert old in drill.reference
    path = tmp_path / "mine.py"
    path.write_text(drill.reference.replace(old, new))
    result, _ = check(drill, path)
    text = verdict(drill, result, None)
    assert not result.passed and f"failed case: {result.first_failure.case.name}" in text and "input:" in text
    if hint:
        assert hint in text


def test_a_file_that_does_not_run_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def grpo_loss(:\n    pass\n")
    with pytest.raises(ValueError, match=r"bad.py, line 1: "):
        check(CODE["grpo-loss"], path)
    path.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match="raised RuntimeError when run: boom"):
        check(CODE["grpo-loss"], path)
    with pytest.raises(ValueError, match="does not exist"):
        check(CODE["grpo-loss"], tmp_path / "missing.py")


def test_the_clock_starts_with_the_blank_page(tmp_path):
    drill = CODE["tis-weights"]
    t0 = datetime(2026, 1, 1, 12, 0, 0)
    path, _ = start(drill, tmp_path / "w.py", now=t0)
    assert elapsed(path, now=t0 + timedelta(minutes=9, seconds=30)) == 570
    assert start(drill, path)[1] is False, "an existing file is never overwritten"
    result, seconds = check(drill, path, now=t0 + timedelta(minutes=9, seconds=30))
    assert "time: 9:30 of 8:00 (1:30 over)" in verdict(drill, result, seconds)
    assert "started: 2026-01-01T12:00:00" in blank_page(drill, t0)


def test_the_code_command(capsys, tmp_path, monkeypatch):
    import sys

    drill = CODE["gqa-decode"]
    path = tmp_path / "gqa.py"
    monkeypatch.setattr(sys, "stdin", io.StringIO("q\n"))
    assert main(["interview", "--code", "gqa-decode", "--file", str(path)]) == 1
    out = capsys.readouterr().out
    assert "Wrote the blank page" in out and "Query heads are grouped in order" in " ".join(out.split())
    assert main(["interview", "--code", "gqa-decode", "--file", str(path), "--check"]) == 1
    assert "defines no function gqa_decode() yet" in capsys.readouterr().out
    path.write_text(path.read_text() + drill.reference)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert main(["interview", "--code", "gqa-decode", "--file", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"✓ interview.1 gqa_decode: all {len(drill.item().cases)} checks passed" in out and "time: " in out
    assert main(["interview", "--code", "gqa-decode", "--solution"]) == 0
    assert "def gqa_decode(q, k_cache, v_cache):" in capsys.readouterr().out
    assert main(["interview", "--check"]) == 2
    assert "--check, --solution and --file go with --code NAME" in capsys.readouterr().err
    assert main(["interview", "--code", "nope"]) == 2
    assert "no coding drill 'nope'; drills:" in capsys.readouterr().err


def test_a_code_drill_file_that_breaks_the_format():
    good = "---\ndrill: x\ntitle: X\nfunction: f\ngrader: interview\nminutes: 5\n---\n\n## Task\n\nWrite f.\n\n" \
           "## Reference answer\n\n```python\ndef f():\n    return 1\n```\n"
    assert parse_code_drill(good).reference == "def f():\n    return 1\n"
    for broken, message in ((good.replace("minutes: 5\n", ""), "needs 'minutes: …'"),
                            (good.replace("```python", "```"), "needs a ```python code block"),
                            (good.replace("def f()", "def g()"), "does not define f()"),
                            (good.replace("## Task", "## Goal"), "expected the sections")):
        with pytest.raises(BankFormatError, match=message):
            parse_code_drill(broken, "code_x.md")


# ----------------------------------------------------------------------------- spot the flaw


def test_the_flaw_cards_cover_the_corrected_seed_claims():
    cards = {c.id: c for c in load_flaws()}
    for needed in ("reinforce-one-sample", "absolute-rewards", "removes-reward-model", "k1-in-the-loss"):
        assert needed in cards, f"issue 17 names the claim {needed!r}"
    for c in cards.values():
        assert get(c.see) and c.seeds and len(c.correction.split()) >= 30, c.id
        assert all(s[:3] in ("000", "001", "002", "003", "004") for s in c.seeds)


def test_the_figures_in_the_flaw_cards():
    from minigrpo.advantages import group_advantages
    from minigrpo_course.interview.figures import p_mixed

    cards = {c.id: c for c in load_flaws()}
    r = torch.tensor([85.0, 92.0, 70.0], dtype=torch.float64)
    sample = group_advantages(r, 3).tolist()
    population = ((r - r.mean()) / r.std(unbiased=False)).tolist()
    text = cards["mean-only-advantage"].correction
    assert ", ".join(f"{a:+.2f}".replace("-", "−") for a in sample) in text
    assert ", ".join(f"{a:+.2f}".replace("-", "−") for a in population) in text
    middle = group_advantages(torch.tensor([71.0, 92.0, 70.0], dtype=torch.float64), 3)[0].item()
    assert f"{middle:+.2f}".replace("-", "−") in cards["ranking"].correction
    assert f"{p_mixed(0.1, 4):.0%} of groups of 4" in cards["group-size-dated"].correction
    assert f"{p_mixed(0.1, 16):.0%} of groups of 16" in cards["group-size-dated"].correction


def test_spotting_flaws_interactively(capsys):
    out = io.StringIO()
    spotted, shown = run_flaws(io.StringIO("it averages over a batch\n\ny\nno idea\n\nmaybe\nn\nq\n"), out, count=3, seed=0)
    text = out.getvalue()
    assert (spotted, shown) == (1, 2) and "type y or n" in text and "Correction:" in text
    assert "more: minigrpo interview --show" in text


def test_a_broken_flaw_file_is_a_clear_error():
    text = "---\ntitle: t\n---\n\n## x\n\n- **from:** a (`003.Q2`)\n- **see:** `gae`\n\n### Claim\n\nc\n\n### Correction\n\nd\n"
    assert parse_flaws(text)[0].see == "gae"
    with pytest.raises(BankFormatError, match="flaws.md: card 'x': expected the sections"):
        parse_flaws(text.replace("### Correction", "### Fix"))
    with pytest.raises(BankFormatError, match="no interview question 'nope'"):
        parse_flaws(text.replace("`gae`", "`nope`"))
