"""A task made from data: a ``datasets.Dataset`` (or a list of dicts) and TRL reward functions.

``DatasetTask(train_dataset, reward_funcs, ...)`` is what TRL's ``GRPOTrainer(train_dataset=...,
reward_funcs=..., args=GRPOConfig(reward_weights=...))`` takes, shaped as the course's ``Task``:

- ``prompt_column`` holds the prompt: a string, or a conversation (a list of ``{"role", "content"}``
  dicts), which the sampler renders with the tokenizer's chat template;
- every other column goes to the reward functions by name, one value per completion (TRL does the
  same), so ``def correctness(prompts, completions, answer, **kwargs)`` receives the ``answer`` column;
- ``answer_column`` (optional) is the reference completion SFT imitates (``Problem.answer``);
- evaluation (``sft.evaluate_task``: pass@1, pass@G, greedy) counts a completion as correct when
  it ended (EOS within the length limit, as for the built-in tasks) and ``correctness_func`` gave
  it a reward > 0; ``format_func`` likewise gives the ``format`` share. By default the first
  reward function is the correctness function, and a completion is "well formed" when it ended.

Training rewards are exactly what the reward functions return (as in TRL, they do not see whether
a completion ended; the trainer's ``mask_truncated_completions`` handles truncation).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from minigrpo.llm.rewards import (RESERVED_KWARGS, RewardFunc, check_reward_funcs, check_reward_signature,
                                  combine_rewards, import_reward_func, reward_func_metrics, run_reward_funcs)
from minigrpo.llm.tasks import Problem, Task

#: columns TRL keeps from the reward functions (besides the prompt)
_NOT_PASSED = ("completion", "completion_ids")
#: the file types :func:`load_rows` reads, by extension, and the ``datasets`` builder that reads each
DATA_FILE_KINDS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
#: columns that can hold the completion SFT imitates, in the order they are looked for: TRL's prompt-completion
#: format, TRL's math data sets (``solution``), GSM8K-style data (``answer``)
ANSWER_COLUMNS = ("completion", "solution", "answer")


def as_rows(data: Any, name: str = "dataset") -> list[dict]:
    """A ``datasets.Dataset``, a list of dicts or a dict of columns, as a list of row dicts."""
    if data is None:
        return []
    if hasattr(data, "to_list") and hasattr(data, "column_names"):  # datasets.Dataset
        return data.to_list()
    if isinstance(data, Mapping):  # {"prompt": [...], "answer": [...]}
        lengths = {k: len(v) for k, v in data.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{name}: the columns have different lengths {lengths}")
        return [dict(zip(data, values)) for values in zip(*data.values())]
    rows = list(data)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"{name}[{i}] must be a dict of columns, got {type(row).__name__}")
    return [dict(r) for r in rows]


def load_rows(path: str | Path, split: str = "train") -> list[dict]:
    """Rows of a local json / jsonl / csv / parquet file, read with ``datasets.load_dataset``."""
    from datasets import load_dataset

    kind = DATA_FILE_KINDS.get(Path(path).suffix.lower())
    if kind is None:
        raise ValueError(f"load_rows reads .json, .jsonl, .csv or .parquet files, got {str(path)!r}")
    return load_dataset(kind, data_files={split: str(path)}, split=split).to_list()


def load_data_file(path: str | Path, where: str = "--dataset") -> list[dict]:
    """The rows of a local data file for the command line: :func:`load_rows`, with every failure one sentence that
    names the file (``where``: the option that gave it)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"{where} {path}: no such file")
    if p.is_dir():
        raise ValueError(f"{where} {path} is a folder; give a .jsonl, .json, .csv or .parquet file")
    if p.suffix.lower() not in DATA_FILE_KINDS:
        raise ValueError(f"{where} {path}: minigrpo reads .jsonl, .json, .csv or .parquet files, not "
                         f"{p.suffix or 'a file without an extension'}")
    try:
        with open(p, "rb"):
            pass
        rows = load_rows(p)
    except Exception as exc:  # datasets' parse errors have many types; the first line says what broke
        text = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ValueError(f"{where} {path} could not be read as a {p.suffix.lower()} file ({text[:200]})") from None
    if not rows:
        raise ValueError(f"{where} {path} has no rows")
    return rows


def check_prompt_column(rows: list[dict], where: str, prompt_column: str = "prompt") -> None:
    """One sentence listing the columns found when ``rows`` have no ``prompt_column``."""
    if rows and prompt_column not in rows[0]:
        raise ValueError(f"{where} has no {prompt_column!r} column; its columns are {', '.join(rows[0])}: name the "
                         f"column that holds the prompts {prompt_column!r}")


def answer_column(rows: list[dict], where: str) -> str:
    """The column SFT imitates: the first of :data:`ANSWER_COLUMNS` the rows have (a one-sentence error if none)."""
    found = next((c for c in ANSWER_COLUMNS if rows and c in rows[0]), None)
    if found is None:
        raise ValueError(f"SFT needs the completion to imitate in a column named {', '.join(ANSWER_COLUMNS[:-1])} or "
                         f"{ANSWER_COLUMNS[-1]}; {where} has {', '.join(rows[0]) if rows else 'no columns'}")
    return found


def dataset_task_from_files(dataset: str | Path, reward_funcs: Sequence[str], reward_weights=None,
                            eval_dataset: str | Path | None = None, sft: bool = False, eval_size: int | None = None,
                            max_completion_length: int = 256, tokenizer=None) -> "DatasetTask":
    """A :class:`DatasetTask` from a data file and ``MODULE:FUNCTION`` reward names, as ``minigrpo train llm
    --dataset FILE --reward-funcs ...`` builds it: ``sft`` also reads the completion column (:func:`answer_column`);
    ``eval_size`` keeps the first rows of the held-out file only."""
    rows = load_data_file(dataset, "--dataset")
    check_prompt_column(rows, f"--dataset {dataset}")
    eval_rows = load_data_file(eval_dataset, "--eval-dataset") if eval_dataset else []
    if eval_rows:
        check_prompt_column(eval_rows, f"--eval-dataset {eval_dataset}")
    if eval_size is not None:
        eval_rows = eval_rows[:eval_size]
    if not reward_funcs:
        raise ValueError("--dataset needs --reward-funcs MODULE:FUNCTION (e.g. my_rewards:exact, a function "
                         "f(prompts, completions, **kwargs) -> list[float] in my_rewards.py)")
    funcs = [import_reward_func(spec) for spec in reward_funcs]
    answer = answer_column(rows, f"--dataset {dataset}") if sft else None
    name = Path(dataset).stem
    return DatasetTask(rows, funcs, reward_weights=reward_weights, eval_dataset=eval_rows, answer_column=answer,
                       max_completion_length=max_completion_length, tokenizer=tokenizer, name=name)


def _is_conversation(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt)


def _find_func(which: str | int | RewardFunc | None, funcs: list, names: list[str], role: str) -> RewardFunc | None:
    """The reward function named by ``which``: a function of the list, its name, or its index."""
    if which is None or callable(which) and not isinstance(which, str):
        return which
    if isinstance(which, int) and not isinstance(which, bool):
        if not 0 <= which < len(funcs):
            raise ValueError(f"{role}={which} is not an index of the {len(funcs)} reward functions")
        return funcs[which]
    if which in names:
        return funcs[names.index(which)]
    raise ValueError(f"{role}={which!r} is not one of the reward functions ({', '.join(names)})")


class DatasetTask(Task):
    """A GRPO task from rows of data and TRL-style reward functions (see the module docstring)."""

    def __init__(self, train_dataset: Any, reward_funcs: RewardFunc | Sequence[RewardFunc],
                 reward_weights: Sequence[float] | None = None, eval_dataset: Any = None,
                 prompt_column: str = "prompt", answer_column: str | None = None,
                 correctness_func: str | int | RewardFunc | None = 0, format_func: str | int | RewardFunc | None = None,
                 max_completion_length: int = 256, tokenizer=None, name: str = "dataset"):
        self.reward_funcs, self.reward_func_names, self.reward_weights = check_reward_funcs(reward_funcs, reward_weights)
        self.prompt_column, self.answer_column = prompt_column, answer_column
        self.correctness_func = _find_func(correctness_func, self.reward_funcs, self.reward_func_names,
                                           "correctness_func")
        self.format_func = _find_func(format_func, self.reward_funcs, self.reward_func_names, "format_func")
        self._names = {id(f): n for f, n in zip(self.reward_funcs, self.reward_func_names)}
        if isinstance(max_completion_length, bool) or not isinstance(max_completion_length, int) \
                or max_completion_length < 1:
            raise ValueError(f"max_completion_length must be an int >= 1, got {max_completion_length!r}")
        self.max_completion_length, self.tokenizer, self.name = max_completion_length, tokenizer, name
        self.train_set = self._problems(as_rows(train_dataset, "train_dataset"), "train_dataset")
        if not self.train_set:
            raise ValueError("train_dataset has no rows")
        self.eval_set = self._problems(as_rows(eval_dataset, "eval_dataset"), "eval_dataset")
        columns = [k for k, _ in self.train_set[0].meta]
        for func, func_name in zip(self.reward_funcs, self.reward_func_names):
            check_reward_signature(func, func_name, columns)
        from transformers import TrainerState  # what TRL hands reward functions as trainer_state

        self.state = TrainerState()  #: global_step = batches scored so far (one per GRPO step)
        self.logged_extra: dict[str, list] = {}  #: the last batch's log_extra columns
        self._metrics: dict[str, list[float]] = {}  #: the last batch's log_metric values

    def _problems(self, rows: list[dict], where: str) -> list[Problem]:
        """Each row as a ``Problem``: its prompt, its SFT answer, and every other column in ``meta`` (pairs)."""
        problems = []
        for i, row in enumerate(rows):
            if self.prompt_column not in row:
                raise ValueError(f"{where} has no prompt column {self.prompt_column!r}; its columns are "
                                 f"{', '.join(map(repr, row))} (set prompt_column=)")
            if self.answer_column is not None and self.answer_column not in row:
                raise ValueError(f"{where} has no answer column {self.answer_column!r}; its columns are "
                                 f"{', '.join(map(repr, row))}")
            clash = [c for c in row if c in RESERVED_KWARGS and c != self.prompt_column]
            if clash:
                raise ValueError(f"{where} has a column named {clash[0]!r}, a keyword TRL passes to reward "
                                 "functions itself: rename the column")
            prompt = row[self.prompt_column]
            if not isinstance(prompt, str) and not _is_conversation(prompt):
                raise TypeError(f"{where}[{i}][{self.prompt_column!r}] must be a string or a list of "
                                f"{{'role', 'content'}} messages, got {type(prompt).__name__}")
            answer = row[self.answer_column] if self.answer_column is not None else ""
            if _is_conversation(answer):  # TRL's conversational completion: [{"role": "assistant", ...}]
                answer = answer[-1]["content"] if answer else ""
            columns = tuple((k, v) for k, v in row.items() if k != self.prompt_column and k not in _NOT_PASSED)
            problems.append(Problem(prompt, answer if isinstance(answer, str) else str(answer), columns))
        return problems

    def sample(self, rng: random.Random) -> Problem:
        """A training row, uniformly at random."""
        return self.train_set[rng.randrange(len(self.train_set))]

    # ------------------------------------------------------------------ rewards
    def _kwargs(self, problems: list[Problem], completions: list[str], finished: Sequence[bool],
                completion_ids: list[list[int]] | None, trainer_state) -> dict[str, Any]:
        """The keyword arguments TRL passes a reward function, for this batch."""
        columns = [k for k, _ in problems[0].meta] if problems else []
        kwargs: dict[str, Any] = {k: [dict(p.meta).get(k) for p in problems] for k in columns}
        if completion_ids is None and self.tokenizer is not None:  # re-encoded: the sampled ids may differ
            eos = self.tokenizer.eos_token_id
            completion_ids = [self.tokenizer.encode(c, add_special_tokens=False) + ([eos] if f else [])
                              for c, f in zip(completions, finished)]
        kwargs.update(completion_ids=completion_ids, trainer_state=trainer_state or self.state,
                      log_extra=self._log_extra, log_metric=self._log_metric)
        return kwargs

    def _log_extra(self, column: str, values: list) -> None:
        self.logged_extra.setdefault(column, []).extend(values)

    def _log_metric(self, name: str, value: float) -> None:
        self._metrics.setdefault(name, []).append(float(value))

    @staticmethod
    def _completions_for(problems: list[Problem], completions: list[str]) -> list:
        """Strings for string prompts; ``[{"role": "assistant", "content": text}]`` for conversations (TRL's)."""
        return [[{"role": "assistant", "content": c}] if isinstance(p.prompt, list) else c
                for p, c in zip(problems, completions)]

    def score(self, problems: list[Problem], completions: list[str], finished: list[bool],
              completion_ids: list[list[int]] | None = None, trainer_state=None) -> tuple[list[float], dict[str, float]]:
        """Every reward function on the batch, weighted and summed; TRL's metrics plus ``correct`` and ``format``.

        ``completion_ids``: the sampled token ids (without them, the completions re-encoded with
        ``tokenizer`` when the task has one, else None); ``trainer_state``: TRL's (without it, the
        task's own, whose ``global_step`` counts the batches scored before this one).
        """
        if not len(problems) == len(completions) == len(finished):
            raise ValueError(f"score needs one problem and one finished flag per completion, got {len(problems)} "
                             f"problems, {len(completions)} completions and {len(finished)} flags")
        self._metrics, self.logged_extra = {}, {}
        kwargs = self._kwargs(problems, completions, finished, completion_ids, trainer_state)
        prompts, shaped = [p.prompt for p in problems], self._completions_for(problems, completions)
        try:
            per_func = run_reward_funcs(self.reward_funcs, self.reward_func_names, prompts, shaped, **kwargs)
        except (ValueError, TypeError) as exc:  # name the step (TRL's global_step counts the steps done before it)
            step = (trainer_state.global_step + 1) if trainer_state is not None else self.state.global_step + 1
            raise type(exc)(f"{exc} (GRPO step {step})") from exc
        rewards = combine_rewards(per_func, self.reward_weights)
        self.rewards_per_func = per_func  # the trainer gathers them over processes for the metrics
        metrics = reward_func_metrics(per_func)
        metrics.update({k: sum(v) / len(v) for k, v in self._metrics.items()})  # log_metric, averaged
        for key, func in (("correct", self.correctness_func), ("format", self.format_func)):
            values = per_func.get(self._names.get(id(func))) if func is not None else None
            if func is not None and values is None:  # an evaluation-only function: one more call
                values = run_reward_funcs([func], ["eval"], prompts, shaped, **kwargs)["eval"]
            ok = [bool(f) and (values is None or values[i] > 0) for i, f in enumerate(finished)]
            metrics[key] = sum(ok) / max(len(ok), 1)
        if trainer_state is None:
            self.state.global_step += 1
        return rewards, metrics

    def _one(self, func: RewardFunc, problem: Problem, completion: str, finished: bool) -> float:
        """``func``'s reward for one completion, called as in training; None counts as 0 here."""
        kwargs = self._kwargs([problem], [completion], [finished], None, self.state)
        name = self._names.get(id(func), "reward")
        out = run_reward_funcs([func], [name], [problem.prompt], self._completions_for([problem], [completion]),
                               **kwargs)[name][0]
        return 0.0 if math.isnan(out) else out

    def correctness_reward(self, problem: Problem, completion: str, finished: bool = True) -> float:
        """1 if the completion ended and ``correctness_func`` gives it a reward > 0, else 0 (evaluation's pass@k)."""
        if self.correctness_func is None:
            raise ValueError(f"the {self.name} task has no correctness function (correctness_func=None)")
        return float(finished and self._one(self.correctness_func, problem, completion, finished) > 0)

    def format_reward(self, problem: Problem, completion: str, finished: bool = True) -> float:
        """1 if the completion ended (and ``format_func``, when given, gives it a reward > 0), else 0."""
        if self.format_func is None:
            return float(finished)
        return float(finished and self._one(self.format_func, problem, completion, finished) > 0)

    def reward(self, problem: Problem, completion: str, finished: bool = True) -> float:
        """The training reward of one completion (the weighted sum of every reward function)."""
        return self.score([problem], [completion], [finished], trainer_state=self.state)[0][0]  # not a step

    def __repr__(self) -> str:
        return (f"DatasetTask({self.name!r}: {len(self.train_set)} training rows, {len(self.eval_set)} held out, "
                f"rewards {dict(zip(self.reward_func_names, self.reward_weights))})")


def task_dataset(task: Task, num_problems: int, seed: int = 0, eval: bool = False) -> list[dict]:
    """A built-in task's problems as rows ``{"prompt", "answer"}`` (the held-out set with ``eval=True``).

    With :func:`minigrpo.llm.rewards.task_reward_funcs` this is the task as TRL would take it.
    """
    if eval:
        problems = task.eval_set[:num_problems]
    else:
        rng = random.Random(seed)
        problems = [task.sample(rng) for _ in range(num_problems)]
    return [{"prompt": p.prompt, "answer": p.answer} for p in problems]


__all__ = ["ANSWER_COLUMNS", "DATA_FILE_KINDS", "DatasetTask", "answer_column", "as_rows", "check_prompt_column",
           "dataset_task_from_files", "load_data_file", "load_rows", "task_dataset"]
