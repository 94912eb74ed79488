"""Supervised fine-tuning: teach the format and some of the skill, making the reference policy.

Teacher forcing on ``prompt answer <end-of-turn>`` — the prompt encoded as the sampler encodes it (BOS
only if the tokenizer has one; the chat template when asked or when the prompt is a conversation), the
end-of-turn token the first of the model's ``generation_config.eos_token_id`` —, the loss counted on the
answer and end-of-turn tokens only. Stopped early on purpose, the model is decent but clearly imperfect —
the starting point GRPO improves on (as in DeepSeek-R1's "cold start" SFT before RL).

Runs on the model's device; ``bf16`` runs the forward under bf16 autocast. Only parameters that require
gradients are trained, so a ``peft`` model (``get_peft_model``) trains its adapters alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import numpy as np
import torch
from tqdm.auto import tqdm

from minigrpo.infra.distributed import Distributed
from minigrpo.infra.divergence import (check_weights_before_training, stop_if_not_finite,
                                       stop_if_weights_diverged)
from minigrpo.infra.checks import at_least, check_config_types, in_unit_interval, non_negative, positive
from minigrpo.llm.models import enable_gradient_checkpointing
from minigrpo.llm.sampling import check_context_length, end_of_turn_ids, generate, prompt_token_ids
from minigrpo.llm.tasks import Problem, Task
from minigrpo.losses import token_logprobs
from minigrpo.utils import autocast_bf16, float32_masters, model_device


@dataclass
class SFTConfig:
    steps: int = 300  #: optimizer steps
    batch_size: int = 64  #: problems per step
    learning_rate: float = 3e-3  #: AdamW step size (cosine-decayed to 10%)
    weight_decay: float = 0.0  #: AdamW weight decay
    demo_error_rate: float = 0.0  #: share of demonstrations replaced by a teacher's slip (task.noisy_answer)
    seed: int = 0  #: seeds the problem stream (the model is seeded where it is made)
    use_chat_template: bool = False  #: format plain-text prompts as one user message with the tokenizer's template
    system_prompt: str | None = None  #: a system message put before each prompt (needs the chat template)
    bf16: bool = False  #: forward under bf16 autocast (float32 master weights)
    gradient_checkpointing: bool = False  #: recompute activations in backward (HF's, non-reentrant): less memory

    def __post_init__(self):
        check_config_types(self)
        at_least(self, 1, "steps", "batch_size")
        positive(self, "learning_rate")
        non_negative(self, "weight_decay")
        in_unit_interval(self, "demo_error_rate")


def sft_batch(tokenizer, problems: list[Problem], device="cpu", use_chat_template: bool = False,
              system_prompt: str | None = None, end_id: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt answer <end>`` rows (the prompt as ``sampling.prompt_token_ids`` encodes it; ``end_id``
    defaults to the tokenizer's EOS), their attention mask, and the loss mask ``[B, T − 1]`` aligned with
    ``token_logprobs`` (1 where the *predicted* token is answer or end)."""
    end_id = tokenizer.eos_token_id if end_id is None else end_id
    rows, starts = [], []
    for i, p in enumerate(problems):
        prompt = prompt_token_ids(tokenizer, p.prompt, use_chat_template, system_prompt, i)
        answer = tokenizer.encode(p.answer, add_special_tokens=False) + [end_id]
        rows.append(prompt + answer)
        starts.append(len(prompt))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    loss_mask = torch.zeros((len(rows), width - 1))
    for i, (r, s) in enumerate(zip(rows, starts)):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        loss_mask[i, s - 1: len(r) - 1] = 1  # logits at s-1 predict the first answer token
    return ids.to(device), attn.to(device), loss_mask.to(device)


class SFTTrainer:
    """Teacher-forced fine-tuning, one optimizer step per :meth:`step` (TRL's name for the same job).

    Several processes (``accelerate launch``, ``torchrun``; ``minigrpo.infra.distributed``): each draws its own
    ``batch_size`` problems (its own seed: the global batch is N × ``batch_size``), the loss is normalised by the
    answer tokens of *every* process and the gradients are summed, so the step is the one-process step of the global
    batch. Every rank starts from rank 0's weights; in one process nothing changes.
    """

    def __init__(self, model, tokenizer, task: Task, config: SFTConfig | None = None):
        self.cfg = cfg = config or SFTConfig()
        self.model, self.tokenizer, self.task = model, tokenizer, task
        self.dist = Distributed()  # one process: every collective is the identity
        self.dist.broadcast_parameters(model)
        self.rng = random.Random(self.dist.seed(cfg.seed))  # rank 0: cfg.seed; the other ranks their own
        self.device, self.end_id = model_device(model), end_of_turn_ids(model, tokenizer)[0]
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        float32_masters(model)  # AdamW steps float32 weights, even from a bf16 checkpoint (bf16: autocast)
        check_weights_before_training(model, "SFT")
        self.step_count = 0
        params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, foreach=True)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(s, cfg.steps) / cfg.steps)))

    def sample_problems(self) -> list[Problem]:
        """This process's ``batch_size`` demonstrations (with ``demo_error_rate``, some are a teacher's slips)."""
        cfg, rng = self.cfg, self.rng
        problems = [self.task.sample(rng) for _ in range(cfg.batch_size)]
        if cfg.demo_error_rate:  # an imperfect teacher: some demonstrations are wrong
            problems = [replace(p, answer=self.task.noisy_answer(p, rng)) if rng.random() < cfg.demo_error_rate
                        else p for p in problems]
        return problems

    def step(self, problems: list[Problem] | None = None) -> float:
        """One optimizer step on ``problems`` (default: :meth:`sample_problems`): the negative
        log-likelihood of the answer and end-of-turn tokens, a token mean over the global batch.
        Returns that loss."""
        cfg, step = self.cfg, self.step_count + 1
        problems = self.sample_problems() if problems is None else problems
        ids, attn, mask = sft_batch(self.tokenizer, problems, self.device, end_id=self.end_id,
                                    use_chat_template=cfg.use_chat_template,
                                    system_prompt=cfg.system_prompt)  # (B, T), (B, T), (B, T − 1)
        check_context_length(self.model, ids.shape[1], 0)
        self.model.train()
        with autocast_bf16(self.device, cfg.bf16):
            logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # (B, T, V)
        logp = token_logprobs(logits, ids)  # (B, T − 1), chunked: no float32 copy of the logits
        # this process's share of the global token mean: the normaliser counts every rank's tokens
        loss = -(logp * mask).sum() / self.dist.sum(mask.sum().item())
        total = self.dist.sum(loss.item())  # the shares add up to the global token mean
        stop_if_not_finite(total, "SFT", step, "the loss", cfg.learning_rate)  # before the weights move
        self.opt.zero_grad()
        loss.backward()
        self.dist.sum_gradients(self.model)  # each rank's loss is its share of the global one: sum them
        self.opt.step()
        stop_if_weights_diverged(self.model, "SFT", step, cfg.learning_rate)
        self.sched.step()  # cosine decay to 10% of learning_rate
        self.step_count = step
        return total

    def train(self, progress: bool = True) -> dict:
        """``steps`` steps with a progress bar (rank 0's); returns ``{"step": [...], "loss": [...],
        "learning_rate": [...]}`` (TRL's names; the rate each step used)."""
        hist = {"step": [], "loss": [], "learning_rate": []}
        bar = tqdm(range(1, self.cfg.steps + 1), desc=f"SFT {self.task.name}", disable=not progress or not
                   self.dist.is_main)
        for step in bar:
            hist["step"].append(step)
            hist["learning_rate"].append(self.sched.get_last_lr()[0])
            hist["loss"].append(self.step())
        self.model.eval()
        return hist


def train_sft(model, tokenizer, task: Task, config: SFTConfig | None = None, progress: bool = True) -> dict:
    """Fine-tune ``model`` in place (its trainable parameters); returns :meth:`SFTTrainer.train`'s history."""
    return SFTTrainer(model, tokenizer, task, config).train(progress)


@torch.no_grad()
def evaluate_task(model, tokenizer, task: Task, problems: list[Problem] | None = None, num_generations: int = 8,
                  temperature: float = 1.0, batch_prompts: int = 50, seed: int = 0, use_chat_template: bool = False,
                  system_prompt: str | None = None, bf16: bool = False) -> dict[str, float]:
    """Held-out metrics. ``pass@1``: share of sampled completions that are correct (an unbiased
    estimate of single-sample accuracy); ``pass@G``: share of problems with at least one correct
    completion among G; ``greedy``: accuracy of the most likely answer; ``format``: well-formed share.
    Samples on the model's device with a generator seeded there (the same ``seed``, the same draws)."""
    problems = problems if problems is not None else task.eval_set
    device = model_device(model)
    gen = torch.Generator(device=device).manual_seed(seed)
    fmt = dict(use_chat_template=use_chat_template, system_prompt=system_prompt)
    model.eval()
    correct, greedy, formatted, lengths = [], [], [], []
    for i in range(0, len(problems), batch_prompts):
        chunk = problems[i: i + batch_prompts]
        prompts = [p.prompt for p in chunk]
        with autocast_bf16(device, bf16):
            out = generate(model, tokenizer, prompts, num_generations, task.max_completion_length, temperature,
                           generator=gen, **fmt)
            g = generate(model, tokenizer, prompts, 1, task.max_completion_length, greedy=True, **fmt)
        texts = out.texts(tokenizer)
        fin = out.finished.tolist()
        for j, (text, f) in enumerate(zip(texts, fin)):
            p = chunk[j // num_generations]
            correct.append(task.correctness_reward(p, text, f))
            formatted.append(task.format_reward(p, text, f))
        lengths += out.completion_mask.sum(1).tolist()
        greedy += [task.correctness_reward(p, t, f) for p, t, f in zip(chunk, g.texts(tokenizer), g.finished.tolist())]
    c = np.array(correct).reshape(len(problems), num_generations)
    return {"pass@1": float(c.mean()), f"pass@{num_generations}": float((c.max(1) > 0).mean()),
            "greedy": float(np.mean(greedy)), "format": float(np.mean(formatted)),
            "completion_length": float(np.mean(lengths))}
