"""Reward functions for recipes/smollm2_arithmetic.yaml, written as TRL takes them: f(prompts, completions, **kwargs)
-> one float per completion, the data set's other columns (here ``answer``) passed by name."""

import re


def _text(completion) -> str:
    """A completion's text: a string for a plain prompt, [{"role": "assistant", "content": ...}] for a conversation."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def correct(prompts, completions, answer, **kwargs) -> list[float]:
    """1 if the last number in the completion is the answer, else 0."""
    rewards = []
    for completion, expected in zip(completions, answer):
        numbers = re.findall(r"-?\d+", _text(completion))
        rewards.append(float(bool(numbers) and numbers[-1] == expected))
    return rewards


def number_only(prompts, completions, **kwargs) -> list[float]:
    """1 if the completion is a number and nothing else, as the prompt asks."""
    return [float(re.fullmatch(r"\s*-?\d+\s*\.?\s*", _text(c)) is not None) for c in completions]
