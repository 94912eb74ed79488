"""Interview practice in Jupyter, readable without a live kernel: question cards whose checklist, model
answer and follow-ups stay folded until you open them (plain HTML ``<details>``, which static viewers
such as GitHub render too), a random-question cell, the "spot the flaw" cards, the derivation and
coding drills with their answers folded, the mock rounds, and flash cards with buttons (ipywidgets;
they fall back to a static card where no kernel runs)."""

from __future__ import annotations

import html
import random

from minigrpo_course.interview.bank import QUESTIONS, SEED_QUESTIONS, Question, by_topic, for_seed
from minigrpo_course.interview.seeds import SEED_SETS, seed_label

_STYLE = "border:1px solid #ccc;border-radius:6px;padding:8px 12px;margin:8px 0"


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


def show_topic(topic: str) -> None:
    """Every question of a topic as a card, answers folded."""
    _display_html("".join(card_html(q) for q in by_topic(topic)))


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


def code_drills_html() -> str:
    """Each coding drill: the task, and the reference answer folded."""
    from minigrpo_course.interview.coding import load_code_drills, task_lines

    out = []
    for d in load_code_drills().values():
        out.append(f'<div style="{_STYLE}"><b>{html.escape(d.title)}</b> ({d.minutes:g} minutes) '
                   f"<code>minigrpo interview --code {d.id}</code>"
                   f"<pre>{html.escape(chr(10).join(task_lines(d, 100)))}</pre>"
                   f"<details><summary>Reference answer</summary><pre>{html.escape(d.reference)}</pre></details></div>")
    return "".join(out)


def show_code_drills() -> None:
    _display_html(code_drills_html())


def mocks_html() -> str:
    """Each mock round in the interviewer's order: the brief, the clarifying questions (replies folded),
    the parts with their timers, and the follow-up questions."""
    from minigrpo_course.interview.mock import load_mocks

    out = []
    for m in load_mocks().values():
        clarify = "".join(f"<li>{html.escape(c.ask)}<details><summary>The interviewer's reply</summary>"
                          f"<p>{html.escape(c.reply)}</p></details></li>" for c in m.clarify)
        parts = "".join(f"<li>({p.minutes:g} min) {html.escape(p.prompt)} "
                        f"<code>{html.escape(p.question.id)}</code></li>" for p in m.parts)
        follow = ""
        if m.followups:
            items = "".join(f"<li>{html.escape(q.question)} <code>{html.escape(q.id)}</code></li>" for q in m.followups)
            follow = f"<p>Then follow-up questions, {m.followup_minutes:g} minutes each:</p><ol>{items}</ol>"
        out.append(f'<div style="{_STYLE}"><b>{html.escape(m.title)}</b> (about {round(m.minutes)} minutes) '
                   f"<code>minigrpo interview --mock {m.slug}</code>{_text_html(m.brief)}"
                   f"<p>Clarifying questions a strong candidate asks ({m.clarify_minutes:g} min):</p><ol>{clarify}</ol>"
                   f"<p>The parts:</p><ol>{parts}</ol>{follow}</div>")
    return "".join(out)


def show_mocks() -> None:
    _display_html(mocks_html())
