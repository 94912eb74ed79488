"""The capstone lesson's plumbing (lesson 12, GRPO on a pretrained model).

On a machine with a GPU and the hub the lesson loads ``Qwen/Qwen2.5-0.5B-Instruct`` and uses only the
last three items below. Elsewhere it makes its own pretrained model first, in the same shape (a Qwen2
checkpoint folder with a byte-level BPE tokenizer and a chat template), then runs the same workflow:

- :func:`pretraining_documents`: word problems with their worked solutions as plain text (no chat
  format, no tags): what the model reads in pretraining;
- :func:`build_own_model`: the tokenizer trained on that text, a small Qwen2 model (``build_qwen_like``);
- :func:`pretrain`: next-token prediction on the documents (every token counts);
- :func:`slip_solution` / :func:`imperfect_demonstrations`: the SFT data of an imperfect demonstrator,
  a share of whose worked solutions carry a slip (a wrong step, propagated, or a wrong final answer),
  as distilled data does;
- :func:`grpo_seeds` / :func:`seed_table`: GRPO from one saved checkpoint with several seeds, each evaluated on
  the held-out set; :func:`metric_series` reads a dashboard metric back per step;
- :func:`classify_completion` / :func:`outcome_shares`: what kind of mistake each sampled completion makes;
- :func:`save_policy` / :func:`load_policy`: ``save_pretrained`` of the weights (or LoRA adapters) and tokenizer,
  and back.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from minigrpo.infra.checks import at_least, check_config_types, in_unit_interval, positive
from minigrpo.llm.gsm8k import (SYSTEM_PROMPT, TEMPLATES, correctness_reward, extract_answer, format_reward,
                                normalize_number, sft_target, word_problem)
from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.models import build_qwen_like, load_causal_lm
from minigrpo.llm.sampling import generate
from minigrpo.llm.sft import evaluate_task
from minigrpo.losses import token_logprobs
from minigrpo.utils import model_device

#: The templates (of ``gsm8k.TEMPLATES``) our own CPU-sized model is trained on: two-step shopping-change and
#: sharing problems. Measured on 2 shared CPU cores: a 1.05M-parameter model pretrained for 1,200 steps (~6 min)
#: solves 0.97 of held-out ones greedily and 0.91 sampled at temperature 1; on five templates (adding ages,
#: fractions, legs) 800 steps gave 0.48 greedily (legs 0.02): more arithmetic than a few CPU minutes can teach.
OWN_TEMPLATES = ("change", "sharing")

_CALCULATOR = re.compile(r"<<[^<>]*>>")
_STEP = re.compile(r"(\d+)([-+*/])(\d+) = (\d+)")


# ----------------------------------------------------------------------------- pretraining

def pretraining_documents(rows: list[dict]) -> list[str]:
    """GSM8K rows as plain-text documents: the question, the worked solution (calculator notes dropped), ``#### n``."""
    return [f"{r['question']}\n{_CALCULATOR.sub('', r['answer']).strip()}" for r in rows]


def build_own_model(folder: str | Path, rows: list[dict], vocab_size: int = 1024, hidden_size: int = 128,
                    num_layers: int = 4, num_heads: int = 4, num_kv_heads: int = 2, max_positions: int = 256,
                    seed: int = 0) -> Path:
    """A Qwen2-shaped checkpoint folder (random weights) whose byte-level BPE tokenizer is trained on ``rows``'
    documents, their tag-format solutions and the chat-formatted system prompt (what the model will read)."""
    chats = [f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{r['question']}<|im_end|>\n"
             f"<|im_start|>assistant\n{sft_target(r['answer'])}<|im_end|>" for r in rows[:500]]
    return build_qwen_like(folder, pretraining_documents(rows) + chats, vocab_size=vocab_size,
                           hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                           num_kv_heads=num_kv_heads, max_positions=max_positions, seed=seed)


@dataclass
class PretrainConfig:
    """Next-token prediction on documents (each ends with the tokenizer's end-of-text, ``<|endoftext|>``)."""

    steps: int = 1200  #: optimizer steps
    batch_size: int = 32  #: documents per step (right-padded; pads get no loss)
    learning_rate: float = 3e-3  #: AdamW peak step size: linear warm-up, then cosine decay to 10%
    warmup_steps: int = 30  #: steps of linear warm-up
    weight_decay: float = 0.01  #: AdamW weight decay
    seed: int = 0  #: seeds the document stream

    def __post_init__(self):
        check_config_types(self)
        at_least(self, 1, "steps", "batch_size")
        at_least(self, 0, "warmup_steps")
        positive(self, "learning_rate")
        in_unit_interval(self, "weight_decay")


def _lr_factor(step: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(progress, 1.0)))


def pretrain(model, tokenizer, documents: list[str], config: PretrainConfig | None = None,
             progress: bool = True) -> dict[str, list]:
    """Train ``model`` in place on ``documents`` (loss on every token, the end-of-text included); returns the
    loss per step. Runs on the model's device."""
    cfg = config or PretrainConfig()
    if not documents:
        raise ValueError("documents is empty: pretrain needs at least one document")
    end = tokenizer.pad_token_id  # <|endoftext|>: the end of a document, as in a base model's pretraining
    encoded = [tokenizer.encode(d, add_special_tokens=False) + [end] for d in documents]
    device, rng = model_device(model), random.Random(cfg.seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate,
                            weight_decay=cfg.weight_decay, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    history = {"step": [], "loss": []}
    model.train()
    for step in tqdm(range(1, cfg.steps + 1), desc="pretraining", disable=not progress):
        rows = [encoded[rng.randrange(len(encoded))] for _ in range(cfg.batch_size)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), end, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, :len(r)], attn[i, :len(r)] = torch.tensor(r), 1
        ids, attn = ids.to(device), attn.to(device)
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
        mask = attn[:, 1:].float()  # position t predicts token t + 1: count it where that token is real
        loss = -(token_logprobs(logits, ids) * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        history["step"].append(step)
        history["loss"].append(loss.item())
    model.eval()
    return history


# ----------------------------------------------------------------------------- data: problems and demonstrations

def word_problems(num_problems: int, templates: Sequence[str] | None = None, seed: int = 0,
                  exclude: Sequence[str] = ()) -> list[dict]:
    """``num_problems`` distinct GSM8K-format rows ``{"question", "answer"}`` drawn from ``templates`` (names of
    ``gsm8k.TEMPLATES``; None: all of them), none of whose questions is in ``exclude``; the same for the same seed."""
    names = list(TEMPLATES) if templates is None else list(templates)
    unknown = [t for t in names if t not in TEMPLATES]
    if not names or unknown:
        raise ValueError(f"templates must be names from {', '.join(TEMPLATES)}, got {list(names)!r}")
    rng, seen, rows = random.Random(seed), set(exclude), []
    for _ in range(50 * num_problems + 1000):
        if len(rows) == num_problems:
            return rows
        row = word_problem(rng, rng.choice(names))
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    raise ValueError(f"could not draw {num_problems} distinct problems from templates {names} (got {len(rows)})")


def _result(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else a}[op]


def slip_solution(solution: str, rng: random.Random, kind: str | None = None) -> str:
    """A tag-format solution (``gsm8k.sft_target``) with one slip, as an imperfect demonstrator writes it.

    ``kind``: ``"step"``, one step's result is off (by ±1, ±2 or ±10) and the later steps carry the wrong number
    on (a division is then written rounded down) to a wrong, non-negative final answer (if no such offset exists,
    the answer slip instead); ``"answer"``, the reasoning is right but the answer tag holds the previous step's
    result (stopping a step early), or the result + 1 for a one-step solution; None picks one at random. Either
    way the final answer is wrong.
    """
    if kind is None:
        kind = rng.choice(("step", "answer"))
    if kind not in ("step", "answer"):
        raise ValueError(f"kind must be 'step', 'answer' or None, got {kind!r}")
    lines = solution.split("\n")
    steps = [i for i, line in enumerate(lines) if _STEP.search(line)]
    if not steps:
        raise ValueError(f"no worked step 'a op b = c' in the solution {solution!r}")
    results = [int(_STEP.search(lines[i]).group(4)) for i in steps]
    if kind == "step":
        first = rng.randrange(len(steps))
        for delta in rng.sample((-10, -2, -1, 1, 2, 10), 6):  # the first slip whose error reaches the answer
            slipped, values = _carry(lines, steps[first:], delta)
            final = values[-1]
            if final != results[-1] and min(values) >= 0:
                return re.sub(r"<answer>.*?</answer>", f"<answer>{final}</answer>", "\n".join(slipped))
    wrong = results[-2] if len(results) > 1 and results[-2] != results[-1] else results[-1] + 1
    return re.sub(r"<answer>.*?</answer>", f"<answer>{wrong}</answer>", solution)


def _carry(lines: list[str], steps: list[int], delta: int) -> tuple[list[str], int]:
    """``lines`` with the result of line ``steps[0]`` moved by ``delta`` and every later step recomputed from the
    wrong numbers; returns the lines and the new results."""
    lines, changed = list(lines), {}  # right value -> the wrong value that replaces it in later steps
    for n, i in enumerate(steps):
        a, op, b, c = _STEP.search(lines[i]).groups()
        a, b = changed.get(int(a), int(a)), changed.get(int(b), int(b))
        new = int(c) + delta if n == 0 else _result(a, op, b)
        changed[int(c)] = new
        lines[i] = _STEP.sub(f"{a}{op}{b} = {new}", lines[i], count=1)
    return lines, list(changed.values())


def imperfect_demonstrations(rows: list[dict], error_rate: float, seed: int = 0,
                             kinds: Sequence[str] = ("step", "answer")) -> list[dict]:
    """GRPO rows (``gsm8k.prepare_gsm8k``) whose ``solution`` — what SFT imitates — carries a slip
    (:func:`slip_solution`, of one of ``kinds``) in a share ``error_rate`` of them, as distilled data does;
    ``answer`` stays the right number (what the reward checks). A column ``slip`` says which rows were changed
    ("", "step" or "answer")."""
    if not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"error_rate must be in [0, 1], got {error_rate!r}")
    if not kinds or any(k not in ("step", "answer") for k in kinds):
        raise ValueError(f"kinds must name 'step' and/or 'answer', got {kinds!r}")
    rng, out = random.Random(seed), []
    for row in rows:
        kind = rng.choice(list(kinds)) if rng.random() < error_rate else ""
        solution = slip_solution(row["solution"], rng, kind) if kind else row["solution"]
        out.append({**row, "solution": solution, "slip": kind})
    return out


# ----------------------------------------------------------------------------- GRPO over seeds, saving, reloading

@dataclass
class SeedRun:
    """One GRPO run from the shared starting checkpoint: its held-out metrics after training and its dashboard."""

    seed: int
    after: dict  #: evaluate_task's metrics after GRPO (pass@1, pass@G, greedy, format, completion_length)
    history: dict  #: the trainer's per-step metrics (TRL's names)
    seconds: float  #: wall-clock of the GRPO steps (evaluation excluded)
    model: torch.nn.Module  #: the trained policy (a peft model when trained with peft_config)


def grpo_seeds(checkpoint: str | Path, task, config: GRPOConfig, seeds: Sequence[int] = (0, 1, 2),
               peft_config=None, device: str | torch.device | None = None, eval_seed: int = 0,
               progress: bool = False) -> list[SeedRun]:
    """GRPO from ``checkpoint`` (a folder or a hub name, loaded afresh with ``load_causal_lm`` for each seed) once
    per seed — ``config`` with its ``seed`` replaced —, each evaluated on ``task``'s held-out set with the same
    sampling seed ``eval_seed``, so that only the training differs between runs."""
    runs = []
    for seed in seeds:
        model, tokenizer = load_causal_lm(checkpoint, device=device)
        cfg = replace(config, seed=seed, eval_every=0)
        trainer = GRPOTrainer(model, tokenizer, task, cfg, peft_config=peft_config)
        start = time.perf_counter()
        result = trainer.train(progress=progress)
        seconds = time.perf_counter() - start
        after = evaluate_task(trainer.model, tokenizer, task, num_generations=cfg.eval_generations,
                              temperature=cfg.temperature, seed=eval_seed, use_chat_template=cfg.use_chat_template,
                              system_prompt=cfg.system_prompt, bf16=cfg.bf16)
        runs.append(SeedRun(seed, after, result.history, seconds, trainer.model))
    return runs


def seed_table(before: dict, runs: Sequence[SeedRun], k: int = 8) -> str:
    """A Markdown table of the held-out metrics before GRPO and after it, one row per seed, then the mean."""
    keys = ["pass@1", f"pass@{k}", "greedy", "format"]
    lines = ["| run | " + " | ".join(keys) + " | GRPO time |", "|---" * (len(keys) + 2) + "|",
             "| before GRPO | " + " | ".join(f"{before[key]:.3f}" for key in keys) + " | |"]
    for run in runs:
        lines.append(f"| seed {run.seed} | " + " | ".join(f"{run.after[key]:.3f}" for key in keys)
                     + f" | {run.seconds / 60:.1f} min |")
    if runs:
        mean = {key: float(np.mean([r.after[key] for r in runs])) for key in keys}
        lines.append(f"| mean of {len(runs)} seeds | " + " | ".join(f"{mean[key]:.3f}" for key in keys) + " | |")
    return "\n".join(lines)


def save_policy(model, tokenizer, folder: str | Path) -> Path:
    """``save_pretrained`` of the model and its tokenizer into ``folder``: the full weights, or, for a peft model,
    only the adapters (``adapter_config.json`` names the base model they go on)."""
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_policy(folder: str | Path, device: str | torch.device | None = None):
    """``(model, tokenizer)`` from a :func:`save_policy` folder: ``load_causal_lm`` for full weights; for adapters,
    their base model (``base_model_name_or_path``) loaded the same way, then ``PeftModel.from_pretrained``."""
    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file():
        return load_causal_lm(folder, device=device)
    from peft import PeftConfig, PeftModel

    base, tokenizer = load_causal_lm(PeftConfig.from_pretrained(folder).base_model_name_or_path, device=device)
    return PeftModel.from_pretrained(base, folder).eval(), tokenizer


def metric_series(history: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of one dashboard metric. Loss-side metrics (entropy, grad_norm, the sampler gap) exist only
    for steps that took an optimizer step; a step whose groups were all filtered out (``skipped``) has none."""
    steps, values = np.asarray(history["step"]), np.asarray(history.get(key, []), dtype=float)
    if len(values) != len(steps):
        steps = steps[np.asarray(history["skipped"]) == 0]
    return steps, values


# ----------------------------------------------------------------------------- what kind of mistakes

#: The kinds of sampled completion :func:`classify_completion` tells apart, in the order it checks them.
OUTCOMES = ("right", "malformed or unfinished", "a wrong step", "answer tag ≠ last step", "other wrong")


def classify_completion(text: str, finished: bool, answer: str) -> str:
    """What a completion did, as one of :data:`OUTCOMES`: right; not ended or not in the tag format; a step whose
    arithmetic is wrong (``a op b = c`` with c ≠ a op b; a division must be exact); the steps right but the answer
    tag not the last step's result (the demonstrator's "answer" slip); or wrong otherwise (e.g. a number misread
    from the question, or the wrong operation)."""
    if correctness_reward([None], [text], answer=[answer])[0] and finished:
        return "right"
    if not finished or not format_reward([None], [text])[0]:
        return "malformed or unfinished"
    steps = [(int(a), op, int(b), int(c)) for a, op, b, c in _STEP.findall(text)]
    if any(b * c != a if op == "/" else _result(a, op, b) != c for a, op, b, c in steps):
        return "a wrong step"
    if steps and normalize_number(extract_answer(text)) != str(steps[-1][3]):
        return "answer tag ≠ last step"
    return "other wrong"


@torch.no_grad()
def outcome_shares(model, tokenizer, task, num_generations: int = 8, seed: int = 0) -> dict[str, float]:
    """The share of each of :data:`OUTCOMES` among ``num_generations`` samples (temperature 1) per held-out problem
    of ``task`` (whose problems carry an ``answer`` column)."""
    counts = dict.fromkeys(OUTCOMES, 0)
    gen = torch.Generator(model_device(model)).manual_seed(seed)
    for i in range(0, len(task.eval_set), 50):
        chunk = task.eval_set[i:i + 50]
        out = generate(model, tokenizer, [p.prompt for p in chunk], num_generations, task.max_completion_length, 1.0,
                       generator=gen)
        for j, (text, done) in enumerate(zip(out.texts(tokenizer), out.finished.tolist())):
            counts[classify_completion(text, done, str(dict(chunk[j // num_generations].meta)["answer"]))] += 1
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}
