"""Interview practice in Jupyter, readable without a live kernel: question cards whose checklist, model
answer and follow-ups stay folded until you open them (plain HTML ``<details>``, which static viewers
such as GitHub render too), a random-question cell, the "spot the flaw" cards, the derivation and
coding drills with their answers folded, the mock rounds, and flash cards with buttons (ipywidgets;
they fall back to a static card where no kernel runs).

Lesson 11's committed outputs stay lean: the topics, coding drills and mock rounds are shown as indexes that
link to the bank's Markdown files (which render the checklists, model answers and follow-ups on GitHub), not
as a copy of the whole bank; ``show_topic(topic, answers=True)`` unfolds the cards in a running notebook."""

from __future__ import annotations

import html
import random
from importlib import resources

from minigrpo_course.interview.bank import (QUESTIONS, QUESTIONS_DIR, SEED_QUESTIONS, TOPIC_FILES, TOPIC_TITLES,
                                            Question, by_topic, for_seed)
from minigrpo_course.interview.seeds import SEED_SETS, seed_label

_STYLE = "border:1px solid #ccc;border-radius:6px;padding:8px 12px;margin:8px 0"
#: the bank's folder as the lesson notebooks (in notebooks/) link to it
BANK = f"../minigrpo_course/interview/{QUESTIONS_DIR}/"


def _text_html(text: str) -> str:
    """Paragraphs to <p>, ``` blocks to <pre>; everything escaped."""
    parts, para, code, in_code = [], [], [], False
    for line in text.splitlines() + [""]:
        if line.startswith("```"):
            if in_code:
                parts.append("<pre>" + html.escape("\n".join(code)) + "</pre>")
                code = []
            elif para:
                parts.append("<p>" + html.escape(" ".join(para)) + "</p>")
                para = []
            in_code = not in_code
        elif in_code:
            code.append(line)
        elif line.strip():
            para.append(line.strip())
        elif para:
            parts.append("<p>" + html.escape(" ".join(para)) + "</p>")
            para = []
    return "".join(parts)


def question_html(q: Question) -> str:
    seeds = "; ".join(q.seed_labels)
    return (f"<b>[{html.escape(q.id)}]</b> <i>{html.escape(q.topic)}; asked in {html.escape(seeds)}</i>"
            f"<p><b>{html.escape(q.question)}</b></p>")


def reveal_html(q: Question, open_: bool = False) -> str:
    attr = " open" if open_ else ""
    items = "".join(f"<li>{html.escape(item)}</li>" for item in q.checklist)
    where = (f"lesson {q.demo.lesson}: <code>{html.escape(q.demo.notebook)}</code>, the cell with "
             f"“{html.escape(q.demo.fragment)}”")
    followups = ""
    if q.followups:
        inner = "".join(f"<details><summary>{html.escape(f.question)}</summary>{_text_html(f.answer)}</details>"
                        for f in q.followups)
        followups = (f"<details{attr}><summary>Follow-ups an interviewer asks next</summary>"
                     f"<div style=\"margin-left:1em\">{inner}</div></details>")
    return (f"<details{attr}><summary>What a strong answer covers</summary><ol>{items}</ol></details>"
            f"<details{attr}><summary>Model answer</summary>{_text_html(q.answer)}</details>"
            f"{followups}"
            f"<details{attr}><summary>Where the course shows it</summary><p>{where}</p></details>")


def card_html(q: Question) -> str:
    return f'<div style="{_STYLE}">{question_html(q)}{reveal_html(q)}</div>'


def _display_html(markup: str) -> None:
    from IPython.display import HTML, display

    display(HTML(markup))


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def topic_index_html(topic: str) -> str:
    """A topic's questions, each linked to its entry in the bank file (checklist, model answer, follow-ups) and
    to the lesson cell that shows it: what a reader needs to pick a question, without a copy of the answers."""
    file = TOPIC_FILES[topic]
    rows = []
    for q in by_topic(topic):
        where = f"lesson {q.demo.lesson}, “{html.escape(q.demo.fragment.lstrip('# '))}”"
        rows.append(f"<li>{_link(BANK + file + '#' + q.id, q.id)}: {html.escape(q.question)} <i>({where})</i></li>")
    count = f"{len(rows)} question{'s' if len(rows) != 1 else ''}"
    return (f"<p>{count} on {html.escape(TOPIC_TITLES[topic])}; the checklist, model answer and "
            f"follow-ups of each are in {_link(BANK + file, file)}. Answer first, then open the link (or "
            f"<code>minigrpo interview --show ID</code>; <code>show_topic(\"{topic}\", answers=True)</code> unfolds "
            f"them here).</p><ol>{''.join(rows)}</ol>")


def show_topic(topic: str, answers: bool = False) -> None:
    """A topic's questions: an index linking to the bank (default), or every card with its answers folded."""
    _display_html("".join(card_html(q) for q in by_topic(topic)) if answers else topic_index_html(topic))


def random_question(topic: str | None = None, seed: int | None = None) -> Question:
    """Show one random question (of a topic) with its answer folded; returns it."""
    q = random.Random(seed).choice(by_topic(topic))
    _display_html(card_html(q))
    return q


class WithStaticFallback:
    """A widget that also carries an HTML rendering: a live Jupyter shows the widget, a static viewer
    (GitHub, nbviewer without widget state, an HTML export) shows the HTML."""

    def __init__(self, widget, fallback_html: str):
        self.widget, self.fallback_html = widget, fallback_html

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["text/html"] = self.fallback_html
        return bundle


def flashcards(topic: str | None = None, seed: int | None = None) -> WithStaticFallback:
    """Buttons: reveal the checklist, reveal the answer, next random question. Returns the widget box
    (``.widget``), displayed with a static card (answers folded) for viewers without a kernel."""
    import ipywidgets as widgets

    rng = random.Random(seed)
    pool = by_topic(topic)
    state = {"q": rng.choice(pool)}
    out = widgets.Output()
    reveal, nxt = widgets.Button(description="Reveal answer"), widgets.Button(description="Next question")

    def draw(open_: bool) -> None:
        out.clear_output()
        with out:
            q = state["q"]
            _display_html(f'<div style="{_STYLE}">{question_html(q)}' + (reveal_html(q, open_=True) if open_ else "")
                          + "</div>")

    def on_next(_):
        state["q"] = rng.choice(pool)
        draw(False)

    reveal.on_click(lambda _: draw(True))
    nxt.on_click(on_next)
    first = state["q"]
    draw(False)
    box = widgets.VBox([widgets.HBox([reveal, nxt]), out])
    return WithStaticFallback(box, "<p><i>Flash cards need a running kernel; here is the first card:</i></p>"
                                   + card_html(first))


def coverage_html() -> str:
    """A table: every seed question and follow-up, and the bank entries that answer it."""
    rows = []
    for ref, text in SEED_QUESTIONS.items():
        ids = ", ".join(q.id for q in for_seed(ref))
        rows.append(f"<tr><td>{html.escape(seed_label(ref))}</td><td>{html.escape(text)}</td>"
                    f"<td><code>{html.escape(ids)}</code></td></tr>")
    sets = "".join(f"<li><b>{html.escape(s.name)}</b> (<code>--mock {s.slug}</code>): "
                   f"{html.escape(s.source.split(': ', 1)[1])}</li>" for s in SEED_SETS.values())
    return (f"<p>{len(SEED_QUESTIONS)} interview questions and follow-ups from {len(SEED_SETS)} interviews, "
            f"answered by {len(QUESTIONS)} bank entries.</p><ul>{sets}</ul>"
            "<table><tr><th>asked in</th><th>asks</th><th>bank entries</th></tr>" + "".join(rows) + "</table>")


def show_coverage() -> None:
    _display_html(coverage_html())


# --------------------------------------------------------------------------------------------
# Spot the flaw, drills and mock rounds, folded the same way
# --------------------------------------------------------------------------------------------


def flaws_html() -> str:
    """Every "spot the flaw" card: the claim shown, the correction folded."""
    from minigrpo_course.interview.flaws import load_flaws

    cards = []
    for c in load_flaws():
        cards.append(f'<div style="{_STYLE}"><i>Claimed in {html.escape(c.source)}:</i>'
                     f"<p><b>{html.escape(c.claim)}</b></p>"
                     f"<details><summary>What is wrong with it</summary>{_text_html(c.correction)}"
                     f"<p>More: <code>minigrpo interview --show {html.escape(c.see)}</code></p></details></div>")
    return "".join(cards)


def show_flaws() -> None:
    _display_html(flaws_html())


def drill_html(name: str) -> str:
    """A derivation drill: the set-up, then each step with its answer and the worked step folded."""
    from minigrpo_course.interview.drills import get_drill, key_text

    d = get_drill(name)
    steps = []
    for i, step in enumerate(d.steps, 1):
        choices = "".join(f"<li>({chr(97 + j)}) {html.escape(c)}</li>" for j, c in enumerate(step.choices))
        choices = f"<ul style=\"list-style:none\">{choices}</ul>" if choices else ""
        steps.append(f"<li>{html.escape(step.prompt)}{choices}<details><summary>Answer</summary>"
                     f"<p><b>{html.escape(key_text(step))}</b>: {html.escape(step.explain)}</p></details></li>")
    return (f'<div style="{_STYLE}"><b>{html.escape(d.title)}</b> <code>minigrpo interview --drill {d.id}</code>'
            f"<p>{html.escape(d.setup)}</p><ol>{''.join(steps)}</ol></div>")


def show_drills() -> None:
    from minigrpo_course.interview.drills import DRILLS

    _display_html("".join(drill_html(name) for name in DRILLS))


def code_drills_html(reference: bool = False) -> str:
    """Each coding drill: its title, time, command and the function to write, linked to its file (the task and
    the reference answer); with ``reference``, the task and the reference answer (folded) are shown here."""
    from minigrpo_course.interview.coding import load_code_drills, parse_code_drill, task_lines

    folder = resources.files("minigrpo_course.interview").joinpath(QUESTIONS_DIR)
    files = {parse_code_drill(f.read_text(encoding="utf-8"), f.name).id: f.name for f in folder.iterdir()
             if f.name.startswith("code_") and f.name.endswith(".md")}
    if not reference:
        rows = "".join(f"<li><b>{html.escape(d.title)}</b> ({d.minutes:g} min): write <code>{html.escape(d.function)}"
                       f"()</code>, <code>minigrpo interview --code {d.id}</code>; task and reference answer: "
                       f"{_link(BANK + files[d.id], files[d.id])}</li>" for d in load_code_drills().values())
        return f"<ol>{rows}</ol>"
    out = []
    for d in load_code_drills().values():
        out.append(f'<div style="{_STYLE}"><b>{html.escape(d.title)}</b> ({d.minutes:g} minutes) '
                   f"<code>minigrpo interview --code {d.id}</code>"
                   f"<pre>{html.escape(chr(10).join(task_lines(d, 100)))}</pre>"
                   f"<details><summary>Reference answer</summary><pre>{html.escape(d.reference)}</pre></details></div>")
    return "".join(out)


def show_code_drills(reference: bool = False) -> None:
    _display_html(code_drills_html(reference))


def mocks_html(full: bool = False) -> str:
    """Each mock round: its parts with their timers and its follow-up questions, linked to its file (the brief and
    the clarifying questions with the interviewer's replies); with ``full``, all of it here, replies folded."""
    from minigrpo_course.interview.mock import _mock_files, load_mocks, parse_mock

    files = {parse_mock(f.read_text(encoding="utf-8"), f.name).slug: f.name for f in _mock_files()}
    out = []
    for m in load_mocks().values():
        parts = "".join(f"<li>({p.minutes:g} min) <code>{html.escape(p.question.id)}</code>"
                        + (f": {html.escape(p.prompt)}" if full else "") + "</li>" for p in m.parts)
        follow = ""
        if m.followups:
            follow = (f"<p>Then follow-up questions, {m.followup_minutes:g} minutes each: "
                      + ", ".join(f"<code>{html.escape(q.id)}</code>" for q in m.followups) + "</p>")
        head = (f'<div style="{_STYLE}"><b>{html.escape(m.title)}</b> (about {round(m.minutes)} minutes) '
                f"<code>minigrpo interview --mock {m.slug}</code>")
        if not full:
            out.append(f"{head}<p>The brief and the clarifying questions ({m.clarify_minutes:g} min), with the "
                       f"interviewer's replies: {_link(BANK + files[m.slug], files[m.slug])}. The parts:</p>"
                       f"<ol>{parts}</ol>{follow}</div>")
            continue
        clarify = "".join(f"<li>{html.escape(c.ask)}<details><summary>The interviewer's reply</summary>"
                          f"<p>{html.escape(c.reply)}</p></details></li>" for c in m.clarify)
        out.append(f"{head}{_text_html(m.brief)}"
                   f"<p>Clarifying questions a strong candidate asks ({m.clarify_minutes:g} min):</p><ol>{clarify}</ol>"
                   f"<p>The parts:</p><ol>{parts}</ol>{follow}</div>")
    return "".join(out)


def show_mocks(full: bool = False) -> None:
    _display_html(mocks_html(full))
