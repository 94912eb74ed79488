"""Seconds per GRPO step, completion tokens per second and peak memory: our trainer vs TRL's GRPOTrainer.

Both load the same saved checkpoint (fresh weights, a byte-level BPE tokenizer with no BOS, as
Qwen's), sample ``G`` completions for each of ``P`` prompts, score them with the same reward function
(a TRL-style function, the same object in both), and take one optimizer step per batch (μ = 1,
β = 0: no reference model, loss_type "grpo", temperature 1). The first ``--warmup`` steps are not timed.

Presets (``--preset``):
- ``tiny``: a 2-layer Qwen2-shaped model (hidden 128, 512-token vocabulary), 8 prompts × 8, 4 tokens (CPU).
- ``cpu``:  a mid-size Qwen2-shaped model (hidden 384, 6 layers, 8k BPE vocabulary, ≈ 14M parameters),
            G = 8 × 2 prompts, 64-token completions (CPU, float32).
- ``gpu``:  Qwen2.5-0.5B's configuration (494M parameters, random weights, vocabulary 151,936), bf16
            autocast, 16 prompts × G = 8, 256-token completions (CUDA; no vLLM on either side).

Random weights almost never sample an end-of-turn token, so completions run to the length limit in
both trainers and the tokens per step are equal (the line "completion tokens/s" assumes it).

    pip install -e ".[course]"    # trl comes with the course extra
    python benchmarks/grpo_vs_trl.py --preset cpu [--steps 6]
    python benchmarks/grpo_vs_trl.py --preset gpu [--steps 6]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass

import torch

PRESETS = {
    #        prompts, G, tokens, hidden, layers, heads, kv heads, vocab, device, bf16, micro-batches
    "tiny": (8, 8, 4, 128, 2, 4, 4, 512, "cpu", False, 1),
    "cpu": (2, 8, 64, 384, 6, 6, 2, 8192, "cpu", False, 1),
    # 128 sequences x 256 tokens x 151,936 logits is ~10 GB per bf16 forward: one optimizer step over 4
    # micro-batches of 32 (an H100 runs out of memory in one pass of 128, ours measured so; TRL the same way)
    "gpu": (16, 8, 256, None, None, None, None, None, "cuda", True, 4),
}
LR = 1e-6


@dataclass
class Setup:
    prompts: int
    G: int
    tokens: int
    device: str
    bf16: bool
    accum: int
    folder: str


def build(preset: str, folder: str) -> Setup:
    from minigrpo.llm.models import build_qwen_like, qwen2_5_0_5b_config
    from minigrpo.llm.tokenizer import sample_corpus

    P, G, L, hidden, layers, heads, kv, vocab, device, bf16, accum = PRESETS[preset]
    corpus = sample_corpus(seed=0)
    if preset == "gpu":
        build_qwen_like(folder, corpus, vocab_size=8192, config=qwen2_5_0_5b_config())
    else:
        build_qwen_like(folder, corpus, vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
                        num_kv_heads=kv, max_positions=512)
    return Setup(P, G, L, device, bf16, accum, folder)


def prompts(n: int) -> list[str]:
    words = "count the apples pears and coins that sam and lee share between them each day".split()
    return [" ".join(words[(i + j) % len(words)] for j in range(12)) for i in range(n)]


def length_reward(completions, **kwargs) -> list[float]:
    """Any reward with spread across a group works for timing; this one reads the text."""
    return [float(sum(map(ord, c)) % 97) / 97 for c in completions]


def load(setup: Setup):
    from minigrpo.llm.models import load_causal_lm

    return load_causal_lm(setup.folder, device=setup.device)  # (model, tokenizer), float32 weights


def _sync(setup: Setup) -> None:
    if setup.device == "cuda":
        torch.cuda.synchronize()


def time_ours(setup: Setup, steps: int, warmup: int) -> list[float]:
    from minigrpo.llm.data import DatasetTask
    from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer

    model, tok = load(setup)
    task = DatasetTask([{"prompt": p} for p in prompts(64)], [length_reward], max_completion_length=setup.tokens)
    cfg = GRPOConfig(max_steps=steps, prompts_per_step=setup.prompts, num_generations=setup.G,
                     max_completion_length=setup.tokens, learning_rate=LR, beta=0.0, num_iterations=1,
                     eval_every=0, loss_type="grpo", bf16=setup.bf16, gradient_accumulation_steps=setup.accum)
    trainer = GRPOTrainer(model, tok, task, cfg)
    times = []
    for i in range(steps):
        _sync(setup)
        t = time.perf_counter()
        trainer.step()
        _sync(setup)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return times


def time_trl(setup: Setup, steps: int, warmup: int) -> list[float]:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    model, tok = load(setup)
    data = Dataset.from_dict({"prompt": prompts(setup.prompts * (steps + 2))})

    class Clock(TrainerCallback):
        def __init__(self):
            self.marks = []

        def on_step_begin(self, args, state, control, **kwargs):
            _sync(setup)
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _sync(setup)
            self.marks.append(time.perf_counter() - self.start)

    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        # one generation of P x G completions per optimizer step, over `accum` micro-batches (as ours)
        args = TRLConfig(output_dir=out, per_device_train_batch_size=setup.prompts * setup.G // setup.accum,
                         gradient_accumulation_steps=setup.accum,
                         num_generations=setup.G, max_completion_length=setup.tokens, learning_rate=LR, beta=0.0,
                         num_iterations=1, temperature=1.0, max_steps=steps, logging_steps=10_000,
                         save_strategy="no", report_to="none", use_cpu=setup.device == "cpu", bf16=setup.bf16,
                         loss_type="grpo", disable_tqdm=True, seed=0)
        trainer = TRLTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=data,
                             processing_class=tok, callbacks=[clock])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return clock.marks[warmup:]


def measure(name: str, fn, setup: Setup, steps: int, warmup: int) -> float:
    if setup.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times = fn(setup, steps, warmup)
    med = statistics.median(times)
    tokens = setup.prompts * setup.G * setup.tokens
    peak = f"  peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if setup.device == "cuda" else ""
    print(f"{name:<14} median {med:.3f} s/step  ({tokens / med:,.0f} completion tokens/s){peak}  "
          f"steps: {', '.join(f'{t:.3f}' for t in times)}", flush=True)
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads on the CPU (default: torch's)")
    parser.add_argument("--only", choices=["ours", "trl"], default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if PRESETS[args.preset][8] == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: the gpu preset needs one (nothing measured)")
        return
    with tempfile.TemporaryDirectory() as folder:
        setup = build(args.preset, folder)
        n = sum(p.numel() for p in load(setup)[0].parameters())
        where = torch.cuda.get_device_name() if setup.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
        print(f"GRPO step, preset {args.preset!r}: {n / 1e6:.1f}M parameters on {where}, {setup.prompts} prompts x "
              f"G = {setup.G}, {setup.tokens}-token completions, bf16 {setup.bf16}, "
              f"{args.steps - args.warmup} timed steps after {args.warmup}; torch {torch.__version__}", flush=True)
        ours = measure("minigrpo", time_ours, setup, args.steps, args.warmup) if args.only != "trl" else None
        try:
            import trl
        except ImportError:
            print("trl not installed (pip install -e '.[course]'): ours only")
            return
        theirs = measure(f"trl {trl.__version__}", time_trl, setup, args.steps, args.warmup) \
            if args.only != "ours" else None
        if ours and theirs:
            print(f"speed-up of minigrpo over TRL (TRL s/step ÷ ours): {theirs / ours:.2f}x")


if __name__ == "__main__":
    main()
