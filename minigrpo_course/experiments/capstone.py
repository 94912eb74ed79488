"""Lesson 12's measurements on a real model: held-out samples, scored by any verifier.

One pass of sampling serves every number the lesson prints about a model: :func:`sample_held_out` draws k
completions per held-out problem at temperature 1 and one greedy completion, keeping the token ids (whose last
token says whether the completion ended); then

- :func:`pass_at_k` scores them with a correctness reward function (TRL's signature): pass@1 (the mean over
  the k samples), pass@k, greedy;
- :func:`outcome_shares` sorts them into the mistakes GRPO can remove (:func:`classify`);
- :func:`hack_census` counts the samples a loose verifier credits and the hardened one refuses.

:func:`dashboard` plots a run's logged metrics (plumbing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from minigrpo.llm.arithmetic import mentions_tag, parse_answer
from minigrpo.llm.rewards import call_reward_func
from minigrpo.llm.sampling import generate
from minigrpo.utils import autocast_bf16, model_device


@dataclass
class Samples:
    """k sampled completions and one greedy completion per held-out row, as text and as token ids."""

    rows: list[dict]  #: the held-out rows (``prompt``, ``answer``, …)
    texts: list[list[str]]  #: [n][k] sampled completions
    ids: list[list[list[int]]]  #: [n][k] their token ids, up to and including the end-of-turn token
    greedy_texts: list[str]  #: [n]
    greedy_ids: list[list[int]]  #: [n]
    seconds: float = 0.0  #: wall-clock time it took

    @property
    def k(self) -> int:
        return len(self.texts[0])


def _kept_ids(out) -> list[list[int]]:
    return [row[:n] for row, n in zip(out.completion_ids.tolist(), out.completion_mask.sum(1).tolist())]


@torch.no_grad()
def sample_held_out(model, tokenizer, rows: Sequence[dict], k: int = 8, max_new_tokens: int = 40, seed: int = 0,
                    bf16: bool = True, batch_prompts: int = 32) -> Samples:
    """k completions per row at temperature 1 and one greedy, ``batch_prompts`` rows at a time, under bf16
    autocast when ``bf16`` (the weights stay as they are), with a generator seeded ``seed`` (the same draws for
    every model evaluated with the same seed)."""
    t0, device = time.perf_counter(), model_device(model)
    gen = torch.Generator(device=device).manual_seed(seed)
    model.eval()
    texts, ids, greedy_texts, greedy_ids = [], [], [], []
    for i in range(0, len(rows), batch_prompts):
        prompts = [r["prompt"] for r in rows[i:i + batch_prompts]]
        with autocast_bf16(device, bf16):
            out = generate(model, tokenizer, prompts, k, max_new_tokens, 1.0, generator=gen)  # rows × k
            best = generate(model, tokenizer, prompts, 1, max_new_tokens, greedy=True)
        flat, flat_ids = out.texts(tokenizer), _kept_ids(out)
        texts += [flat[j:j + k] for j in range(0, len(flat), k)]
        ids += [flat_ids[j:j + k] for j in range(0, len(flat), k)]
        greedy_texts += best.texts(tokenizer)
        greedy_ids += _kept_ids(best)
    return Samples(list(rows), texts, ids, greedy_texts, greedy_ids, time.perf_counter() - t0)


def score(reward_func: Callable, rows: Sequence[dict], texts: Sequence[str], ids: Sequence[list[int]]) -> np.ndarray:
    """``reward_func`` called as TRL calls it on one completion per row (conversational completions, the rows'
    columns by name, ``completion_ids``): an array of rewards."""
    columns = {key: [r[key] for r in rows] for key in rows[0] if key != "prompt"}
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    return np.array(call_reward_func(reward_func, "verifier", [r["prompt"] for r in rows], completions,
                                     completion_ids=list(ids), **columns))


def _flat(s: Samples) -> tuple[list[dict], list[str], list[list[int]]]:
    return ([r for r in s.rows for _ in range(s.k)], [t for ts in s.texts for t in ts],
            [i for row in s.ids for i in row])


def pass_at_k(s: Samples, correctness: Callable) -> dict[str, float]:
    """pass@1 (the share of right samples: the accuracy of one sample), pass@k (the share of problems with at
    least one right sample among k), greedy (the accuracy of the most likely answer), under ``correctness``."""
    right = (score(correctness, *_flat(s)) > 0).reshape(len(s.rows), s.k)
    greedy = score(correctness, s.rows, s.greedy_texts, s.greedy_ids) > 0
    return {"pass@1": float(right.mean()), f"pass@{s.k}": float(right.any(1).mean()), "greedy": float(greedy.mean())}


OUTCOMES = ("right", "wrong number in the tag", "no tag, or a malformed one", "unfinished")


def classify(text: str, ids: list[int], answer: int, end_of_turn_ids: Sequence[int]) -> str:
    """One of :data:`OUTCOMES`: did it end, does it hold one tag with an integer, is that integer right."""
    if not ids or ids[-1] not in end_of_turn_ids:
        return "unfinished"
    given = parse_answer(text)
    if given is None:
        return "no tag, or a malformed one"
    return "right" if given == int(answer) else "wrong number in the tag"


def outcome_shares(s: Samples, end_of_turn_ids: Sequence[int]) -> dict[str, float]:
    """The share of the sampled completions in each of :data:`OUTCOMES`."""
    kinds = [classify(t, i, r["answer"], end_of_turn_ids) for r, t, i in zip(*_flat(s))]
    return {o: kinds.count(o) / len(kinds) for o in OUTCOMES}


def hack_census(s: Samples, correctness: Callable, loose_checks: Mapping[str, Callable]) -> dict[str, float]:
    """The share of sampled completions that each loose check (``(text, answer) -> bool``) calls right while
    ``correctness`` (the hardened verifier) refuses them, and the share that would earn format credit for merely
    mentioning ``<answer>`` although they are wrong."""
    rows, texts, ids = _flat(s)
    strict = score(correctness, rows, texts, ids) > 0
    out = {name: float(np.mean([check(t, int(r["answer"])) and not ok for r, t, ok in zip(rows, texts, strict)]))
           for name, check in loose_checks.items()}
    out["format credit, wrong answer"] = float(np.mean([mentions_tag(t) and not ok for t, ok in zip(texts, strict)]))
    return out


def examples(s: Samples, end_of_turn_ids: Sequence[int], kind: str, n: int = 3) -> list[str]:
    """Up to ``n`` sampled completions of one outcome (:data:`OUTCOMES`), as ``question -> completion`` lines."""
    out = []
    for r, t, i in zip(*_flat(s)):
        if classify(t, i, r["answer"], end_of_turn_ids) == kind and len(out) < n:
            out.append(f"{r['prompt'][-1]['content']!r} -> {t!r}")
    return out


def metric_series(history: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of one logged metric, skipping steps where it is missing or NaN."""
    steps, values = history["step"], history.get(key, [])
    pairs = [(s, v) for s, v in zip(steps, values) if v is not None and np.isfinite(v)]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def dashboard(histories: Mapping[str, dict], panels: Sequence[tuple[str, str]], smooth: int = 1, cols: int = 4):
    """One panel per ``(metric, title)``, one line per run (``{label: history}``), a running mean over ``smooth``
    steps. Returns the figure."""
    import matplotlib.pyplot as plt

    rows_ = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(3.3 * cols, 2.6 * rows_), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels):
        for label, history in histories.items():
            x, y = metric_series(history, key)
            if len(y) >= smooth > 1:
                x, y = x[smooth - 1:], np.convolve(y, np.ones(smooth) / smooth, mode="valid")
            ax.plot(x, y, lw=1.2, label=label)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("GRPO step", fontsize=8)
    fig.tight_layout()
    return fig
