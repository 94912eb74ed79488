"""Reward functions as TRL users write them, and how several combine into one reward.

A reward function is any callable ``f(prompts, completions, **kwargs) -> list[float]`` called with
keyword arguments only, exactly as TRL's ``GRPOTrainer`` calls it (trl 1.x, ``_calculate_rewards``):

- ``prompts``: one per completion (a prompt repeats G times, once per completion of its group); a
  string, or a conversation (a list of ``{"role", "content"}`` dicts) for conversational data;
- ``completions``: the generated text, a string for a string prompt, or ``[{"role": "assistant",
  "content": text}]`` for a conversation;
- ``completion_ids``: the completion's token ids (a list of ints per completion);
- every other column of the data set, by name, one value per completion (``answer=[...]``);
- ``trainer_state`` (a ``transformers.TrainerState``: ``global_step`` etc., for rewards that change
  with training), ``log_metric(name, value)`` and ``log_extra(column, values)`` (callbacks).

So a reward function must accept ``**kwargs`` and take what it needs by name. It returns one
reward per completion: a number, or ``None`` for "not applicable" (a code reward on a math
problem, say). As in TRL, ``None`` becomes NaN and the weighted sum over functions ignores it
(``nansum``); a completion that *every* function leaves at ``None`` is an error here (TRL warns and
gives it zero advantage; our trainer keeps a plain group baseline, so we refuse it instead).
Anything else that is not a finite number is an error naming the function: the wrong number of
rewards, NaN or inf, a string.

With ``reward_weights`` (TRL's name; default all 1) the reward of completion i is
``sum_k w_k · r_k(i)``. Metrics follow TRL: ``rewards/<name>/mean`` and ``rewards/<name>/std`` per
function (ignoring ``None``; std with Bessel's correction), ``<name>`` being the function's
``__name__`` (the wrapped function's for a ``functools.partial``, the class name for a callable
object without one).

:class:`TaskReward` turns a built-in task's checks (``AdditionTask`` etc.) into such functions, so
the same rewards run in TRL on a data set with only a ``prompt`` column.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import numbers
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: keyword arguments TRL passes itself: a data-set column with one of these names would clash
RESERVED_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")

RewardFunc = Callable[..., Sequence[Any]]


def reward_func_name(func: RewardFunc) -> str:
    """The name TRL logs a reward function under: ``__name__`` (through ``functools.partial``), else the class."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def check_reward_funcs(reward_funcs: RewardFunc | Sequence[RewardFunc],
                       reward_weights: Sequence[float] | None = None) -> tuple[list, list[str], list[float]]:
    """``(functions, names, weights)``: a single function or a list, checked; names made unique (``f``, ``f_2``)."""
    funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
    if not funcs:
        raise ValueError("reward_funcs is empty: give at least one reward function")
    for i, f in enumerate(funcs):
        if isinstance(f, str):
            raise TypeError(f"reward_funcs[{i}] is the string {f!r}: reward models by name are not supported "
                            "here, pass a callable (prompts, completions, **kwargs) -> list[float]")
        if not callable(f):
            raise TypeError(f"reward_funcs[{i}] must be callable, got {type(f).__name__}")
    names: list[str] = []
    for f in funcs:
        base = name = reward_func_name(f)
        k = 2
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    if reward_weights is None:
        return funcs, names, [1.0] * len(funcs)
    weights = list(reward_weights)
    if len(weights) != len(funcs):
        raise ValueError(f"reward_weights has {len(weights)} entries for {len(funcs)} reward functions "
                         f"({', '.join(names)}): give one weight per function")
    for name, w in zip(names, weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise ValueError(f"reward_weights: the weight of {name!r} must be a finite number, got {w!r}")
    return funcs, names, [float(w) for w in weights]


def _as_reward(value: Any, name: str, i: int) -> float:
    """One returned value as a float (None → NaN, as TRL does); an error naming the function otherwise."""
    if value is None:
        return math.nan
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # a numpy or torch scalar
        value = value.item()
    if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real):
        raise TypeError(f"reward function {name!r} returned {type(value).__name__} {value!r:.40} for completion {i}; "
                        "a reward must be a number (or None for 'not applicable')")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"reward function {name!r} returned {value} for completion {i}; rewards must be finite "
                         "(return None for 'not applicable')")
    return value


class RewardFunctionError(ValueError):
    """A reward function raised an exception of its own (chained as ``__cause__``); the message names the function
    and the line of its file where it happened."""


def _where(exc: BaseException) -> str:
    """``file.py:12`` of the innermost frame of ``exc``'s traceback (the line that raised)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


def call_reward_func(func: RewardFunc, name: str, prompts: list, completions: list, **kwargs) -> list[float]:
    """Call ``func`` as TRL does (keywords only) and check what it returns: one finite number or None each. An
    exception inside ``func`` becomes a :class:`RewardFunctionError` naming it and the line that raised."""
    try:
        out = func(prompts=prompts, completions=completions, **kwargs)
    except Exception as exc:
        raise RewardFunctionError(f"reward function {name!r} raised {type(exc).__name__}: "
                                  f"{str(exc).strip().splitlines()[0] if str(exc).strip() else '(no message)'} "
                                  f"(at {_where(exc)})") from exc
    if isinstance(out, (str, bytes)) or not hasattr(out, "__iter__"):
        raise TypeError(f"reward function {name!r} returned {type(out).__name__}, not a list with one reward "
                        "per completion")
    out = list(out)
    if len(out) != len(completions):
        raise ValueError(f"reward function {name!r} returned {len(out)} rewards for {len(completions)} "
                         "completions: it must return exactly one per completion")
    return [_as_reward(v, name, i) for i, v in enumerate(out)]


def check_reward_signature(func: RewardFunc, name: str, columns: Sequence[str]) -> None:
    """Refuse, in one sentence, a reward function that cannot be called as TRL calls it: keywords ``prompts``,
    ``completions``, TRL's own (``completion_ids``, ``trainer_state``, ``log_extra``, ``log_metric``) and one per
    ``columns`` of the data set. (A function whose signature Python cannot read is let through.)"""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return
    keywords = ["prompts", "completions", *RESERVED_KWARGS[2:], *columns]
    try:
        signature.bind(**dict.fromkeys(keywords))
    except TypeError as exc:
        text = str(exc)
        if "missing" in text:
            wanted = text.split("'")[1] if "'" in text else text
            raise TypeError(f"reward function {name}{signature} asks for {wanted!r}, which is neither a keyword TRL "
                            f"passes nor a column of the data set (columns: {', '.join(columns) or 'none'}): give it "
                            "a default or rename the column") from None
        if not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
            raise TypeError(f"reward function {name}{signature} cannot take the keyword arguments TRL passes "
                            f"(prompts, completions, {', '.join(keywords[2:])}): add **kwargs to its parameters, "
                            f"e.g. def {name}(prompts, completions, **kwargs)") from None
        raise TypeError(f"reward function {name}{signature} cannot be called as TRL calls it ({text}): take "
                        "prompts and completions by keyword, and **kwargs") from None


def import_reward_func(spec: str, where: str = "--reward-funcs") -> RewardFunc:
    """The function ``spec`` names: ``MODULE:FUNCTION`` (or TRL's ``MODULE.FUNCTION``), the module imported from
    the current folder (put first on ``sys.path``) or the installed packages; one-sentence ValueErrors."""
    module_name, sep, attribute = spec.strip().partition(":")
    if not sep and "." in spec:
        module_name, _, attribute = spec.strip().rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"{where}: {spec!r} must be MODULE:FUNCTION, e.g. my_rewards:exact for the function exact "
                         "of my_rewards.py in the current folder")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ValueError(f"{where}: there is no module {module_name!r} to import ({module_name.replace('.', '/')}"
                             f".py is neither in the current folder {cwd} nor installed)") from None
        raise ValueError(f"{where}: importing {module_name} failed because it imports {exc.name!r}, which is not "
                         "installed") from None
    except Exception as exc:
        raise ValueError(f"{where}: importing {module_name} raised {type(exc).__name__}: {exc} (at {_where(exc)})") \
            from None
    if not hasattr(module, attribute):
        functions = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                           and getattr(v, "__module__", None) == module.__name__)
        raise ValueError(f"{where}: {module_name} ({getattr(module, '__file__', '?')}) has no {attribute!r}"
                         + (f"; its functions: {', '.join(functions)}" if functions else ""))
    func = getattr(module, attribute)
    if not callable(func):
        raise ValueError(f"{where}: {module_name}:{attribute} is a {type(func).__name__}, not a function")
    return func


def combine_rewards(per_func: dict[str, list[float]], weights: Sequence[float]) -> list[float]:
    """``sum_k w_k · r_k(i)`` ignoring NaN (a None reward); an error where every function gave None."""
    columns = list(per_func.values())
    rewards = []
    for i, row in enumerate(zip(*columns)):
        if all(math.isnan(r) for r in row):
            raise ValueError(f"every reward function ({', '.join(per_func)}) returned None for completion {i}: "
                             "at least one must score each completion")
        rewards.append(sum(w * r for w, r in zip(weights, row) if not math.isnan(r)))
    return rewards


def reward_func_metrics(per_func: dict[str, list[float]]) -> dict[str, float]:
    """``rewards/<name>/mean`` and ``/std`` per function, over the completions it scored (TRL's nanmean/nanstd)."""
    metrics = {}
    for name, values in per_func.items():
        scored = [v for v in values if not math.isnan(v)]
        n = len(scored)
        mean = sum(scored) / n if n else math.nan
        std = math.sqrt(sum((v - mean) ** 2 for v in scored) / (n - 1)) if n > 1 else math.nan
        metrics[f"rewards/{name}/mean"], metrics[f"rewards/{name}/std"] = mean, std
    return metrics


def run_reward_funcs(reward_funcs: Sequence[RewardFunc], names: Sequence[str], prompts: list, completions: list,
                     **kwargs) -> dict[str, list[float]]:
    """Every function's rewards for the batch, ``{name: rewards}`` (NaN where it returned None), checked."""
    return {name: call_reward_func(f, name, prompts, completions, **kwargs) for f, name in zip(reward_funcs, names)}


def completion_text(completion: str | list[dict]) -> str:
    """The text of a completion as reward functions receive it (a string, or a conversation's last message)."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"] if completion else ""


class TaskReward:
    """A built-in task's ``correctness`` or ``format`` check as a TRL reward function.

    It reads the problem back from its prompt (``task.problem_from_prompt``), so it needs no column
    but ``prompt``: ``TaskReward(CountdownTask(), "correctness")`` runs unchanged in TRL's
    ``GRPOTrainer`` on a data set of countdown prompts. It cannot see whether the completion ended
    with EOS (TRL does not say), so it scores the text as if it did; in TRL pair it with
    ``mask_truncated_completions=True``. Picklable (a class, not a closure), named like the task's
    method (``correctness_reward`` / ``format_reward``) so the metrics keep their names.
    """

    def __init__(self, task, kind: str = "correctness"):
        if kind not in ("correctness", "format"):
            raise ValueError(f"kind must be 'correctness' or 'format', got {kind!r}")
        self.task, self.kind = task, kind
        self.__name__ = f"{kind}_reward"

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        check = self.task.correctness_reward if self.kind == "correctness" else self.task.format_reward
        return [check(self.task.problem_from_prompt(completion_text(p) if isinstance(p, list) else p),
                      completion_text(c), True)
                for p, c in zip(prompts, completions)]

    def __repr__(self) -> str:
        return f"TaskReward({type(self.task).__name__}, {self.kind!r})"


def task_reward_funcs(task) -> tuple[list[TaskReward], list[float]]:
    """A built-in task's reward as TRL reward functions and weights: correctness (1) and format (``format_weight``)."""
    return [TaskReward(task, "correctness"), TaskReward(task, "format")], [1.0, task.format_weight]


__all__ = ["RESERVED_KWARGS", "RewardFunctionError", "TaskReward", "call_reward_func", "check_reward_funcs",
           "check_reward_signature", "combine_rewards", "completion_text", "import_reward_func", "reward_func_metrics",
           "reward_func_name", "run_reward_funcs", "task_reward_funcs"]
