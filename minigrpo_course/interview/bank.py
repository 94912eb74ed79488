"""The interview question bank: every question and follow-up of the course's seed interviews.

The questions live as Markdown, one file per topic, in ``minigrpo_course/interview/questions/`` (readable on
GitHub; the format is described in ``questions/README.md``) and are loaded here with
:mod:`importlib.resources`, so they travel with the installed package. Each :class:`Question` says
what it asks, which seed questions it covers, what a strong answer must contain (the checklist), a
model answer, follow-ups an interviewer asks next, and the lesson cell that demonstrates it. A cell
is named by ``(notebook, fragment)``: a piece of text that must appear in exactly one cell of that
notebook, so rebuilding a notebook (new cells, new ids) does not break the link while the heading
survives. ``tests/test_interview.py`` checks both the coverage and the links.

The text is ours; the seed interviews only decided what is asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from minigrpo_course.interview.seeds import SEED_FILES, SEED_QUESTIONS, SEED_SETS, seed_label

QUESTIONS_DIR = "questions"  #: inside the package ``minigrpo_course.interview``
SECTIONS = ("Question", "Checklist", "Answer", "Follow-ups")
_REQUIRED = ("Question", "Checklist", "Answer")
_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


@dataclass(frozen=True)
class Demo:
    """A lesson cell: the notebook (repo-relative path) and a fragment found in exactly one of its cells."""

    notebook: str
    fragment: str

    @property
    def lesson(self) -> str:
        """The two-digit number of the notebook, e.g. "06"."""
        return self.notebook.rsplit("/", 1)[-1][:2]


@dataclass(frozen=True)
class FollowUp:
    """What an interviewer asks after a good answer, and what a good reply says."""

    question: str
    answer: str


@dataclass(frozen=True)
class Question:
    id: str
    topic: str
    seeds: tuple[str, ...]  #: keys of SEED_QUESTIONS this entry answers
    question: str
    checklist: tuple[str, ...]  #: what a strong answer covers
    answer: str  #: a model answer (plain text, unicode math)
    demo: Demo
    #: the lesson that will demonstrate it better once it exists (the demo is provisional until then)
    planned: str | None = None
    #: follow-ups in the order an interviewer asks them, each one a step deeper
    followups: tuple[FollowUp, ...] = ()

    @property
    def seed_labels(self) -> tuple[str, ...]:
        """The seeds as a learner reads them: "Debugging a GRPO loop › follow-up 1"."""
        return tuple(seed_label(s) for s in self.seeds)


# --------------------------------------------------------------------------------------------
# Reading the Markdown files
# --------------------------------------------------------------------------------------------


class BankFormatError(ValueError):
    """A question file that does not follow the format; the message names the file and the field."""


def _blocks(lines: list[str]) -> str:
    """Markdown lines to the bank's plain text: the lines of a paragraph joined by spaces, paragraphs
    separated by a blank line, ``` code blocks kept line by line."""
    out: list[str] = []
    para: list[str] = []
    code: list[str] | None = None
    for line in lines:
        if code is not None:
            code.append(line)
            if line.startswith("```"):
                out.append("\n".join(code))
                code = None
        elif line.startswith("```"):
            if para:
                out.append(" ".join(para))
                para = []
            code = [line]
        elif not line.strip():
            if para:
                out.append(" ".join(para))
                para = []
        else:
            para.append(line.strip())
    if code is not None:
        raise ValueError("a ``` code block is not closed")
    if para:
        out.append(" ".join(para))
    return "\n\n".join(out)


def _list_items(lines: list[str]) -> tuple[str, ...]:
    """``- item`` lines (an indented line continues the item above) to a tuple of strings."""
    items: list[str] = []
    for line in lines:
        if line.startswith("- "):
            items.append(line[2:].strip())
        elif line.startswith("  ") and line.strip() and items:
            items[-1] += " " + line.strip()
        elif line.strip():
            raise ValueError(f"expected a '- ' list item, got {line.strip()[:60]!r}")
    return tuple(items)


def _split_headings(lines: list[str], marker: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Split at lines starting with ``marker`` (e.g. ``"## "``) outside code blocks: (the lines before
    the first heading, [(heading text, its lines)])."""
    head: list[str] = []
    parts: list[tuple[str, list[str]]] = []
    in_code = False
    for line in lines:
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith(marker):
            parts.append((line[len(marker):].strip(), []))
        elif parts:
            parts[-1][1].append(line)
        else:
            head.append(line)
    return head, parts


def _front_matter(text: str) -> tuple[dict[str, str], list[str]]:
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---" or "---" not in [s.strip() for s in lines[1:]]:
        raise ValueError("the file must start with front matter: a '---' line, 'topic: NAME', 'title: TEXT', '---'")
    end = [s.strip() for s in lines].index("---", 1)
    meta = {}
    for line in lines[1:end]:
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"front matter lines are 'key: value', got {line!r}")
        meta[key.strip()] = value.strip()
    return meta, lines[end + 1:]


_CODE_SPAN = re.compile(r"(`+) ?(.+?) ?\1")


def _fields(lines: list[str]) -> dict[str, str]:
    fields = {}
    for line in lines:
        m = re.match(r"- \*\*([\w-]+):\*\*\s*(.*)", line)
        if m:
            fields[m.group(1)] = m.group(2).strip()
        elif line.strip():
            raise ValueError(f"expected '- **seeds:** …' or '- **demo:** …' before '### Question', "
                             f"got {line.strip()[:60]!r}")
    return fields


def _seeds(value: str) -> tuple[str, ...]:
    refs = tuple(m.group(2) for m in _CODE_SPAN.finditer(value))
    if not refs:
        raise ValueError("'seeds' lists no seed reference in backticks, e.g. (`001.F1`)")
    unknown = [r for r in refs if r not in SEED_QUESTIONS]
    if unknown:
        raise ValueError(f"'seeds' names unknown seed questions {unknown}")
    return refs


def _demo(value: str) -> Demo:
    link = re.match(r"\[([^\]]+)\]\([^)]*\)", value)
    span = _CODE_SPAN.search(value[link.end():]) if link else None
    if not link or not span or not link.group(1).startswith("notebooks/"):
        raise ValueError("'demo' must read [notebooks/NN_name.ipynb](../../../notebooks/NN_name.ipynb), "
                         "the cell with `a fragment of that cell`")
    return Demo(link.group(1), span.group(2))


def _followups(lines: list[str]) -> tuple[FollowUp, ...]:
    intro, parts = _split_headings(lines, "#### ")
    if any(s.strip() for s in intro):
        raise ValueError("each follow-up starts with a '#### ' heading (the question), its answer below it")
    out = []
    for question, body in parts:
        answer = _blocks(body)
        if not question or not answer:
            raise ValueError(f"follow-up {question!r} needs a question (the heading) and an answer")
        out.append(FollowUp(question, answer))
    return tuple(out)


def _question(qid: str, lines: list[str], topic: str) -> Question:
    if not _ID.fullmatch(qid):
        raise ValueError(f"the id must be lower-case words joined by '-', got {qid!r}")
    head, sections = _split_headings(lines, "### ")
    fields = _fields(head)
    for name in ("seeds", "demo"):
        if name not in fields:
            raise ValueError(f"missing field '{name}' ('- **{name}:** …' under the id)")
    found = {}
    for name, body in sections:
        if name not in SECTIONS:
            raise ValueError(f"unknown section '### {name}'; sections: {', '.join(SECTIONS)}")
        if name in found:
            raise ValueError(f"section '### {name}' appears twice")
        found[name] = body
    for name in _REQUIRED:
        if not _blocks(found.get(name, [])):
            raise ValueError(f"missing or empty section '### {name}'")
    return Question(
        id=qid, topic=topic, seeds=_seeds(fields["seeds"]), question=_blocks(found["Question"]),
        checklist=_list_items(found["Checklist"]), answer=_blocks(found["Answer"]), demo=_demo(fields["demo"]),
        planned=fields.get("planned"), followups=_followups(found.get("Follow-ups", [])))


def parse_topic_file(text: str, name: str = "<text>") -> tuple[str, str, list[Question]]:
    """One topic file: ``(topic, title, questions)``. A :class:`BankFormatError` names the file, the
    question and what is wrong."""
    try:
        meta, body = _front_matter(text)
    except ValueError as exc:
        raise BankFormatError(f"{name}: {exc}") from None
    topic, title = meta.get("topic", ""), meta.get("title", "")
    if not _ID.fullmatch(topic) or not title:
        raise BankFormatError(f"{name}: the front matter needs 'topic: lower-case-name' and 'title: …', got {meta}")
    _, parts = _split_headings(body, "## ")
    questions = []
    for qid, lines in parts:
        try:
            questions.append(_question(qid, lines, topic))
        except ValueError as exc:
            raise BankFormatError(f"{name}, question '{qid}': {exc}") from None
    if not questions:
        raise BankFormatError(f"{name}: no questions ('## id' headings)")
    return topic, title, questions


def _topic_files():
    folder = resources.files("minigrpo_course.interview").joinpath(QUESTIONS_DIR)
    return sorted((f for f in folder.iterdir() if f.name.endswith(".md") and f.name[:2].isdigit()),
                  key=lambda f: f.name)


def load_bank() -> tuple[tuple[Question, ...], dict[str, str], dict[str, str]]:
    """Every question of every topic file, in file order; the topic titles; and each topic's file name."""
    questions: list[Question] = []
    titles: dict[str, str] = {}
    files: dict[str, str] = {}
    for f in _topic_files():
        topic, title, qs = parse_topic_file(f.read_text(encoding="utf-8"), f"{QUESTIONS_DIR}/{f.name}")
        if topic in titles:
            raise BankFormatError(f"{QUESTIONS_DIR}/{f.name}: topic {topic!r} is already defined by another file")
        titles[topic], files[topic] = title, f.name
        questions += qs
    seen: set[str] = set()
    for q in questions:
        if q.id in seen:
            raise BankFormatError(f"question id {q.id!r} appears twice in {QUESTIONS_DIR}/")
        seen.add(q.id)
    return tuple(questions), titles, files


QUESTIONS, TOPIC_TITLES, TOPIC_FILES = load_bank()
_BY_ID = {q.id: q for q in QUESTIONS}
TOPICS: tuple[str, ...] = tuple(TOPIC_TITLES)


def get(question_id: str) -> Question:
    """The question with this id; a ValueError that lists the ids otherwise."""
    try:
        return _BY_ID[question_id]
    except KeyError:
        raise ValueError(f"no interview question {question_id!r}; ids: {', '.join(_BY_ID)}") from None


def by_topic(topic: str | None) -> list[Question]:
    """The questions of one topic (all of them for None), in bank order."""
    if topic is None:
        return list(QUESTIONS)
    if topic not in TOPICS:
        raise ValueError(f"no interview topic {topic!r}; topics: {', '.join(TOPICS)}")
    return [q for q in QUESTIONS if q.topic == topic]


def for_seed(seed: str) -> list[Question]:
    """The entries that answer one seed question (e.g. "001.F3")."""
    if seed not in SEED_QUESTIONS:
        raise ValueError(f"unknown seed question {seed!r}")
    return [q for q in QUESTIONS if seed in q.seeds]


__all__ = ["BankFormatError", "Demo", "FollowUp", "QUESTIONS", "Question", "SEED_FILES", "SEED_QUESTIONS",
           "SEED_SETS", "TOPICS", "TOPIC_FILES", "TOPIC_TITLES", "by_topic", "for_seed", "get", "load_bank", "parse_topic_file",
           "seed_label"]
