"""Multiplication facts for a small real chat model: lesson 12's task for SmolLM2-135M-Instruct.

"What is a * b?" with a in 2..9 and b in 2..19: 144 problems, 143 without the prompt's worked example
(3 * 14). Measured on SmolLM2-135M-Instruct (Q4_1 weights, dequantised), 64 held-out problems, 8 samples
each at temperature 1: right about 0.42 of the time per sample, at least once in 8 for about 0.75 of the
problems. A task the model half-solves is one GRPO can learn from: most groups hold right and wrong answers.

- :func:`problems` / :func:`split`: every problem, and a fixed held-out / training split of them;
- :func:`conversation` / :func:`rows`: the chat prompt (a system instruction, one worked example as an
  earlier turn, the question) and TRL's conversational data rows (``prompt``, ``answer``);
- :func:`parse_answer`: the strict reading of a completion (exactly one ``<answer>`` pair holding an integer);
- :func:`hardened_verifier`: correctness and format reward functions (TRL's signature) built on it, which
  also require the completion to have ended;
- :func:`lenient_verifier`: what a hurried reward writer ships (the answer anywhere in the text, credit for
  mentioning the tag), and the other loose checks lesson 12 counts in the model's own samples
  (:data:`LOOSE_CHECKS`: last number, any of several tags).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from minigrpo.llm.rewards import completion_text

SYSTEM_PROMPT = ("You are a helpful assistant. Solve the problem, then write the final answer as a number "
                 "inside <answer></answer> tags, for example <answer>42</answer>.")
#: one worked example, shown as an earlier user / assistant turn (without it the model never uses the tag)
EXAMPLE = [{"role": "user", "content": "What is 3 * 14?"},
           {"role": "assistant", "content": "3 * 14 = 42\n<answer>42</answer>"}]

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INT = re.compile(r"-?\d+")


def problems() -> list[tuple[str, int]]:
    """Every ``(question, answer)``: a * b for a in 2..9, b in 2..19, except the worked example (143)."""
    out = [(f"What is {a} * {b}?", a * b) for a in range(2, 10) for b in range(2, 20)]
    return sorted(p for p in out if p[0] != EXAMPLE[0]["content"])


def split(num_eval: int = 64, seed: int = 1000) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """``(held_out, train)``: the problems shuffled with ``seed``, the first ``num_eval`` held out (disjoint)."""
    shuffled = problems()
    random.Random(seed).shuffle(shuffled)
    return shuffled[:num_eval], shuffled[num_eval:]


def conversation(question: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict]:
    """The chat prompt: our own system message (else the template adds SmolLM's default one), the example, the
    question."""
    return [{"role": "system", "content": system_prompt}, *EXAMPLE, {"role": "user", "content": question}]


def rows(pairs: Sequence[tuple[str, int]]) -> list[dict]:
    """TRL's conversational rows: ``prompt`` (a conversation) and ``answer`` (passed to the reward functions)."""
    return [{"prompt": conversation(q), "answer": a} for q, a in pairs]


def parse_answer(text: str) -> int | None:
    """The integer of the one ``<answer>…</answer>`` pair, or None: no tag, two tags, an unclosed tag, or
    anything but an integer inside (``66.67``, ``16 * 18 = 256``, an empty pair)."""
    found = _TAG.findall(text)
    if len(found) != 1 or text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return None
    inner = found[0].strip().replace(",", "")
    return int(inner) if re.fullmatch(r"-?\d+", inner) else None


def hardened_verifier(end_of_turn_ids: Sequence[int]):
    """``(correctness_reward, format_reward)``, TRL reward functions that credit exactly one tag pair holding an
    integer, in a completion that ended (its last token, which TRL passes in ``completion_ids``, is one of
    ``end_of_turn_ids``). Give the format reward a small weight (0.1): a wrong answer in good form must earn
    far less than a right one."""
    ends = set(end_of_turn_ids)

    def correctness_reward(prompts, completions, answer, completion_ids, **kwargs) -> list[float]:
        return [float(bool(ids) and ids[-1] in ends and parse_answer(completion_text(c)) == int(a))
                for c, a, ids in zip(completions, answer, completion_ids)]

    def format_reward(prompts, completions, completion_ids, **kwargs) -> list[float]:
        return [float(bool(ids) and ids[-1] in ends and parse_answer(completion_text(c)) is not None)
                for c, ids in zip(completions, completion_ids)]

    return correctness_reward, format_reward


# ----------------------------------------------------------------------------- loose checks (for the hack study)

def _numbers(text: str) -> list[int]:
    return [int(n) for n in _INT.findall(text.replace(",", ""))]


def answer_anywhere(text: str, answer: int) -> bool:
    """Right if the answer appears as a number anywhere in the text (tags, ending, other numbers ignored)."""
    return answer in _numbers(text)


def last_number(text: str, answer: int) -> bool:
    """Right if the last number in the text is the answer (the usual quick GSM8K check)."""
    found = _numbers(text)
    return bool(found) and found[-1] == answer


def any_tag(text: str, answer: int) -> bool:
    """Right if any ``<answer>`` (closed or not) starts with the answer: several tags are several guesses."""
    return any(_numbers(t)[:1] == [answer] for t in text.split("<answer>")[1:])


def mentions_tag(text: str) -> bool:
    """Format credit for writing ``<answer>`` at all."""
    return "<answer>" in text


#: the loose checks lesson 12 counts in the model's samples: name -> (text, answer) -> bool
LOOSE_CHECKS = {"answer anywhere": answer_anywhere, "last number": last_number, "any tag": any_tag}


def lenient_verifier():
    """``(correctness_reward, format_reward)`` as a hurried reward writer ships them: right when the answer
    appears anywhere in the completion, format credit for mentioning ``<answer>``; finished or not."""

    def lenient_correctness(prompts, completions, answer, **kwargs) -> list[float]:
        return [float(answer_anywhere(completion_text(c), int(a))) for c, a in zip(completions, answer)]

    def lenient_format(prompts, completions, **kwargs) -> list[float]:
        return [float(mentions_tag(completion_text(c))) for c in completions]

    return lenient_correctness, lenient_format


__all__ = ["EXAMPLE", "LOOSE_CHECKS", "SYSTEM_PROMPT", "answer_anywhere", "any_tag", "conversation",
           "hardened_verifier", "last_number", "lenient_verifier", "mentions_tag", "parse_answer", "problems",
           "rows", "split"]
