"""Exercise 11 — interview quiz: numbers an interviewer expects you to compute on the spot.

Group advantages, the clipped objective and its slope, a GAE value, KV-cache bytes, and which ratio
deviations are expected by design. Expected values come from the package (group_advantages,
clipped_surrogate_loss, gae, kv_cache_bytes); each typical mistake is written as code with its hint.
"""

from __future__ import annotations

from functools import partial

import torch

from minigrpo.advantages import gae as package_gae
from minigrpo.advantages import group_advantages as package_group_advantages
from minigrpo.attention import kv_cache_bytes as package_kv_cache_bytes
from minigrpo_course.grading import ex05
from minigrpo_course.grading.core import Case, Item, Spread, WrongAnswer, checked_by
from minigrpo.losses import clipped_surrogate_loss

TITLE = "interview quiz"

EPS = 1e-4  # added to the group's std, as in the package

# --------------------------------------------------------------------------- 11.1 group advantages


def group_advantages_of(rewards):
    """Reference: one group's (r − mean) / (sample std + 1e-4), as a float64 tensor."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    return package_group_advantages(r, r.numel(), eps=EPS)


def _one_group(mistake):
    """A multi-group mistake of exercise 05, applied to one group."""
    return lambda rewards: mistake(torch.as_tensor(rewards, dtype=torch.float64), len(rewards))


GA_CASES = [
    Case("rewards 85, 92, 70", ([85.0, 92.0, 70.0],)),
    Case("pass/fail rewards, one success in four", ([1.0, 0.0, 0.0, 0.0],)),
    Case("an all-equal group gets exactly 0 (no NaN)", ([1.0, 1.0, 1.0, 1.0],)),
    Case("one reward is not a group: a ValueError", ([0.5],),
         hint="raise ValueError for fewer than 2 rewards: a group needs a mean of the others to compare with."),
    # The spec asks for "a float tensor (or a list)": float32 is allowed, so no case asks for more than float32 gives.
    Case("six scores", ([0.2, 0.9, 0.4, 0.4, 0.1, 0.7],), quick=False),
]

GROUP_ADVANTAGES = Item(
    exercise="11", number=1, function="group_advantages_of", title="GRPO advantages of one group",
    reference=group_advantages_of, cases=GA_CASES,
    wrong_answers=[
        WrongAnswer("population std", checked_by(group_advantages_of, _one_group(ex05._ga_population_std)),
                    "you divided by the population std (÷ G, numpy's default); the convention here is the sample "
                    "std (÷ (G − 1)), torch.std's default. Say which one you use in an interview: only the scale changes."),
        WrongAnswer("no std", checked_by(group_advantages_of, _one_group(ex05._rloo_leave_in)),
                    "after subtracting the mean, divide by the group's sample std plus 1e-4 (Dr. GRPO drops it, but "
                    "the quiz asks for GRPO's original advantage)."),
        WrongAnswer("no centring", checked_by(group_advantages_of, _one_group(ex05._ga_no_centring)),
                    "subtract the group mean first: the advantage is how much better an answer is than its siblings, "
                    "so the group's advantages must average to 0."),
        WrongAnswer("no eps", checked_by(group_advantages_of, _one_group(ex05._ga_no_eps)),
                    "add 1e-4 to the std: an all-equal group has std 0, and 0/0 is NaN; with the eps it is exactly 0."),
        WrongAnswer("leave-one-out baseline", checked_by(group_advantages_of, _one_group(ex05._rloo_with_std)),
                    "GRPO's baseline is the mean of the whole group, the answer itself included; the mean of the "
                    "*other* answers is RLOO's."),
    ],
)

# --------------------------------------------------------------------------- 11.2 clipped objective


def clipped_objective(ratio, advantage, epsilon=0.2):
    """Reference: PPO's per-sample objective min(ρA, clip(ρ, 1 ± ε)A) and its slope d/dρ, from the package's loss."""
    if not ratio > 0:
        raise ValueError(f"the ratio π_θ/π_old must be positive, got {ratio}")
    rho = torch.tensor(float(ratio), dtype=torch.float64, requires_grad=True)
    loss, _ = clipped_surrogate_loss(torch.log(rho).reshape(1), torch.zeros(1, dtype=torch.float64),
                                     torch.tensor([float(advantage)], dtype=torch.float64), clip_eps=epsilon)
    objective = -loss
    objective.backward()
    return {"objective": objective.item(), "slope": rho.grad.item()}


def _clip(ratio, epsilon):
    return min(max(ratio, 1 - epsilon), 1 + epsilon)


def _co_no_min(ratio, advantage, epsilon=0.2):
    inside = 1 - epsilon < ratio < 1 + epsilon
    return {"objective": _clip(ratio, epsilon) * advantage, "slope": advantage if inside else 0.0}


def _co_max(ratio, advantage, epsilon=0.2):
    unclipped, clipped = ratio * advantage, _clip(ratio, epsilon) * advantage
    return {"objective": max(unclipped, clipped), "slope": advantage if unclipped >= clipped else 0.0}


def _co_changed(change):
    """A mistake: the reference's objective and slope, changed by ``change(reference result, ratio, advantage)``."""
    return lambda ratio, advantage, epsilon=0.2: change(clipped_objective(ratio, advantage, epsilon), ratio, advantage)


CO_CASES = [
    Case("ρ = 1.5, A = +2: a good action already pushed past 1 + ε", (1.5, 2.0)),
    Case("ρ = 0.5, A = +2: a good action made less likely", (0.5, 2.0)),
    Case("ρ = 1.5, A = −1: a bad action made more likely", (1.5, -1.0)),
    Case("ρ = 0.5, A = −1: a bad action already pushed below 1 − ε", (0.5, -1.0)),
    Case("ρ = 1.1, A = +3: inside the clip range", (1.1, 3.0)),
    Case("a non-positive ratio is refused with a ValueError", (-0.5, 1.0),
         hint="raise ValueError when ratio <= 0: a ratio of two probabilities is positive."),
    Case("ε = 0.1: ρ = 0.7, A = −2", (0.7, -2.0), {"epsilon": 0.1}, quick=False),
    Case("ε = 0.3: ρ = 1.25, A = +0.5 (inside)", (1.25, 0.5), {"epsilon": 0.3}, quick=False),
]

CLIPPED_OBJECTIVE = Item(
    exercise="11", number=2, function="clipped_objective", title="the clipped objective and its slope",
    reference=clipped_objective, cases=CO_CASES,
    wrong_answers=[
        WrongAnswer("clip without the min", checked_by(clipped_objective, _co_no_min),
                    "clipping the ratio alone is not PPO: take min(ρA, clip(ρ, 1 − ε, 1 + ε)A), so a move in the harmful "
                    "direction keeps its full (unclipped) value and slope A."),
        WrongAnswer("max instead of min", checked_by(clipped_objective, _co_max),
                    "use the min: the clipped objective is pessimistic. With max you clip the wrong side: the harmful "
                    "moves (A > 0 with ρ < 1 − ε, A < 0 with ρ > 1 + ε) lose their gradient and the helpful ones keep it."),
        WrongAnswer("loss instead of objective", _co_changed(lambda ref, ratio, adv: {k: -v for k, v in ref.items()}),
                    "return the objective to maximise, min(ρA, clip(ρ)A), not the loss (its negative), and the "
                    "objective's slope."),
        WrongAnswer("slope ignores the clip", _co_changed(lambda ref, ratio, adv: {**ref, "slope": float(adv)}),
                    "where the clipped term is the smaller one the objective is flat in ρ: the slope is 0 there, not A."),
        WrongAnswer("slope with respect to log π",
                    _co_changed(lambda ref, ratio, adv: {**ref, "slope": ratio * ref["slope"]}),
                    "the slope asked for is d objective / d ρ (A or 0); ρ·A is the derivative with respect to log π_θ."),
    ],
)

# --------------------------------------------------------------------------- 11.3 GAE of one rollout segment


def gae_segment(rewards, values, last_value, gamma, lam, terminated):
    """Reference: the package's gae on one segment; ``terminated`` says whether its last step ended the
    episode (bootstrap nothing) or the rollout was simply cut (bootstrap from ``last_value``)."""
    r, v = torch.as_tensor(rewards, dtype=torch.float64), torch.as_tensor(values, dtype=torch.float64)
    if r.ndim != 1 or r.shape != v.shape or r.numel() == 0:
        raise ValueError(f"rewards and values must be non-empty lists of the same length, got {r.numel()} and "
                         f"{v.numel()}")
    next_values = torch.cat([v[1:], torch.tensor([float(last_value)], dtype=torch.float64)])
    done = torch.zeros_like(r)
    done[-1] = float(bool(terminated))
    return package_gae(r, v, next_values, done, torch.zeros_like(r), gamma, lam)


_seg = partial(checked_by, gae_segment)  # a typical mistake: refuses what the reference refuses, then errs


def random_segment(seed: int, T: int = 12):
    """(rewards, values): two lists of T standard-normal floats."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(T, generator=g, dtype=torch.float64).tolist() for _ in range(2)]


GAE_CASES = [
    Case("the rollout was cut after step 3 (bootstrap from V = 2)",
         ([1.0, 0.0, 2.0], [0.5, 1.0, 1.5], 2.0, 0.9, 0.8, False)),
    Case("the episode ended at step 3 (nothing to bootstrap)", ([1.0, 0.0, 2.0], [0.5, 1.0, 1.5], 2.0, 0.9, 0.8, True)),
    Case("λ = 1: discounted return minus V", ([0.0, 0.0, 1.0, 0.0], [0.2, 0.4, 0.6, 0.3], 0.5, 0.95, 1.0, False)),
    Case("rewards and values of different lengths are refused with a ValueError",
         ([1.0, 0.0], [0.5], 0.0, 0.9, 0.9, False),
         hint="raise ValueError when rewards and values differ in length: each step needs its own V(s_t)."),
    Case("a 12-step random segment, cut", (Spread(random_segment, 3), 0.7, 0.97, 0.9, False), quick=False,
         rtol=1e-9, atol=1e-12),
    Case("a 12-step random segment, terminated", (Spread(random_segment, 4), 0.7, 0.97, 0.9, True), quick=False,
         rtol=1e-9, atol=1e-12),
]

GAE_SEGMENT = Item(
    exercise="11", number=3, function="gae_segment", title="GAE of one rollout segment",
    reference=gae_segment, cases=GAE_CASES,
    wrong_answers=[
        WrongAnswer("forgot the bootstrap",
                    _seg(lambda r, v, last, gamma, lam, term: gae_segment(r, v, last, gamma, lam, True)),
                    "when the rollout was only cut (terminated=False) the last step must bootstrap: "
                    "δ = r + γ·last_value − V. Treating the cut as the end of the episode biases the last advantages down."),
        WrongAnswer("bootstrapped a terminal state",
                    _seg(lambda r, v, last, gamma, lam, term: gae_segment(r, v, last, gamma, lam, False)),
                    "after a real termination there is no future: the last δ is r − V, with no γ·last_value term."),
        WrongAnswer("γ instead of γλ",
                    _seg(lambda r, v, last, gamma, lam, term: gae_segment(r, v, last, gamma, 1.0, term)),
                    "the recursion decays by γλ: A_t = δ_t + γλ·A_{t+1}. With γ alone you computed the λ = 1 estimate."),
        WrongAnswer("λ instead of γλ",
                    _seg(lambda r, v, last, gamma, lam, term: gae_segment(r, v, last, gamma, lam / gamma, term)),
                    "the recursion decays by γλ, not λ: A_t = δ_t + γλ·A_{t+1}."),
        WrongAnswer("returns instead of advantages",
                    _seg(lambda r, v, *rest: gae_segment(r, v, *rest) + torch.tensor(v, dtype=torch.float64)),
                    "you returned A + V (the critic's regression target); the question asks for the advantages."),
    ],
)

# --------------------------------------------------------------------------- 11.4 KV-cache bytes

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


def kv_cache_size(n_layers, n_heads, n_kv_heads, head_dim, seq_len, batch_size, dtype="bf16"):
    """Reference: bytes of a decoder's KV cache, from the package's kv_cache_bytes."""
    if dtype not in BYTES_PER_ELEMENT:
        raise ValueError(f"dtype must be one of {sorted(BYTES_PER_ELEMENT)}, got {dtype!r}")
    if not 1 <= n_kv_heads <= n_heads or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads must divide n_heads, got {n_kv_heads} and {n_heads}")
    return package_kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size, BYTES_PER_ELEMENT[dtype])


def _kv_times(factor):
    """A mistake that gets the KV-cache bytes wrong by ``factor(*args)`` (after the reference's refusals)."""
    return lambda *args: kv_cache_size(*args) * factor(*args)


def _kv_without_fp8(*args):
    """A bytes table without fp8: a KeyError for it, the right answer otherwise."""
    if args[6] == "fp8":
        raise KeyError("fp8")
    return kv_cache_size(*args)


KV_CASES = [
    # fp32 first: there "forgot K and V" (÷2) and "counted elements" (÷4) give different numbers.
    Case("multi-query attention, fp32", (32, 32, 1, 128, 4096, 8, "fp32")),
    Case("a 7B-sized model with full multi-head attention, fp16 (2 GiB)", (32, 32, 32, 128, 4096, 1, "fp16")),
    Case("a 70B-sized model with GQA (8 KV heads), bf16", (80, 64, 8, 128, 4096, 1, "bf16")),
    Case("n_kv_heads must divide n_heads: a ValueError", (2, 6, 4, 8, 16, 1, "bf16"),
         hint="raise ValueError unless n_kv_heads divides n_heads: each KV head serves a whole group of query heads."),
    Case("an unknown dtype: a ValueError", (2, 4, 2, 8, 16, 1, "fp64?"), quick=False),
    Case("int8 cache, GQA with 4 groups, a batch of 16", (28, 28, 4, 128, 32768, 16, "int8"), quick=False),
    Case("an fp8 cache (1 byte per element), GQA with 8 KV heads", (32, 32, 8, 128, 8192, 4, "fp8"), quick=False,
         hint="fp8 stores 1 byte per element (fp32 4, bf16/fp16 2, fp8/int8 1): the table of bytes per dtype needs "
              "every dtype the question names."),
]

KV_CACHE_SIZE = Item(
    exercise="11", number=4, function="kv_cache_size", title="KV-cache bytes",
    reference=kv_cache_size, cases=KV_CASES,
    wrong_answers=[
        WrongAnswer("forgot K and V", _kv_times((lambda *args: 0.5)),
                    "the cache holds keys *and* values: multiply by 2."),
        WrongAnswer("elements, not bytes", _kv_times((lambda *args: 1 / BYTES_PER_ELEMENT[args[6]])),
                    "you counted elements; multiply by the bytes per element of the dtype (fp32 4, bf16/fp16 2, "
                    "fp8/int8 1)."),
        WrongAnswer("query heads", _kv_times((lambda n_layers, n_heads, n_kv_heads, *rest: n_heads / n_kv_heads)),
                    "only the KV heads are cached: use n_kv_heads, not n_heads. That is the whole point of GQA and MQA."),
        WrongAnswer("no fp8 in the table", _kv_without_fp8,
                    "your table of bytes per element has no fp8 (a KeyError): fp8, like int8, is 1 byte per element.",
                    quick=False),
        WrongAnswer("bits, not bytes", _kv_times((lambda *args: 8)),
                    "you counted bits (×8); the answer is in bytes: bf16 is 2 bytes per element."),
    ],
)

# --------------------------------------------------------------------------- 11.5 which ratio deviations are by design

#: Each scenario: a GRPO loop meant to be on-policy shows ratio = exp(log π_θ − log π_old) ≠ 1.
SCENARIOS = {
    "a": "Minibatch 3 of 4 from one rollout batch: the optimizer has stepped twice since the rollout.",
    "b": "Rollouts come from a bf16 inference engine with fused kernels; the trainer recomputes log π_old in fp32 "
         "from the same weights. |Δ log p| is about 1e-3 with random signs.",
    "c": "Completions are sampled at temperature 0.7; the trainer's log-probs use temperature 1.",
    "d": "The second epoch (μ = 2) over the same rollout batch.",
    "e": "The trainer computes log-probs with the model in train() mode, dropout 0.1.",
    "f": "The weights are pushed to the inference engine every 4 steps instead of every step (a config slip); the "
         "trainer computes log π_old itself, at its current weights.",
    "g": "Generation uses top-p 0.9, but the trainer's log-probs use the full softmax.",
    "h": "Deliberate one-step-off asynchronous training: batch k is generated while the trainer takes step k − 1, "
         "and the loss uses the sampler's recorded log-probs as log π_old.",
}

_ANSWER = {"a": "design", "b": "mismatch", "c": "mismatch", "d": "design", "e": "mismatch", "f": "mismatch",
           "g": "mismatch", "h": "design"}


def ratio_deviations():
    """Reference: "design" where the policy moved as the algorithm intends, "mismatch" where the sampling
    and scoring paths disagree (fix at the source, or correct with importance weights)."""
    return dict(_ANSWER)


RD_CASES = [Case("scenarios a-h (SCENARIOS in minigrpo_course.grading.ex11): {'a': 'design' or 'mismatch', …}")]

RATIO_DEVIATIONS = Item(
    exercise="11", number=5, function="ratio_deviations", title="which ratio deviations are by design",
    reference=ratio_deviations, cases=RD_CASES,
    wrong_answers=[
        WrongAnswer("everything a mismatch", lambda: dict.fromkeys(SCENARIOS, "mismatch"),
                    "once the optimizer has stepped on a batch (later minibatches, a second epoch) the policy has "
                    "moved: the ratio leaves 1 by design, and the clip is there for it."),
        WrongAnswer("dropout as design", lambda: {**_ANSWER, "e": "design"},
                    "dropout in the trainer's forward pass makes it score a different (random) network than the one "
                    "that sampled: a mismatch. Compute log-probs in eval() mode."),
        WrongAnswer("numerics as design", lambda: {**_ANSWER, "b": "design"},
                    "a bf16 engine vs an fp32 trainer is a mismatch between the sampling and scoring paths, even if "
                    "small and unavoidable: correct it with (truncated) importance weights or match the numerics."),
        WrongAnswer("planned asynchrony as mismatch", lambda: {**_ANSWER, "h": "mismatch"},
                    "a deliberate one-step lag, with the sampler's log-probs used as π_old, is by design: the ratio "
                    "then measures exactly how far the trainer has moved since sampling. (Exercise 07.5's "
                    "stale_weights is a mismatch because there the trainer recomputes π_old at its own, newer "
                    "weights: the ratio cannot see the lag.)"),
        WrongAnswer("a weight-sync slip as design", lambda: {**_ANSWER, "f": "design"},
                    "(f) lags like (h), but the trainer recomputes π_old at its current weights: the tokens came from "
                    "older weights that nothing accounts for, a mismatch (exercise 07.5's stale_weights). In (h) the "
                    "loss uses the sampler's own log-probs as π_old, so the ratio is the importance weight of the lag."),
    ],
)

ITEMS = [GROUP_ADVANTAGES, CLIPPED_OBJECTIVE, GAE_SEGMENT, KV_CACHE_SIZE, RATIO_DEVIATIONS]
