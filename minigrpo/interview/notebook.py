"""Interview practice in Jupyter: question cards whose checklist and model answer stay folded until
you open them (HTML ``<details>``, which also renders in static viewers), a random-question cell, and
flash cards with buttons (ipywidgets)."""

from __future__ import annotations

import html
import random

from minigrpo.interview.bank import QUESTIONS, SEED_QUESTIONS, Question, by_topic, for_seed
from minigrpo.interview.seeds import SEED_SETS, seed_label

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
    return (f"<details{attr}><summary>What a strong answer covers</summary><ul>{items}</ul></details>"
            f"<details{attr}><summary>Model answer</summary>{_text_html(q.answer)}</details>"
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


def flashcards(topic: str | None = None, seed: int | None = None):
    """Buttons: reveal the checklist, reveal the answer, next random question. Returns the widget box."""
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
    draw(False)
    return widgets.VBox([widgets.HBox([reveal, nxt]), out])


def coverage_html() -> str:
    """A table: every seed question and follow-up, and the bank entries that answer it."""
    rows = []
    for ref, text in SEED_QUESTIONS.items():
        ids = ", ".join(q.id for q in for_seed(ref))
        rows.append(f"<tr><td>{html.escape(seed_label(ref))}</td><td>{html.escape(text)}</td>"
                    f"<td><code>{html.escape(ids)}</code></td></tr>")
    sets = "".join(f"<li><b>{html.escape(s.name)}</b> (<code>--mock {s.slug}</code>): {html.escape(s.source.split(': ', 1)[1])}</li>"
                   for s in SEED_SETS.values())
    return (f"<p>{len(SEED_QUESTIONS)} interview questions and follow-ups from {len(SEED_SETS)} interviews, answered by "
            f"{len(QUESTIONS)} bank entries.</p><ul>{sets}</ul>"
            "<table><tr><th>asked in</th><th>asks</th><th>bank entries</th></tr>" + "".join(rows) + "</table>")


def show_coverage() -> None:
    _display_html(coverage_html())
