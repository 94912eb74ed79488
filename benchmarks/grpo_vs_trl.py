"""Seconds per GRPO step: our trainer vs TRL's GRPOTrainer, same model, task, group size and batch.

Both train the same freshly initialised 2-layer, width-128 GPT-2 (character tokenizer, built here)
on the addition task: 8 prompts x 8 generations = 64 completions of at most 4 tokens per step,
beta = 0 (no reference model), one optimizer step per batch (mu = 1), temperature 1. The first
`--warmup` steps of each are not timed. The ratio TRL/ours comes last.

    pip install -e ".[bench]"     # trl (optional)
    python benchmarks/grpo_vs_trl.py [--steps 20]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import tempfile
import time
import warnings

import torch

from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.tasks import AdditionTask
from minigrpo.llm.tokenizer import build_char_tokenizer

PROMPTS, G, MAX_LEN, LR = 8, 8, 4, 1e-4


def model_and_tokenizer():
    tok = build_char_tokenizer()
    model = make_tiny_model(tok, "gpt2", seed=0, hidden_size=128, num_layers=2, num_heads=4)
    return model, tok


def time_ours(steps: int, warmup: int) -> list[float]:
    model, tok = model_and_tokenizer()
    task = AdditionTask()
    cfg = GRPOConfig(max_steps=steps, prompts_per_step=PROMPTS, num_generations=G, max_completion_length=MAX_LEN,
                     learning_rate=LR, beta=0.0, num_iterations=1, eval_every=0, loss_type="grpo")
    trainer = GRPOTrainer(model, tok, task, cfg)
    times = []
    for i in range(steps):
        t = time.perf_counter()
        trainer.step()
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times


def time_trl(steps: int, warmup: int) -> list[float]:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    model, tok = model_and_tokenizer()
    task = AdditionTask()
    rng = random.Random(0)
    problems = [task.sample(rng) for _ in range(PROMPTS * (steps + 2))]
    data = Dataset.from_dict({"prompt": [tok.bos_token + p.prompt for p in problems],
                              "answer": [p.answer for p in problems]})

    def reward(completions, answer, **kwargs):
        return [float(c.strip() == a) + 0.1 * float(c.strip().isdigit()) for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        def __init__(self):
            self.marks = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter() - self.start)

    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        args = TRLConfig(output_dir=out, per_device_train_batch_size=PROMPTS * G, num_generations=G,
                         max_completion_length=MAX_LEN, learning_rate=LR, beta=0.0, num_iterations=1,
                         temperature=1.0, max_steps=steps, logging_steps=10_000, save_strategy="no",
                         report_to="none", use_cpu=True, bf16=False, loss_type="grpo",
                         disable_tqdm=True, seed=0)
        trainer = TRLTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                             processing_class=tok, callbacks=[clock])
        trainer.remove_callback(PrinterCallback)  # no end-of-training summary dict on stdout
        trainer.train()
    return clock.marks[warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both (1 is fastest for tiny models)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)

    print(f"GRPO step on CPU: tiny GPT-2 (2 layers, width 128), {PROMPTS} prompts x {G} generations, "
          f"<= {MAX_LEN} new tokens, {args.steps - args.warmup} timed steps, torch threads {torch.get_num_threads()}")
    ours = time_ours(args.steps, args.warmup)
    print(f"minigrpo  median {statistics.median(ours):.4f} s/step  (mean {statistics.mean(ours):.4f})")
    try:
        import trl
    except ImportError:
        print("trl not installed (pip install -e '.[bench]'): ours only")
        return
    theirs = time_trl(args.steps, args.warmup)
    print(f"trl {trl.__version__:<6} median {statistics.median(theirs):.4f} s/step  (mean {statistics.mean(theirs):.4f})")
    print(f"ratio trl/minigrpo (speed-up of ours): {statistics.median(theirs) / statistics.median(ours):.2f}x")


if __name__ == "__main__":
    main()
