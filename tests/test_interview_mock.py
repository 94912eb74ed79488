"""Mock interview rounds: one per question set, in the interviewer's order, with timers, follow-up
chains that branch on the self-scored answer, and a Markdown transcript. Run here with scripted
answers and a scripted clock."""

import io
import itertools
import json
import sys

import pytest

from minigrpo_course.cli import main
from minigrpo_course.interview import get
from minigrpo_course.interview.bank import BankFormatError
from minigrpo_course.interview.mock import get_mock, load_mocks, parse_mock, run_mock
from minigrpo_course.interview.schedule import Progress
from minigrpo_course.interview.terminal import clock_text
from minigrpo_course.interview.seeds import SEED_SETS


def _script(*steps: str) -> io.StringIO:
    return io.StringIO("".join(steps))


def answer(text: str) -> str:
    return text + "\n\n"  # an answer ends with an empty line


# The debugging round, scripted: clarify (3 of 6 asked); part 1 strong (follow-up chain: y, then n
# stops it); part 2 weak (two probes); part 3 strong (one point missed); seven follow-up questions.
DEBUGGING = (
    answer("is the reward outcome or process?\nhow many steps per batch?"), "1 2 3\n",
    answer("sample prompts, G completions, group advantages, clipped loss, step"), "all\n",
    answer("the ratio is exactly 1 and the gradient is REINFORCE with a group baseline"), "y\n",
    answer("not sure"), "n\n",
    answer("an off-by-one in the log-probs"), "1\n",
    answer("the mask drops the EOS"), "y\n",
    answer("no idea"), "n\n",
    answer("same weights, inputs, numerics; minibatches; engines; transforms"), "1-6\n",
    answer("exactly 1 before the first step, spread after"), "y\n",
    answer("down on every token"), "y\n",
    *[answer(f"follow-up answer {i}") + "all\n" for i in range(7)],
)


def _clock(step: float = 300.0):
    ticks = itertools.count(0.0, step)
    return lambda: next(ticks)


def test_every_question_set_has_one_round_in_the_interviewers_order():
    mocks = load_mocks()
    assert list(mocks) == [s.slug for s in SEED_SETS.values()]
    for m in mocks.values():
        assert m.brief and len(m.clarify) >= 4 and m.parts, m.slug
        for p in m.parts:
            assert p.question.followups and len(p.question.followups) >= 2, f"{m.slug}: {p.question.id} has no chain"
            assert m.seed.code in {s[:3] for s in p.question.seeds}, f"{m.slug}: {p.question.id} is not from this set"
        assert 20 <= m.minutes <= 60
    dbg = mocks["debugging"]
    assert [p.question.id for p in dbg.parts] == ["grpo-step", "three-bugs", "ratio-not-one"]
    assert [q.id for q in dbg.followups] == ["ppo-clip", "all-equal-group", "truncated-is", "outcome-vs-process",
                                             "kl-placement", "bf16-logprobs", "left-padding"]
    assert dbg.clarify_question is get("clarifying-questions")
    assert get_mock("001") is not None and get_mock("Debugging a GRPO loop").slug == "debugging"


def test_a_scripted_round_branches_times_and_writes_its_transcript(tmp_path):
    progress = Progress(tmp_path / "p.json")
    out = io.StringIO()
    r, path = run_mock(get_mock("debugging"), progress, _script(*DEBUGGING), out, tmp_path / "t.md", clock=_clock())
    text, shown = path.read_text(encoding="utf-8"), out.getvalue()
    assert not r.stopped
    # timers: every answer took 5:00 on the scripted clock
    assert "[took 5:00 of 4:00: 1:00 over (a real interviewer would have cut in)]" in shown  # clarify
    assert "[took 5:00 of 7:00]" in shown  # part 1
    assert "## Clarifying questions (5:00 of 4:00)" in text and "(3/6 asked)" in text
    assert "- [x] Outcome or process reward?" in text and "- [ ] Is there a KL to a frozen reference" in text
    # part 1: strong, so the follow-up chain; it stops at the first miss
    fu = get("grpo-step").followups
    assert "### Follow-ups (a strong answer" in text and fu[0].question in text and fu[1].question in text
    assert fu[2].question not in text and "*The chain stops at the first reply that misses its point.*" in text
    # part 2: weak (1 of 5), so two probes on skipped points
    bugs = get("three-bugs")
    assert "### Probes (a weak answer" in text and text.count("Let's come back to something you did not cover") == 2
    assert bugs.checklist[1] in text and "**Checklist: 1/5 points** (`three-bugs`)" in text
    # part 3: one point missed is still strong: its whole chain, both made
    assert all(f.question in text for f in get("ratio-not-one").followups)
    assert text.count("✓ made the point") == 4 and text.count("✗ missed the point") == 2
    assert "## Follow-up questions" in text and all(f"(`{qid}`)" in text for qid in ("ppo-clip", "kl-placement"))
    summary = text.split("## Summary")[1]
    assert summary.count("\n| ") == 1 + 11  # header row + clarify, 3 parts, 7 follow-ups
    assert "| Clarifying questions | 3/6 | 5:00 of 4:00 | – |" in summary
    rapid = ("ppo-clip", "all-equal-group", "truncated-is", "outcome-vs-process", "kl-placement", "bf16-logprobs",
             "left-padding")
    covered = 3 + 8 + 1 + 6 + sum(len(get(q).checklist) for q in rapid)
    items = 6 + 8 + 5 + 7 + sum(len(get(q).checklist) for q in rapid)
    assert f"**Score: {covered}/{items} points" in summary and "Revisit: Part 2" in summary
    assert "<details><summary>Model answer</summary>" in text and f"\n> the mask drops the EOS\n" in text
    # every scored answer went into the spaced-review progress
    saved = json.loads((tmp_path / "p.json").read_text())["questions"]
    assert set(saved) == {"clarifying-questions", "grpo-step", "three-bugs", "ratio-not-one", *rapid}
    assert saved["three-bugs"]["box"] == 0 and saved["grpo-step"]["box"] == 2


def test_the_mock_command_runs_non_interactively(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _script(*DEBUGGING))
    transcript = tmp_path / "sub" / "round.md"
    rc = main(["interview", "--mock", "debugging", "--transcript", str(transcript),
               "--progress-file", str(tmp_path / "p.json")])
    out = capsys.readouterr()
    assert rc == 0 and out.err == ""
    assert f"transcript: {transcript}" in out.out and "Round over:" in out.out
    assert transcript.read_text(encoding="utf-8").startswith("# Mock round: Debugging a GRPO training loop")


def test_the_default_transcript_goes_to_minigrpo_home(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRPO_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "stdin", _script(answer("what is the reward?"), "q\n"))
    rc = main(["interview", "--mock", "pg-attention", "--progress-file", str(tmp_path / "p.json")])
    assert rc == 0
    [path] = list((tmp_path / "home" / "mocks").glob("pg-attention-*.md"))
    text = path.read_text(encoding="utf-8")
    assert "> what is the reward?" in text and "*The round was stopped here.*" in text and "Stopped early." in text
    assert "Round stopped" in capsys.readouterr().out


@pytest.mark.parametrize("slug", [s.slug for s in SEED_SETS.values()])
def test_every_round_runs_to_the_end_on_scripted_answers(tmp_path, slug):
    """Answer everything, cover every point, make every follow-up: the round ends with a full score."""
    m = get_mock(slug)
    steps = [answer("my clarifying questions"), "all\n"]
    for p in m.parts:
        steps += [answer("my answer"), "all\n"] + [answer("reply"), "y\n"] * len(p.question.followups)
    steps += [answer("short answer"), "all\n"] * len(m.followups)
    r, path = run_mock(m, Progress(tmp_path / "p.json"), _script(*steps), io.StringIO(), tmp_path / "t.md",
                       clock=_clock(1.0))
    text = path.read_text(encoding="utf-8")
    assert not r.stopped and "(100%)" in text and "0 section(s) over time" in text
    assert text.count("✓ made the point") == sum(len(p.question.followups) for p in m.parts)


def test_ctrl_c_in_a_round_keeps_the_transcript_and_exits_130(capsys, tmp_path, monkeypatch):
    class CtrlC:
        lines = [answer("clarify").split("\n")[0] + "\n", "\n", "all\n"]

        def readline(self):
            if not self.lines:
                raise KeyboardInterrupt
            return self.lines.pop(0)

    monkeypatch.setattr(sys, "stdin", CtrlC())
    transcript = tmp_path / "t.md"
    rc = main(["interview", "--mock", "ppo-vs-grpo", "--transcript", str(transcript),
               "--progress-file", str(tmp_path / "p.json")])
    out = capsys.readouterr()
    assert rc == 130 and "Traceback" not in out.out + out.err
    assert "## Clarifying questions" in transcript.read_text(encoding="utf-8")


def test_listing_and_unknown_rounds(capsys, tmp_path):
    rc = main(["interview", "--mock", "--progress-file", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert rc == 0 and all(f"--mock {s.slug}" in out for s in SEED_SETS.values())
    rc = main(["interview", "--mock", "chemistry", "--progress-file", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "no interview question set 'chemistry'; sets: diffusion" in err and err.count("\n") == 1


def test_clock_text():
    assert clock_text(0) == "0:00" and clock_text(59.6) == "1:00" and clock_text(125) == "2:05"


GOOD = """---
set: debugging
---

## Brief

The scenario.

## Clarifying questions (2 min)

- Outcome or process? → Outcome.

## Part 1: grpo-step (5 min)

## Follow-up questions (3 min each)

- ppo-clip
"""


def test_a_round_file_parses():
    m = parse_mock(GOOD, "x.md")
    assert m.slug == "debugging" and m.title == "Debugging a GRPO loop" and m.parts[0].prompt == get("grpo-step").question
    assert m.minutes == 2 + 5 + 3 and m.clarify[0].reply == "Outcome."


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace("set: debugging", "set: chess"), "x.md: no interview question set 'chess'"),
    (lambda t: t.replace(" → Outcome.", " Outcome."), "write each item as 'what to ask → the interviewer's reply'"),
    (lambda t: t.replace("Part 1: grpo-step", "Part 2: grpo-step"), "parts must be numbered 1, 2, 3"),
    (lambda t: t.replace("Part 1: grpo-step", "Part 1: nope"), "no interview question 'nope'"),
    (lambda t: t.replace("## Brief", "## Scenario"), "unknown section '## Scenario'"),
    (lambda t: t.replace("set: debugging", "set: debugging\nclarify-question: clarifying-questions"),
     "must match the 6 checklist items of 'clarifying-questions' one to one, got 1"),
])
def test_a_broken_round_file_is_a_clear_error(edit, message):
    with pytest.raises(BankFormatError) as info:
        parse_mock(edit(GOOD), "x.md")
    assert message in str(info.value) and str(info.value).startswith("x.md: ")


def test_the_newer_interview_topics_are_in_the_mock_rounds():
    """Issue 24's topics are asked in the rounds, not only stored in the bank: multi-GPU GRPO and the KL's
    direction in the GRPO round, precision and padding in the debugging round, dual-clip with PPO, verifier
    hacking and GSPO in the PPO-vs-GRPO round."""
    asked = {m.slug: {p.question.id for p in m.parts} | {q.id for q in m.followups} for m in load_mocks().values()}
    assert {"kl-direction", "multi-gpu-grpo"} <= asked["grpo-in-depth"]
    assert {"bf16-logprobs", "left-padding", "kl-placement"} <= asked["debugging"]
    assert "dual-clip-ppo" in asked["pg-attention"] and {"verifier-hacking", "gspo"} <= asked["ppo-vs-grpo"]
