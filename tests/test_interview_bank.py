"""The question bank as Markdown data: every file parses, the loader reads them through
importlib.resources, and a file that breaks the format is refused with an error naming the file,
the question and the field."""

import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from minigrpo_course.interview import QUESTIONS, TOPIC_TITLES, TOPICS, get
from minigrpo_course.interview.bank import BankFormatError, parse_topic_file
from minigrpo_course.interview.seeds import SEED_QUESTIONS, SEED_SETS, seed_label, seed_set

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "minigrpo_course" / "interview" / "questions"

GOOD = """---
topic: demo
title: A demo topic
---

# A demo topic

Introduction.

## first-question

- **seeds:** Debugging a GRPO loop › follow-up 2 (`001.F2`); GRPO in depth › Q3 (`003.Q3`)
- **demo:** [notebooks/05_ppo_to_grpo.ipynb](../../../notebooks/05_ppo_to_grpo.ipynb), the cell with `## 5. All-equal`

### Question

What happens when every
reward is equal?

### Checklist

- every advantage is 0
- eps on the std: a long item
  that continues here

### Answer

First paragraph,
wrapped.

```
code stays
  as it is
```

Last paragraph.

### Follow-ups

#### Skip the group?

Filter it and refill the batch.

#### And the KL?

It still acts.
"""


def test_a_topic_file_parses_into_questions():
    topic, title, [q] = parse_topic_file(GOOD, "demo.md")
    assert (topic, title, q.id, q.topic) == ("demo", "A demo topic", "first-question", "demo")
    assert q.seeds == ("001.F2", "003.Q3")
    assert q.question == "What happens when every reward is equal?"
    assert q.checklist == ("every advantage is 0", "eps on the std: a long item that continues here")
    assert q.answer == "First paragraph, wrapped.\n\n```\ncode stays\n  as it is\n```\n\nLast paragraph."
    assert q.demo.notebook == "notebooks/05_ppo_to_grpo.ipynb" and q.demo.fragment == "## 5. All-equal"
    assert [(f.question, f.answer) for f in q.followups] == [("Skip the group?", "Filter it and refill the batch."),
                                                            ("And the KL?", "It still acts.")]


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace("topic: demo\n", ""), "demo.md: the front matter needs 'topic"),
    (lambda t: t.replace("---\n", "", 1), "demo.md: the file must start with front matter"),
    (lambda t: t.replace("## first-question", "## First Question"), "question 'First Question': the id must be"),
    (lambda t: t.replace("`001.F2`", "`009.Z1`"), "question 'first-question': 'seeds' names unknown seed questions ['009.Z1']"),
    (lambda t: t.replace("- **demo:**", "- **demo?**"), "expected '- **seeds:** …' or '- **demo:** …'"),
    (lambda t: t.replace("[notebooks/05_ppo_to_grpo.ipynb]", "[lesson 5]"), "'demo' must read [notebooks/"),
    (lambda t: t.replace("### Answer", "### Answers"), "unknown section '### Answers'"),
    (lambda t: t.replace("### Checklist\n", "### Notes\n"), "unknown section '### Notes'"),
    (lambda t: t.replace("- every advantage is 0", "every advantage is 0"), "expected a '- ' list item"),
    (lambda t: t.replace("```\n\nLast", "\nLast"), "a ``` code block is not closed"),
    (lambda t: t.replace("#### Skip the group?", "Skip the group?"), "each follow-up starts with a '#### ' heading"),
    (lambda t: t.split("## first-question")[0], "demo.md: no questions"),
])
def test_a_broken_file_is_a_one_line_error_naming_file_question_and_field(edit, message):
    with pytest.raises(BankFormatError) as info:
        parse_topic_file(edit(GOOD), "demo.md")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_every_topic_file_is_read_through_importlib_resources():
    folder = resources.files("minigrpo_course.interview").joinpath("questions")
    files = sorted(f.name for f in folder.iterdir() if f.name.endswith(".md") and f.name[:2].isdigit())
    assert files == sorted(p.name for p in FOLDER.glob("[0-9][0-9]_*.md")) and len(files) == len(TOPICS)
    headings = sum(len(re.findall(r"^## ", (FOLDER / f).read_text(encoding="utf-8"), re.M)) for f in files)
    assert headings == len(QUESTIONS)
    for f in files:
        topic, title, qs = parse_topic_file((FOLDER / f).read_text(encoding="utf-8"), f)
        assert TOPIC_TITLES[topic] == title and [q.id for q in qs] == [q.id for q in QUESTIONS if q.topic == topic]
    readme = (FOLDER / "README.md").read_text(encoding="utf-8")
    assert all(f"[{f}]({f})" in readme for f in files), "the README lists every topic file"


def test_the_bank_is_grouped_by_topic_in_file_order():
    assert [q.topic for q in QUESTIONS] == sorted((q.topic for q in QUESTIONS), key=TOPICS.index)
    assert TOPICS[0] == "basics" and TOPICS[-1] == "attention"


def test_the_files_show_readable_seed_names_next_to_the_codes():
    for q in QUESTIONS:
        text = (FOLDER / next(p for p in FOLDER.glob(f"*_{q.topic}.md"))).read_text(encoding="utf-8")
        for s in q.seeds:
            assert f"{seed_label(s)} (`{s}`)" in text, f"{q.id}: seed {s} without its readable name"


def test_seed_labels_and_sets():
    assert seed_label("004.A3") == "Policy gradients + efficient attention › A3"
    assert seed_label("001.F2") == "Debugging a GRPO loop › follow-up 2"
    assert seed_label("000.b") == "Diffusion GRPO › part (b)" and seed_label("001.clarify").endswith("clarifying questions")
    assert {s.slug for s in SEED_SETS.values()} == {"diffusion", "debugging", "ppo-vs-grpo", "grpo-in-depth", "pg-attention"}
    assert seed_set("debugging") is seed_set("001") is seed_set("debugging a grpo loop")
    with pytest.raises(ValueError, match="no interview question set 'x'; sets: diffusion"):
        seed_set("x")
    with pytest.raises(ValueError, match="unknown seed question"):
        seed_label("004.Z9")
    assert all(seed_label(ref) for ref in SEED_QUESTIONS)


def test_the_api_keeps_working():
    q = get("grpo-step")
    assert q.seed_labels[0] == "Debugging a GRPO loop › part 1" and q.demo.lesson == "06"
    from minigrpo_course.interview import Demo, Question, by_topic, for_seed  # noqa: F401

    assert for_seed("001.1") == [q] and q in by_topic("grpo")


def test_importing_the_bank_and_the_command_pulls_in_neither_torch_nor_numpy():
    code = ("import sys, minigrpo_course.cli, minigrpo_course.interview.practice, minigrpo_course.interview.notebook; "
            "minigrpo_course.cli.build_parser(); print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
