"""The interview question sets the course prepares for ("seed" sets), with names a learner can read.

Each set is one real interview or interview guide (the text is in ``shared/seeds/``; only what they
ask was used, every answer in the bank is our own). Every question and follow-up of a set has a
reference ``"SSS.part"``, e.g. ``"004.A3"``; the bank, the tests and the progress file use these
codes, and everything a learner sees uses :func:`seed_label` instead ("Policy gradients + efficient
attention › part A3").
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class SeedSet:
    code: str  #: "001"
    slug: str  #: the name ``minigrpo interview --mock`` takes: "debugging"
    name: str  #: what a learner reads: "Debugging a GRPO loop"
    source: str  #: the file and what kind of interview it is


SEED_SETS: dict[str, SeedSet] = {s.code: s for s in (
    SeedSet("000", "diffusion", "Diffusion GRPO",
            "000_91d4d26d4a40d38a.txt: a technical-screen design question on GRPO-style fine-tuning of a "
            "text-to-image diffusion model"),
    SeedSet("001", "debugging", "Debugging a GRPO loop",
            "001_71ca7ed5b4de874a.txt: a technical screen on debugging a GRPO training step and why the ratio "
            "is not 1"),
    SeedSet("002", "ppo-vs-grpo", "PPO vs GRPO",
            "002_723c3314c0c50e02.txt: an interview guide on the core differences between PPO and GRPO"),
    SeedSet("003", "grpo-in-depth", "GRPO in depth",
            "003_4e41d8661624d54e.txt: a GRPO overview with sixteen common interview questions"),
    SeedSet("004", "pg-attention", "Policy gradients + efficient attention",
            "004_d65a0963c7a287a2.txt: a conceptual technical screen on policy-gradient methods and efficient "
            "attention"),
)}

#: kept for compatibility: "000" -> "file (what it is)"
SEED_FILES: dict[str, str] = {code: s.source.replace(": ", " (", 1) + ")" for code, s in SEED_SETS.items()}

# Every question and follow-up of the sets, paraphrased in one line, so the bank can be checked
# without the seed files.
SEED_QUESTIONS: dict[str, str] = {
    "000.main": "set up and implement GRPO fine-tuning of a text-to-image diffusion model; how it differs from "
                "REINFORCE",
    "000.a": "diffusion RL: what are the states, actions and rewards",
    "000.b": "diffusion RL: how to sample trajectories and compute the GRPO advantages",
    "000.c": "diffusion RL: which loss, and how it relates to the policy gradient",
    "000.d": "diffusion RL: pseudocode of one training iteration",
    "001.clarify": "GRPO debugging: which clarifying questions to ask about the stack first",
    "001.1": "walk through one end-to-end GRPO training step",
    "001.2": "three easy-to-miss bugs in a GRPO/PPO loop, each with detection and fix",
    "001.3": "why the importance ratio deviates from 1 in a strictly on-policy loop; what to check",
    "001.F1": "how the clipped surrogate keeps a non-trivial ratio from destabilising training",
    "001.F2": "a group whose completions all get the same reward: advantage, skip or not, divide-by-zero guard",
    "001.F3": "unavoidable engine-vs-trainer log-prob mismatch: the principled correction",
    "001.F4": "process supervision vs outcome supervision: what changes",
    "001.F5": "KL to the reference: in the reward or in the loss, and the trade-offs",
    "002.1": "describe PPO's actor-critic set-up and its reward-minus-value advantage",
    "002.2": "describe GRPO's group-relative advantage on a worked group of rewards",
    "002.3": "why many large-model recipes prefer GRPO to PPO",
    "002.4": "the main risk of GRPO",
    "002.5": "choosing the group size k in practice",
    "003.Q1": "what GRPO is and how it differs from PPO",
    "003.Q2": "why GRPO normalises advantages within groups",
    "003.Q3": "what happens when every output of a group gets the same reward",
    "003.Q4": "walk through the GRPO update equation step by step",
    "003.Q5": "how to choose the group size G and its trade-offs",
    "003.Q6": "the role of the reference policy",
    "003.Q7": "exploration vs exploitation in GRPO",
    "003.Q8": "debugging a GRPO run that is not improving",
    "003.Q9": "memory requirements of GRPO training",
    "003.Q10": "implementing GRPO from scratch: the key components",
    "003.Q11": "using preference data instead of absolute rewards with GRPO",
    "003.Q12": "GRPO compared with DPO",
    "003.Q13": "adapting GRPO to multi-turn dialogue",
    "003.Q14": "adapting GRPO to continual / lifelong learning",
    "003.Q15": "failure modes of GRPO and how to detect them",
    "003.Q16": "when to choose GRPO over REINFORCE",
    "004.A1": "on-policy vs off-policy: definition and two examples of each",
    "004.A2": "TRPO: the problem it solves, the KL trust region, the constrained objective",
    "004.A3": "PPO: the clipped surrogate and what the clipping prevents",
    "004.A4": "GAE: the advantage, the estimator, and λ's bias-variance trade-off",
    "004.B1": "linear attention: linear in what, what changes vs softmax, what is lost",
    "004.B2": "grouped-query attention: what is shared, why it helps inference, trade-offs, relation to MHA/MQA",
    "004.F1": "reusing a large replay buffer with PPO/TRPO: what breaks, and how ε interacts with staleness",
    "004.F2": "γ and λ both down-weight the future: how their roles differ",
    "004.F3": "why exact softmax attention (FlashAttention) still wins over linear attention",
    "004.F4": "cut KV-cache memory 4x with 32 query heads: GQA-8 vs MQA vs linear attention, what to measure",
}


def _part_name(part: str) -> str:
    if part == "main":
        return "main question"
    if part == "clarify":
        return "clarifying questions"
    if re.fullmatch(r"[a-z]", part):
        return f"part ({part})"
    if re.fullmatch(r"\d+", part):
        return f"part {part}"
    if re.fullmatch(r"F\d+", part):
        return f"follow-up {part[1:]}"
    return part  # Q7, A3, B1: the set's own numbering


def seed_label(ref: str) -> str:
    """``"004.A3"`` -> ``"Policy gradients + efficient attention › A3"``; ``"001.F2"`` ->
    ``"Debugging a GRPO loop › follow-up 2"``."""
    if ref not in SEED_QUESTIONS:
        raise ValueError(f"unknown seed question {ref!r}")
    code, part = ref.split(".", 1)
    return f"{SEED_SETS[code].name} › {_part_name(part)}"


def seed_set(name: str) -> SeedSet:
    """A set by slug ("debugging"), code ("001") or name ("Debugging a GRPO loop")."""
    for s in SEED_SETS.values():
        if name in (s.slug, s.code) or name.lower() == s.name.lower():
            return s
    raise ValueError(f"no interview question set {name!r}; sets: "
                     + ", ".join(f"{s.slug} ({s.name})" for s in SEED_SETS.values()))
