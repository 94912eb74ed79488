"""Seconds per GRPO step, completion tokens per second and peak memory: our trainer vs TRL's GRPOTrainer,
in paired rounds.

Both load the same saved checkpoint, sample ``G`` completions for each of ``P`` prompts, score them with
the same reward function (a TRL-style function, the same object in both), and take one optimizer step per
batch (μ = 1, β = 0: no reference model, loss_type "grpo", temperature 1). Both trainers are built once,
then alternate in paired rounds (``benchmarks/_paired.py``): round k times one step of ours and one of
TRL's, the first alternating; TRL's loop drives the rounds from a callback, so both run in this thread.
The first ``--warmup`` rounds are not timed. The ratio reported is the median of the per-round ratios
(TRL's s/step ÷ ours) with its IQR and min–max, and the 1-minute load average of each round is printed.
``--compete N`` starts N competing processes beside the run (``--compete-kind torch``: matmul loops on all
cores; ``python``: busy loops).

Presets (``--preset``):
- ``tiny``:    a 2-layer Qwen2-shaped model (hidden 128, 512-token vocabulary), 8 prompts × 8, 4 tokens (CPU).
- ``cpu``:     a mid-size Qwen2-shaped model (hidden 384, 6 layers, 8k BPE vocabulary, ≈ 13M parameters),
               G = 8 × 2 prompts, 64-token completions (CPU, float32).
- ``gpu``:     Qwen2.5-0.5B's configuration (494M parameters, random weights, vocabulary 151,936), bf16
               autocast, 16 prompts × G = 8, 256-token completions, 4 micro-batches (CUDA; no vLLM on either side).
- ``smollm2``: the real SmolLM2-135M-Instruct (``--model-dir``: a hub-format folder), float32 weights, full
               fine-tuning, lr 1e-6, 2 arithmetic prompts × G = 8 in the chat template, up to 48 tokens, a reward
               that reads the answer in the text (``--device``: cpu by default, cuda on a GPU).

The random-weight presets almost never sample an end-of-turn token, so completions run to the length limit in
both trainers and the tokens per step are equal. The real model stops when it has answered: its completion
lengths vary from step to step and between the trainers, so compare its completion tokens/s as well as s/step.

    pip install -e ".[course]"    # trl comes with the course extra
    python benchmarks/grpo_vs_trl.py --preset cpu [--rounds 8 --warmup 1] [--compete 2]
    python benchmarks/grpo_vs_trl.py --preset gpu
    python benchmarks/grpo_vs_trl.py --preset smollm2 --model-dir ~/models/smollm2-hf [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _paired  # noqa: E402

PRESETS = {
    #        prompts, G, tokens, hidden, layers, heads, kv heads, vocab, device, bf16, micro-batches
    "tiny": (8, 8, 4, 128, 2, 4, 4, 512, "cpu", False, 1),
    "cpu": (2, 8, 64, 384, 6, 6, 2, 8192, "cpu", False, 1),
    # 128 sequences x 256 tokens x 151,936 logits is ~10 GB per bf16 forward: one optimizer step over 4
    # micro-batches of 32 (an H100 runs out of memory in one pass of 128, ours measured so; TRL the same way)
    "gpu": (16, 8, 256, None, None, None, None, None, "cuda", True, 4),
    "smollm2": (2, 8, 48, None, None, None, None, None, "cpu", False, 1),
}
LR = 1e-6


@dataclass
class Setup:
    preset: str
    prompts: int
    G: int
    tokens: int
    device: str
    bf16: bool
    accum: int
    folder: str


def build(preset: str, folder: str, model_dir: str | None, device: str | None, tokens: int | None) -> Setup:
    P, G, L, hidden, layers, heads, kv, vocab, dev, bf16, accum = PRESETS[preset]
    if preset == "smollm2":
        folder = model_dir
    else:
        from minigrpo.llm.models import build_qwen_like, qwen2_5_0_5b_config
        from minigrpo.llm.tokenizer import sample_corpus

        corpus = sample_corpus(seed=0)
        if preset == "gpu":
            build_qwen_like(folder, corpus, vocab_size=8192, config=qwen2_5_0_5b_config())
        else:
            build_qwen_like(folder, corpus, vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
                            num_kv_heads=kv, max_positions=512)
    return Setup(preset, P, G, tokens or L, device or dev, bf16, accum, folder)


# ------------------------------------------------------------------------------------------- data, reward

def rows(setup: Setup, n: int) -> list[dict]:
    """``n`` dataset rows: word prompts for the random-weight models; arithmetic questions, as conversations with
    an ``answer`` column, for the real model."""
    if setup.preset == "smollm2":
        out = []
        for i in range(n):
            a, b = 11 + (7 * i) % 40, 5 + (13 * i) % 37
            out.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with a number."}],
                        "answer": str(a + b)})
        return out
    words = "count the apples pears and coins that sam and lee share between them each day".split()
    return [{"prompt": " ".join(words[(i + j) % len(words)] for j in range(12))} for i in range(n)]


def text_reward(completions, **kwargs) -> list[float]:
    """Any reward with spread across a group works for timing; this one reads the text."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    if "answer" in kwargs:  # the arithmetic prompts: 1 when the last number is the sum, plus a little for brevity
        last = [re.findall(r"-?\d+", t) for t in texts]
        return [float(bool(n) and n[-1] == a) + 0.1 / (1 + len(t)) for n, a, t in zip(last, kwargs["answer"], texts)]
    return [float(sum(map(ord, t)) % 97) / 97 for t in texts]


def load(setup: Setup):
    from minigrpo.llm.models import load_causal_lm

    # float32 weights whatever the folder stores (TRL's default too); bf16 presets autocast
    return load_causal_lm(setup.folder, device=setup.device, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------- trainers

def ours(setup: Setup, steps: int):
    """Our trainer; returns ``(step function, tokens)``, where ``tokens`` lists each step's completion tokens."""
    from minigrpo.llm.data import DatasetTask
    from minigrpo.llm.grpo import GRPOConfig, GRPOTrainer

    model, tok = load(setup)
    task = DatasetTask(rows(setup, 64), [text_reward], max_completion_length=setup.tokens)
    cfg = GRPOConfig(max_steps=steps, prompts_per_step=setup.prompts, num_generations=setup.G,
                     max_completion_length=setup.tokens, learning_rate=LR, beta=0.0, num_iterations=1,
                     eval_every=0, loss_type="grpo", bf16=setup.bf16, gradient_accumulation_steps=setup.accum)
    trainer = GRPOTrainer(model, tok, task, cfg)
    tokens: list[float] = []

    def step() -> None:
        m = trainer.step()
        tokens.append(m["completions/mean_length"] * setup.prompts * setup.G)

    return step, tokens


def trl_trainer(setup: Setup, steps: int, callback):
    """TRL's trainer on the same checkpoint, data and reward, with ``callback`` (the output folder is temporary)."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    model, tok = load(setup)
    data = Dataset.from_list(rows(setup, setup.prompts * (steps + 2)))
    out = tempfile.mkdtemp(prefix="grpo_vs_trl_")
    # one generation of P x G completions per optimizer step, over `accum` micro-batches (as ours)
    args = TRLConfig(output_dir=out, per_device_train_batch_size=setup.prompts * setup.G // setup.accum,
                     gradient_accumulation_steps=setup.accum,
                     num_generations=setup.G, max_completion_length=setup.tokens, learning_rate=LR, beta=0.0,
                     num_iterations=1, temperature=1.0, max_steps=steps, logging_steps=10_000,
                     save_strategy="no", report_to="none", use_cpu=setup.device == "cpu", bf16=setup.bf16,
                     loss_type="grpo", disable_tqdm=True, seed=0)
    trainer = TRLTrainer(model=model, reward_funcs=text_reward, args=args, train_dataset=data,
                         processing_class=tok, callbacks=[callback])
    trainer.remove_callback(PrinterCallback)
    return trainer, out


def paired(setup: Setup, rounds: int, warmup: int, trl_name: str) -> tuple[_paired.Rounds, dict[str, list[float]]]:
    """Both trainers built once, then alternating (TRL's loop drives; ours runs from its callback)."""
    from transformers import TrainerCallback

    our_step, our_tokens = ours(setup, 10**6)
    pairing = _paired.Pairing(["minigrpo", trl_name], rounds, warmup, device=setup.device)
    trl_tokens: list[float] = []
    holder = {}

    class Driver(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            pairing.run_ours_while_planned(our_step)
            self.seen = len(holder["trainer"]._metrics["train"]["completions/mean_length"])
            pairing.start()

        def on_step_end(self, args, state, control, **kwargs):
            pairing.stop()
            lengths = holder["trainer"]._metrics["train"]["completions/mean_length"][self.seen:]
            trl_tokens.append(sum(lengths) / max(len(lengths), 1) * setup.prompts * setup.G)
            pairing.run_ours_while_planned(our_step)
            if pairing.done:
                control.should_training_stop = True

    trl_steps = sum(1 for _, side in pairing.plan if side == trl_name)
    trainer, out = trl_trainer(setup, trl_steps + 1, Driver())
    holder["trainer"] = trainer
    try:
        trainer.train()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if not pairing.done:
        raise RuntimeError(f"TRL's loop ended after {pairing.pos} of {len(pairing.plan)} planned steps")
    timed = lambda xs: xs[warmup:]  # both sides took exactly `warmup` untimed steps first
    return pairing.out, {"minigrpo": timed(our_tokens), trl_name: timed(trl_tokens)}


def only_ours(setup: Setup, rounds: int, warmup: int) -> tuple[_paired.Rounds, dict[str, list[float]]]:
    step, tokens = ours(setup, 10**6)
    pairing = _paired.Pairing(["minigrpo", "-"], rounds, warmup, device=setup.device)
    pairing.plan = [(k, "minigrpo") for k, side in pairing.plan if side == "minigrpo"]
    while not pairing.done:
        pairing.timed(step)
    return pairing.out, {"minigrpo": tokens[warmup:]}


# -------------------------------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--rounds", type=int, default=8, help="timed paired rounds (one step of each per round)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on the CPU (default: torch's)")
    parser.add_argument("--only", choices=["ours"], default=None, help="time our trainer alone (for profiling)")
    parser.add_argument("--model-dir", default=None, help="smollm2: a hub-format folder of SmolLM2-135M-Instruct")
    parser.add_argument("--device", default=None, help="override the preset's device (cpu, cuda)")
    parser.add_argument("--tokens", type=int, default=None, help="override the preset's completion length")
    _paired.add_arguments(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    device = args.device or PRESETS[args.preset][8]
    if device == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device: the {args.preset} preset on cuda needs one (nothing measured)")
        return
    if args.preset == "smollm2" and not (args.model_dir and (Path(args.model_dir) / "config.json").exists()):
        print("the smollm2 preset needs --model-dir: a hub-format folder of SmolLM2-135M-Instruct (nothing measured)")
        return
    with tempfile.TemporaryDirectory() as folder:
        setup = build(args.preset, folder, args.model_dir, args.device, args.tokens)
        n = sum(p.numel() for p in load(setup)[0].parameters())
        where = (torch.cuda.get_device_name() if setup.device == "cuda"
                 else f"CPU ({os.cpu_count()} cores), {torch.get_num_threads()} torch threads")
        print(f"GRPO step, preset {args.preset!r}: {n / 1e6:.1f}M parameters on {where}, {setup.prompts} prompts x "
              f"G = {setup.G}, up to {setup.tokens} completion tokens, bf16 {setup.bf16}; {args.rounds} paired "
              f"rounds after {args.warmup}; torch {torch.__version__}; load before {os.getloadavg()[0]:.2f}", flush=True)
        try:
            import trl

            trl_name = f"trl {trl.__version__}"
        except ImportError:
            trl_name = None
            print("trl not installed (pip install -e '.[course]'): ours only")
        with _paired.Competitors(args.compete, args.compete_kind) as comp:
            print(f"beside: {comp}", flush=True)
            if args.only == "ours" or trl_name is None:
                result, tokens = only_ours(setup, args.rounds, args.warmup)
            else:
                result, tokens = paired(setup, args.rounds, args.warmup, trl_name)
        print(f"load after {os.getloadavg()[0]:.2f}")
        for name in result.names:
            if name in tokens and result.times[name]:
                s = _paired.spread(result.times[name])
                tps = sum(tokens[name]) / sum(result.times[name])
                print(f"{name:<14} median {s['median']:.3f} s/step [IQR {s['q1']:.3f}–{s['q3']:.3f}]  "
                      f"{tps:,.0f} completion tokens/s  {result.peaks[name]:.2f} GiB ({result.memory_label})",
                      flush=True)
        summary = result.summary() if trl_name and args.only is None else {"seconds": {}}
        if trl_name and args.only is None:
            print(f"speed-up of minigrpo over TRL (TRL s/step ÷ ours), median of per-round ratios: "
                  f"{_paired.fmt_ratio(summary['ratio'])}")
        ld = _paired.spread(result.loads)
        print(f"1-min load average at the rounds' starts: median {ld['median']:.2f}, min–max "
              f"{ld['min']:.2f}–{ld['max']:.2f} ({comp})")
        if args.json:
            summary.update(preset=args.preset, device=setup.device, compete=args.compete, compete_kind=args.compete_kind,
                           tokens_per_s={k: sum(v) / sum(result.times[k]) for k, v in tokens.items()},
                           params_m=n / 1e6, torch=torch.__version__, where=where)
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
