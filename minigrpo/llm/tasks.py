"""Verifiable tasks: prompts, reference answers, and rewards computed by a program, not a model.

- ``AdditionTask``: ``"47+38="`` → ``"85"``. One right answer.
- ``CountdownTask``: ``"3,5,7>22:"`` → an expression using each number exactly once that equals
  the target, e.g. ``"3*5+7"`` or ``"5*3+7"``. Many right answers: the policy can find its own.
- ``SortTask``: ``"sort 70931:"`` → ``"01379"``. Easy to learn; paired with an imperfect teacher
  (``noisy_answer``: a demonstrator who sometimes swaps two neighbours) it makes a reference policy
  that knows the skill but imitated its teacher's slips.
- ``PrefixTask``: ``"copy 37159264:"`` → ``"3715"``: a prefix of the digits, *as long as the policy
  likes* (``min_len``..``max_len`` digits). Completion lengths are the policy's choice and the reward does
  not depend on them, but every extra digit is one more chance to slip: the task of lesson 06's
  ``loss_type`` length study (``minigrpo_course.experiments.grpo_ablations``).

Each task has a fixed held-out evaluation set (problems never drawn for training) and two rewards:
``format_reward`` (is the completion well formed and finished with EOS?) and ``correctness_reward``
(is it right?). ``reward`` combines them: correctness + ``format_weight`` · format.
``problem_from_prompt`` reads a problem back from its prompt, which is what lets the same checks
run as TRL reward functions (``minigrpo.llm.rewards.TaskReward``) on a data set of prompts.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, field

from minigrpo.llm.rewards import reward_func_metrics


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str  #: one reference answer (for SFT); the reward accepts any correct answer
    meta: tuple = field(default=())  #: task-specific data (operands, numbers and target)


class Task:
    """Base class: subclasses define ``_draw``, ``is_well_formed`` and ``is_correct``."""

    name = "task"
    max_completion_length = 8
    format_weight = 0.1
    #: the last batch's reward per function and completion, ``{name: [B]}`` (set by ``score``): the trainer
    #: gathers them over processes for ``rewards/<name>/mean`` and ``/std`` (None: a task that keeps none)
    rewards_per_func: dict[str, list[float]] | None = None

    def __init__(self, eval_size: int = 200, eval_seed: int = 12345):
        rng = random.Random(eval_seed)
        held_out: dict[str, Problem] = {}
        while len(held_out) < eval_size:
            p = self._draw(rng)
            held_out[p.prompt] = p
        self.eval_set: list[Problem] = list(held_out.values())
        self._held_out = set(held_out)

    def _draw(self, rng: random.Random) -> Problem:
        raise NotImplementedError

    def sample(self, rng: random.Random) -> Problem:
        """A training problem (never one of the held-out evaluation problems)."""
        while True:
            p = self._draw(rng)
            if p.prompt not in self._held_out:
                return p

    def is_well_formed(self, completion: str) -> bool:
        raise NotImplementedError

    def problem_from_prompt(self, prompt: str) -> Problem:
        """The problem a prompt of this task asks (ValueError for a prompt the task cannot have made)."""
        raise NotImplementedError(f"{type(self).__name__} cannot read a problem back from its prompt")

    def _unreadable(self, prompt: str) -> ValueError:
        return ValueError(f"{prompt!r} is not a prompt of the {self.name} task")

    def is_correct(self, problem: Problem, completion: str) -> bool:
        raise NotImplementedError

    def noisy_answer(self, problem: Problem, rng: random.Random) -> str:
        """A plausible wrong answer, as an imperfect demonstrator would write it (SFT's ``demo_error_rate``)."""
        raise NotImplementedError(f"{type(self).__name__} has no model of a demonstrator's slips")

    def format_reward(self, problem: Problem, completion: str, finished: bool = True) -> float:
        """1 if the completion ended with EOS and has the task's shape, else 0."""
        return float(finished and self.is_well_formed(completion))

    def correctness_reward(self, problem: Problem, completion: str, finished: bool = True) -> float:
        """1 if the completion ended with EOS and is a right answer, else 0."""
        return float(finished and self.is_correct(problem, completion))

    def reward(self, problem: Problem, completion: str, finished: bool = True) -> float:
        return self.correctness_reward(problem, completion, finished) + \
            self.format_weight * self.format_reward(problem, completion, finished)

    def score(self, problems: list[Problem], completions: list[str], finished: list[bool],
              completion_ids: list[list[int]] | None = None, trainer_state=None) -> tuple[list[float], dict[str, float]]:
        """The trainer's one call into a task: the reward of each completion and the batch's metrics.

        ``problems[i]`` is the problem completion ``i`` answers (a group repeats its problem G
        times). Metrics follow TRL's names, ``rewards/<function>/mean`` and ``/std``; ``correct`` and
        ``format`` are the fractions of right and well-formed completions. ``completion_ids`` (the
        sampled tokens) and ``trainer_state`` are for tasks whose reward functions read them (TRL passes
        both; see ``data.DatasetTask``); the built-in tasks score the text.
        """
        rows = list(zip(problems, completions, finished))
        correct = [self.correctness_reward(p, c, f) for p, c, f in rows]
        formatted = [self.format_reward(p, c, f) for p, c, f in rows]
        rewards = [self.reward(p, c, f) for p, c, f in rows]
        self.rewards_per_func = {"correctness_reward": correct, "format_reward": formatted}
        metrics = reward_func_metrics(self.rewards_per_func)
        metrics.update(correct=metrics["rewards/correctness_reward/mean"],
                       format=metrics["rewards/format_reward/mean"])
        return rewards, metrics


_NUMBER = r"(?:0|[1-9]\d*)"  # no leading zeros: "02" is not a way to write 2


class AdditionTask(Task):
    """``a+b=`` with ``digits``-digit operands; the answer is the sum in decimal."""

    name = "addition"

    def __init__(self, digits: int = 2, **kwargs):
        self.digits = digits
        self.max_completion_length = digits + 2  # the sum's digits, EOS, one spare
        super().__init__(**kwargs)

    def _draw(self, rng: random.Random) -> Problem:
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return Problem(f"{a}+{b}=", str(a + b), (a, b))

    def problem_from_prompt(self, prompt: str) -> Problem:
        m = re.fullmatch(rf"({_NUMBER})\+({_NUMBER})=", prompt)
        if m is None:
            raise self._unreadable(prompt)
        a, b = int(m.group(1)), int(m.group(2))
        return Problem(prompt, str(a + b), (a, b))

    def is_well_formed(self, completion: str) -> bool:
        return re.fullmatch(_NUMBER, completion) is not None

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.is_well_formed(completion) and int(completion) == sum(problem.meta)


_EXPR = re.compile(rf"{_NUMBER}(?:[+\-*]{_NUMBER})*")


class CountdownTask(Task):
    """Combine ``n_numbers`` one-digit numbers with + − × (each exactly once) to hit the target."""

    name = "countdown"

    def __init__(self, n_numbers: int = 3, ops: str = "+-*", **kwargs):
        self.n_numbers, self.ops = n_numbers, ops
        self.max_completion_length = 2 * n_numbers + 1
        super().__init__(**kwargs)

    def _draw(self, rng: random.Random) -> Problem:
        while True:
            numbers = [rng.randint(1, 9) for _ in range(self.n_numbers)]
            expr = str(numbers[0]) + "".join(rng.choice(self.ops) + str(n) for n in numbers[1:])
            target = eval(expr)  # noqa: S307 - digits and + - * only, built here
            if 0 <= target <= 99:
                shown = sorted(numbers)
                return Problem(f"{','.join(map(str, shown))}>{target}:", expr, (tuple(shown), target))

    def problem_from_prompt(self, prompt: str) -> Problem:
        """The numbers and target; the answer is one solution (the prompt does not say which one was drawn)."""
        m = re.fullmatch(r"(\d(?:,\d)*)>(\d+):", prompt)
        if m is None:
            raise self._unreadable(prompt)
        numbers, target = tuple(sorted(int(n) for n in m.group(1).split(","))), int(m.group(2))
        return Problem(prompt, _countdown_solution(numbers, target, self.ops) or "", (numbers, target))

    def is_well_formed(self, completion: str) -> bool:
        return _EXPR.fullmatch(completion) is not None

    def is_correct(self, problem: Problem, completion: str) -> bool:
        if not self.is_well_formed(completion):
            return False
        numbers, target = problem.meta
        used = sorted(int(n) for n in re.findall(r"\d+", completion))
        return used == list(numbers) and eval(completion) == target  # noqa: S307 - validated above


def _countdown_solution(numbers: tuple[int, ...], target: int, ops: str) -> str | None:
    """The first expression (numbers in every order, each operator) that reaches ``target``, or None."""
    for order in dict.fromkeys(itertools.permutations(numbers)):
        for chosen in itertools.product(ops, repeat=len(order) - 1):
            expr = str(order[0]) + "".join(o + str(n) for o, n in zip(chosen, order[1:]))
            if eval(expr) == target:  # noqa: S307 - digits and + - * only, built here
                return expr
    return None


class SortTask(Task):
    """``sort 70931:`` → ``01379``: the digits in ascending order (``min_len``..``max_len`` digits)."""

    name = "sort"

    def __init__(self, min_len: int = 5, max_len: int = 8, **kwargs):
        if not 2 <= min_len <= max_len:
            raise ValueError(f"need 2 <= min_len <= max_len, got {min_len}, {max_len}")
        self.min_len, self.max_len = min_len, max_len
        self.max_completion_length = max_len + 2  # the digits, EOS, one spare
        super().__init__(**kwargs)

    def _draw(self, rng: random.Random) -> Problem:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(self.min_len, self.max_len)))
        return Problem(f"sort {digits}:", "".join(sorted(digits)), (digits,))

    def problem_from_prompt(self, prompt: str) -> Problem:
        m = re.fullmatch(r"sort (\d+):", prompt)
        if m is None:
            raise self._unreadable(prompt)
        return Problem(prompt, "".join(sorted(m.group(1))), (m.group(1),))

    def is_well_formed(self, completion: str) -> bool:
        return re.fullmatch(r"\d+", completion) is not None

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return completion == "".join(sorted(problem.meta[0]))

    def noisy_answer(self, problem: Problem, rng: random.Random) -> str:
        """The sorted digits with one pair of unequal neighbours swapped (a slip, not a different skill)."""
        s = list(problem.answer)
        spots = [i for i in range(len(s) - 1) if s[i] != s[i + 1]]
        if not spots:  # all digits equal: no wrong order exists; drop one instead
            return "".join(s[1:])
        i = rng.choice(spots)
        s[i], s[i + 1] = s[i + 1], s[i]
        return "".join(s)


class PrefixTask(Task):
    """``"copy 37159264:"`` → any prefix of the digits, ``min_len``..``max_len`` of them (``"3715"`` is right).

    The reference answer (the teacher's demonstration) stops after a length drawn uniformly from
    ``min_len``..``max_len``; every such prefix is right, so the length of a completion is the policy's free
    choice and the reward does not depend on it — but a longer answer has more digits to get wrong."""

    name = "prefix"

    def __init__(self, min_len: int = 2, max_len: int = 8, **kwargs):
        if not 1 <= min_len <= max_len:
            raise ValueError(f"PrefixTask needs 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
        self.min_len, self.max_len = min_len, max_len
        self.max_completion_length = max_len + 2  # the digits, EOS, one spare
        super().__init__(**kwargs)

    def _draw(self, rng: random.Random) -> Problem:
        digits = "".join(rng.choice("0123456789") for _ in range(self.max_len))
        return Problem(f"copy {digits}:", digits[: rng.randint(self.min_len, self.max_len)], (digits,))

    def problem_from_prompt(self, prompt: str) -> Problem:
        m = re.fullmatch(rf"copy (\d{{{self.max_len}}}):", prompt)
        if m is None:
            raise self._unreadable(prompt)
        return Problem(prompt, m.group(1)[: self.min_len], (m.group(1),))

    def is_well_formed(self, completion: str) -> bool:
        return re.fullmatch(r"\d+", completion) is not None

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.min_len <= len(completion) <= self.max_len and problem.meta[0].startswith(completion)

    def noisy_answer(self, problem: Problem, rng: random.Random) -> str:
        """The teacher's answer with one digit after the first replaced by another (a slip; the length is kept)."""
        s = list(problem.answer)
        i = rng.randrange(1, len(s)) if len(s) > 1 else 0
        s[i] = rng.choice([d for d in "0123456789" if d != s[i]])
        return "".join(s)


TASKS = {"addition": AdditionTask, "countdown": CountdownTask, "sort": SortTask, "prefix": PrefixTask}
