"""Exercise 07 — debugging a GRPO step: repair the buggy step, sort ratio deviations, truncated IS weights.

Items 07.1–07.4 grade one function, the learner's repaired ``grpo_step``, one family of invariants each.
Every case is a detection of :mod:`minigrpo_course.debugging.detections` and compares the number it measures
(0 for a correct step) with the reference's; every typical mistake is the teaching copy with exactly one
planted bug switched on, so a verdict names the bug that is still there.
"""

from __future__ import annotations

import copy
import functools
from functools import partial

import torch

from minigrpo.advantages import group_advantages
from minigrpo_course.grading.core import Call, Case, Item, WrongAnswer, checked_by, f64
from minigrpo_course.debugging.buggy_step import BUGS, StepConfig, StepRecord, buggy_grpo_step, make_batch
from minigrpo_course.debugging.detections import (DETECTIONS, GROUP_SIZE, MAX_NEW_TOKENS, PROMPTS, TEMPERATURE,
                                                  debugging_setup)
from minigrpo.llm.sampling import position_ids_from_mask
from minigrpo.losses import kl_estimate, token_logprobs

TITLE = "Debugging a GRPO step"


@functools.lru_cache(maxsize=1)
def _setup():
    torch.set_num_threads(1)
    return debugging_setup(seed=0)


def reference_step(model, ref_model, batch, optimizer, cfg):
    """The teaching copy with every bug off."""
    return buggy_grpo_step(model, ref_model, batch, optimizer, cfg, bugs=())


def _with_bug(bug: str):
    assert bug in BUGS, bug

    def step(model, ref_model, batch, optimizer, cfg):
        return buggy_grpo_step(model, ref_model, batch, optimizer, cfg, bugs={bug})

    step.__name__ = f"grpo_step_with_{bug}"
    return step


_BATCH = (f"{len(PROMPTS)} addition prompts × {GROUP_SIZE} completions from a tiny Llama (pad == eos, "
          f"debugging_setup(seed=0)), temperature {TEMPERATURE}, seeded rewards; the step runs on copies of the model")


def _case(name: str, measured: str, hint: str, threshold: float) -> Case:
    """A detection as a case: the measured value must match the reference's (≈ 0) within the detection's threshold."""
    def run(step, inputs):
        return DETECTIONS[name](*_setup(), step=step).value

    call = Call(run, f"your grpo_step, run by detections.{name} on {_BATCH}; measured: {measured}")
    return Case(name.replace("_", " "), call=call, rtol=0.0, atol=threshold, hint=hint)


def _wrong(bug: str, hint: str) -> WrongAnswer:
    return WrongAnswer(bug, _with_bug(bug), f"bug still there — {bug}: {hint}")


# --------------------------------------------------------------------------- beyond inner step 0 and ref = policy
# Every detection above runs where ρ = 1 exactly (inner step 0) or with the reference a copy of the policy (any KL is
# 0). The grader's cases below run where those hide mistakes: a reference moved away from the policy, a KL in the
# reward, μ = 3 inner steps. They compare what the step records with what the reference step records.


def step_variant(model, ref_model, batch, optimizer, cfg, *, loss_type="token", unbiased=True, kl_sign=1.0,
                 kl_tokens="completion", ref_is_policy=False, kl_kind="k3", zero_grad=True, ratio_to="old"):
    """A learner-style GRPO step (the solution's shape) with one mistake per knob; the defaults are correct
    and agree with :func:`reference_step`. The knobs are the mistakes that inner step 0 and ref = policy hide:
    ``loss_type="sequence"`` (per-sequence mean), ``unbiased=False`` (population std), ``kl_sign=-1`` (a KL
    *bonus* in the reward), ``kl_tokens="all"`` (the reward's KL summed over prompt and padding columns),
    ``ref_is_policy`` (the reference scored with the policy), ``kl_kind`` ("k1" or "swapped" instead of k3),
    ``zero_grad=False`` (gradients accumulate across inner steps), ``ratio_to="current"`` (ρ against a detached
    copy of the current log-probs: 1 at every inner step)."""
    gen, G, T = batch.gen, batch.group_size, batch.temperature
    ids, attn = gen.sequences, gen.attention_mask
    P, rec = gen.prompt_ids.shape[1], StepRecord()

    def score(m):
        logits = m(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits
        return token_logprobs(logits, ids, T)

    mask = torch.cat([torch.zeros_like(gen.prompt_mask[:, 1:]), gen.completion_mask], 1).float()
    rec.loss_mask = mask
    with torch.no_grad():
        old = score(model)
        ref = score(model if ref_is_policy else ref_model) if ref_model is not None else None
        r = batch.rewards
        if cfg.kl_in_reward:
            counted = torch.ones_like(mask) if kl_tokens == "all" else mask
            r = r - kl_sign * cfg.kl_in_reward * ((old - ref) * counted).sum(-1)
        if unbiased:
            adv = group_advantages(r, G, "group", cfg.eps)
        else:
            g = r.view(-1, G)
            adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, unbiased=False, keepdim=True) + cfg.eps)).reshape(-1)
    for it in range(cfg.num_iterations):
        logp = score(model)
        ratio = torch.exp(logp - (old if ratio_to == "old" else logp.detach()))
        a = adv[:, None]
        per_tok = -torch.min(ratio * a, torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.epsilon) * a)
        kl = {"k3": lambda: kl_estimate(logp, ref, "k3"), "k1": lambda: logp - ref,
              "swapped": lambda: kl_estimate(ref, logp, "k3")}[kl_kind]() if ref is not None else torch.zeros_like(logp)
        if cfg.beta:
            per_tok = per_tok + cfg.beta * kl
        if loss_type == "sequence":
            loss = ((per_tok * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
        else:
            loss = (per_tok * mask).sum() / mask.sum().clamp(min=1)
        if zero_grad or it == 0:
            optimizer.zero_grad()
        loss.backward()
        rec.add(it, P - 1, model, loss, logp, kl, ratio, old, adv)
        optimizer.step()
    return rec


def _variant(name: str, **knobs):
    step = partial(step_variant, **knobs)
    step.__name__ = name
    return step


def moved_reference(model, scale: float = 0.05, seed: int = 0):
    """A frozen copy of ``model`` moved away from it by seeded noise (std ``scale``) on every weight."""
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return ref


def _run_moved(step, cfg: StepConfig, lr: float = 0.0, flat_groups: bool = False):
    """The step on copies of the debugging model, with a moved reference; Adam(lr) when lr > 0, else SGD(0).
    ``flat_groups``: rewards equal within each group, so every advantage is 0 and only the KL moves the policy."""
    model, tok = _setup()
    policy = copy.deepcopy(model)
    rewards = torch.arange(len(PROMPTS), dtype=torch.float32).repeat_interleave(GROUP_SIZE) if flat_groups else None
    batch = make_batch(model, tok, list(PROMPTS), GROUP_SIZE, MAX_NEW_TOKENS, TEMPERATURE, rewards)
    opt = torch.optim.Adam(policy.parameters(), lr=lr) if lr > 0 else torch.optim.SGD(policy.parameters(), lr=0.0)
    return step(policy, moved_reference(model), batch, opt, cfg), batch


def _kl_and_grad(step, inputs):
    rec, b = _run_moved(step, StepConfig(beta=0.04), flat_groups=True)
    return {"per-token KL": rec.kl * b.gen.completion_mask, "gradient": rec.grad}


def _shaped_advantages(step, inputs):
    rec, _ = _run_moved(step, StepConfig(kl_in_reward=0.1))
    return rec.advantages[0].detach()


def _inner_steps(step, inputs):
    rec, b = _run_moved(step, StepConfig(num_iterations=3, beta=0.04), lr=1e-3)
    m = b.gen.completion_mask
    return {"loss at inner steps 1-3": torch.tensor(rec.loss, dtype=torch.float64),
            "ratio at inner steps 2-3": torch.stack([rec.ratio[1] * m, rec.ratio[2] * m])}


_MOVED = f"{_BATCH}, the reference moved away from the policy (moved_reference: N(0, 0.05²) on every weight)"

MOVED_REF_CASE = Case(
    "a reference moved away from the policy: the per-token KL and its gradient",
    call=Call(_kl_and_grad, f"your grpo_step on {_MOVED}, rewards equal within each group (every advantage 0: only "
                            "the KL moves the policy), beta = 0.04; compared: record.kl on the completion tokens and "
                            "record.grad"),
    quick=False, rtol=1e-4, atol=1e-6,
    hint="with a reference that differs from the policy the KL is no longer 0: score the reference model (not the "
         "policy) at the sampling temperature, use k3 = exp(ref − logp) − 1 − (ref − logp) per token, and average "
         "β·k3 with the loss's token mean (if 07.2 fails too, fix that first: it weighs the KL as well).")

SHAPED_REWARD_CASE = Case(
    "a KL penalty in the reward, with a moved reference: the advantages",
    call=Call(_shaped_advantages, f"your grpo_step on {_MOVED}, kl_in_reward = 0.1; compared: record.advantages[0]"),
    quick=False, rtol=1e-4, atol=1e-5,
    hint="the shaped reward is r − kl_in_reward · Σ_t (old_logp − ref_logp) over the completion tokens up to the EOS "
         "(the loss mask): a penalty, subtracted, from the rollout's log-probs.")

INNER_STEPS_CASE = Case(
    "μ = 3 inner steps (ρ ≠ 1 after the first): each step's loss and ratios",
    call=Call(_inner_steps, f"your grpo_step on {_MOVED}, num_iterations = 3, beta = 0.04, Adam lr 1e-3; compared: "
                            "record.loss at the 3 inner steps and record.ratio at inner steps 2 and 3 (completion tokens)"),
    quick=False, rtol=1e-3, atol=1e-5,
    hint="after the first optimizer step ρ = exp(logp − old_logp) moves away from 1: keep old_logp from before the "
         "loop, recompute logp at every inner step, and zero the gradients before each backward pass. (Every inner "
         "step starts from the first one's update: if 07.1–07.3 fail too, fix them first.)")


# --------------------------------------------------------------------------- 07.1 log-probs

LOGPROBS = Item(
    exercise="07", number=1, function="grpo_step", title="log-probs: alignment and temperature",
    reference=reference_step,
    cases=[
        _case("logprobs_match_sampler", "max |record.logp − the sampler's log-probs| over completion tokens",
              "the trainer must score each sampled token exactly as the sampler did: logits at t predict token t+1, "
              "divided by the sampling temperature before the log-softmax.", 1e-4),
        _case("ratio_is_one_at_first_inner_step", "max |ρ − 1| at the first inner step",
              "before any optimizer step, the new and the old log-probs must be the same computation (same "
              "temperature, same alignment).", 1e-6),
        _case("kl_zero_at_step0", "max |k3| with the reference a copy of the policy, beta = 0.04",
              "with the reference equal to the policy the KL must be 0: score the reference exactly like the policy.",
              1e-6),
        MOVED_REF_CASE,
    ],
    wrong_answers=[
        _wrong("logprob_off_by_one", "score token t+1 with logits[:, t] — log_softmax(logits[:, :-1] / T) gathered "
               "at ids[:, 1:] (the package's token_logprobs does it)."),
        _wrong("no_temperature_rescoring", "the loss's forward pass must divide the logits by the sampling "
               "temperature, like the old-log-prob and reference passes."),
        _wrong("ref_no_temperature", "score the reference model at the sampling temperature too, or the KL compares "
               "two different distributions from step 0."),
        WrongAnswer("reference scored with the policy", _variant("ref_is_policy", ref_is_policy=True),
                    "your KL is 0 even when the reference has moved: the reference log-probs must come from ref_model, "
                    "not from the policy (with a copy of the policy as reference, the two look the same).", quick=False),
        WrongAnswer("k1 in the loss", _variant("k1", kl_kind="k1"),
                    "the loss's KL term is k3 = exp(ref − logp) − 1 − (ref − logp), not k1 = logp − ref: k1 can be "
                    "negative per token and its gradient does not pull the policy back to the reference.", quick=False),
        WrongAnswer("k3 with the log-probs swapped", _variant("k3_swapped", kl_kind="swapped"),
                    "k3 is written with log r = ref_logp − logp: exp(ref − logp) − 1 − (ref − logp). You swapped the "
                    "two, which estimates KL(π_ref ‖ π) from the policy's samples.", quick=False),
    ],
)

# --------------------------------------------------------------------------- 07.2 masks

MASKS = Item(
    exercise="07", number=2, function="grpo_step", title="which tokens count",
    reference=reference_step,
    cases=[
        _case("loss_matches_hand_value", "|loss − (−Σ_b A_b·L_b / Σ_b L_b)| at ρ = 1, β = 0, L_b = tokens of "
              "completion b up to and including its first EOS",
              "at ρ = 1 each counted token contributes −A: count the completion tokens up to and including the "
              "first EOS, nothing of the prompt, average over all counted tokens of the batch at once (Σ/Σ, not per "
              "completion), and use the group-normalised advantages (sample std + eps).", 1e-6),
        _case("invariant_to_tokens_after_eos", "the largest change of the loss or of the gradient when the tokens "
              "after each EOS are replaced by '7'",
              "tokens after the first EOS were never sampled: mask them out by position, not by token id.", 1e-6),
    ],
    wrong_answers=[
        _wrong("prompt_in_loss", "the loss mask must be 0 on every prompt column; only completion tokens are "
               "the policy's actions."),
        _wrong("pad_in_loss", "use the completion mask (1 up to and including the first EOS, 0 after), not all "
               "completion columns."),
        _wrong("eos_masked", "with pad == eos, `ids != pad_id` also drops the EOS; build the mask by position "
               "(no EOS strictly before the token), e.g. minigrpo.llm.sampling.completion_mask."),
        WrongAnswer("per-sequence mean", _variant("per_sequence_mean", loss_type="sequence"),
                    "your tokens are right, but you averaged each completion first and then the completions "
                    "(DeepSeekMath's per-sequence mean): this step uses one token mean over the batch, "
                    "Σ mask·loss / Σ mask, so a long completion weighs by its length."),
    ],
)

# --------------------------------------------------------------------------- 07.3 advantages

ADVANTAGES = Item(
    exercise="07", number=3, function="grpo_step", title="advantages: per group, guarded, constant",
    reference=reference_step,
    cases=[
        _case("zero_grad_on_all_equal_groups", "max |gradient| (inf for NaN) with rewards equal within each group "
              "(0, 1, 2, 3)",
              "a group of equal rewards carries no signal: its advantages must be exactly 0 (and never NaN).", 0.0),
        _case("no_grad_into_advantages", "record.advantages[0].requires_grad (1 = True) with a reference model, "
              "kl_in_reward = 0.1",
              "the advantage must be a constant: compute the KL-shaped reward from the rollout's log-probs "
              "without a graph.", 0.0),
        _case("advantages_fixed_across_inner_steps", "max |advantages at inner step 2 − at inner step 1| with "
              "kl_in_reward = 0.1, num_iterations = 2, Adam lr 1e-2",
              "compute the advantages once per batch, from the rollout, before the inner loop.", 0.0),
        SHAPED_REWARD_CASE,
    ],
    wrong_answers=[
        _wrong("batch_norm_adv", "normalise each reward with the mean and std of its own group of G, not of the "
               "whole batch."),
        _wrong("no_eps", "divide by (group std + eps) and give an all-equal group advantage exactly 0 — or the "
               "first flat group is 0/0 = NaN."),
        _wrong("adv_from_current_policy", "compute the advantages once, from the rollout's log-probs, not from "
               "the current policy at each inner step."),
        _wrong("adv_not_detached", "the shaped reward was computed from log-probs that carry a gradient: use the "
               "rollout's (no-grad) log-probs, or .detach()."),
        WrongAnswer("population std", _variant("population_std", unbiased=False),
                    "your advantages use the population std (÷ G, unbiased=False); group_advantages uses the sample "
                    "std (÷ (G − 1), torch.std's default) plus eps.", quick=False),
        WrongAnswer("KL added to the reward", _variant("kl_bonus", kl_sign=-1.0),
                    "the KL enters the reward as a penalty: r − kl_in_reward · Σ (old_logp − ref_logp). You added it, "
                    "which pays the policy for drifting away from the reference.", quick=False),
        WrongAnswer("reward KL over every column", _variant("kl_all_columns", kl_tokens="all"),
                    "sum the reward's KL over the completion tokens up to the EOS only (the loss mask): the prompt "
                    "columns and the padding after the EOS are not the policy's actions.", quick=False),
    ],
)

# --------------------------------------------------------------------------- 07.4 old log-probs

OLD_LOGPROBS = Item(
    exercise="07", number=4, function="grpo_step", title="π_old is the rollout's policy",
    reference=reference_step,
    cases=[
        _case("old_logp_is_rollout_policy", "max |old log-probs at inner step 2 − at inner step 1| with "
              "num_iterations = 2, Adam lr 1e-2",
              "snapshot the old log-probs once, before the first optimizer step, and keep them for every inner "
              "step.", 0.0),
        INNER_STEPS_CASE,
    ],
    wrong_answers=[
        _wrong("old_logp_after_step", "the old log-probs are recomputed after the optimizer step, so ρ = 1 at every "
               "inner step and the clip never acts: compute them once, before the loop."),
        WrongAnswer("gradients accumulate", _variant("no_zero_grad", zero_grad=False),
                    "zero the gradients before every backward pass (optimizer.zero_grad() inside the inner loop): "
                    "otherwise inner step 2 adds its gradient to step 1's and takes a larger, wrong step.",
                    quick=False),
        WrongAnswer("ratio to the current log-probs", _variant("ratio_to_current", ratio_to="current"),
                    "the ratio is exp(logp − old_logp) with old_logp from before the loop; exp(logp − logp.detach()) "
                    "is 1 at every inner step (same gradient at step 1, then the clip never acts).", quick=False),
    ],
)

# --------------------------------------------------------------------------- 07.5 which deviations are by design

RATIO_CAUSES = ("mu_gt_1", "minibatches", "dropout", "temperature", "top_k", "top_p", "bf16", "kv_cache_fp32",
                "attn_backend_bf16", "stale_weights")


def ratio_by_design() -> set[str]:
    """Reference: the causes of ρ ≠ 1 that PPO/GRPO's objective is built for."""
    return {"mu_gt_1", "minibatches"}


def _sorted_answer(f, inputs):
    answer = inputs(f)
    if not isinstance(answer, (set, frozenset, list, tuple)):
        raise TypeError(f"return a set of cause names, got {type(answer).__name__}")
    unknown = set(answer) - set(RATIO_CAUSES)
    if unknown:
        raise ValueError(f"unknown cause name(s) {sorted(unknown)}; choose from {RATIO_CAUSES}")
    return tuple(sorted(answer))


BY_DESIGN = Item(
    exercise="07", number=5, function="ratio_by_design", title="which ratio deviations are by design",
    reference=ratio_by_design,
    cases=[Case("the set of causes that are expected by design",
                call=Call(_sorted_answer, f"called with no arguments; compared: the returned set of causes (sorted), "
                                               f"chosen from {RATIO_CAUSES}"),
                hint="a deviation is by design when the objective accounts for it: the policy moved between the "
                     "snapshot of π_old and the update, on purpose.")],
    wrong_answers=[
        WrongAnswer("none", lambda: set(),
                    "several optimizer steps on one batch (μ > 1, or minibatches) move the policy on purpose: the "
                    "ratio is then the importance weight the clip is built for — that is by design."),
        WrongAnswer("only mu", lambda: {"mu_gt_1"},
                    "minibatches are the same thing as μ > 1: every optimizer step after the first sees a moved "
                    "policy. Both are by design."),
        WrongAnswer("stale is by design", lambda: {"mu_gt_1", "minibatches", "stale_weights"},
                    "stale sampler weights look like μ > 1, but nobody accounts for them: the trainer recomputes "
                    "π_old at its *current* weights, so the sampler's distribution silently differs — a mismatch. (A "
                    "planned lag whose loss uses the sampler's recorded log-probs as π_old, exercise 11.5(h), is by "
                    "design: there the ratio sees the lag.)"),
        WrongAnswer("numerics are by design", lambda: {"mu_gt_1", "minibatches", "bf16", "kv_cache_fp32",
                                                       "attn_backend_bf16"},
                    "precision and kernel differences are small but they are a mismatch between sampler and "
                    "trainer (the objective assumes they are one policy); correct them with truncated IS."),
        WrongAnswer("dropout by design", lambda: {"mu_gt_1", "minibatches", "dropout"},
                    "dropout makes the training forward a different (random) policy than the one that sampled: "
                    "a mismatch; turn it off for RL."),
    ],
)

# --------------------------------------------------------------------------- 07.6 truncated importance sampling weights


def _check_tis(trainer_logp, sampler_logp, mask, cap):
    if trainer_logp.shape != sampler_logp.shape or trainer_logp.shape != mask.shape:
        raise ValueError(f"trainer_logp, sampler_logp and mask must have the same shape, got "
                         f"{tuple(trainer_logp.shape)}, {tuple(sampler_logp.shape)}, {tuple(mask.shape)}")
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")


def tis_weights(trainer_logp, sampler_logp, mask, cap=3.0):
    """Reference: min(exp(trainer − sampler), cap), detached, 0 where the mask is 0."""
    _check_tis(trainer_logp, sampler_logp, mask, cap)
    w = torch.exp(trainer_logp.detach() - sampler_logp.detach()).clamp(max=cap)
    return torch.where(mask.bool(), w, torch.zeros_like(w))


def _weights_and_grad_flag(f, inputs):
    inputs["trainer_logp"].requires_grad_(True)
    w = inputs(f)
    return {"weights": w.detach(), "requires_grad": bool(w.requires_grad)}


def _weights_with_graphs(f, inputs):
    inputs["trainer_logp"].requires_grad_(True)
    inputs["sampler_logp"].requires_grad_(True)
    w = inputs(f)
    return {"weights": w.detach(), "requires_grad": bool(w.requires_grad)}


_tis = partial(checked_by, tis_weights)  # a typical mistake: refuses what the reference refuses, then errs
_GRAD_FLAG = Call(_weights_and_grad_flag, "with trainer_logp requiring grad; compared: the weights and whether "
                                          "they require grad")
_HAND = (f64([[-1.0, -0.5, -2.0, -0.3], [-0.2, -3.0, -1.0, -1.5]]),
         f64([[-1.2, -0.5, -0.4, -2.0], [-0.9, -0.1, -1.0, -1.0]]), torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]))

_CAP_HINT = ("raise ValueError unless cap > 0: a cap of 0 sets every weight to 0 and a negative one flips their "
             "sign, silently switching the loss off or turning it around.")

TIS = Item(
    exercise="07", number=6, function="tis_weights", title="truncated importance-sampling weights",
    reference=tis_weights,
    cases=[
        Case("a hand-sized batch, cap 3", (*_HAND, 3.0), call=_GRAD_FLAG),
        Case("cap 1.5", (*_HAND, 1.5), call=_GRAD_FLAG),
        Case("no mismatch: every weight is 1", (f64([[-1.0, -2.0, -0.5]]), f64([[-1.0, -2.0, -0.5]]),
                                                torch.tensor([[1, 1, 1]]), 3.0), call=_GRAD_FLAG),
        Case("shapes that disagree are refused", (torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 3), 3.0),
             hint="raise ValueError when the three tensors do not have the same shape."),
        Case("sampler log-probs that still carry a graph: the weights must not",
             (*_HAND, 3.0), call=Call(_weights_with_graphs, "with trainer_logp and sampler_logp requiring grad; "
                                                             "compared: the weights and whether they require grad"),
             quick=False, hint="detach both log-probs (or compute under torch.no_grad()): the weights are a fixed "
                               "correction factor, and a sampler's log-probs may arrive with a graph attached."),
        Case("cap 0 is refused with a ValueError", (*_HAND, 0.0), quick=False, hint=_CAP_HINT),
        Case("a negative cap is refused with a ValueError", (*_HAND, -1.0), quick=False, hint=_CAP_HINT),
    ],
    wrong_answers=[
        WrongAnswer("inverted", _tis(lambda t, s, m, cap=3.0: tis_weights(s, t, m, cap)),
                    "the weight re-weights the sampler's samples toward the trainer's policy: "
                    "π_trainer / π_sampler = exp(trainer_logp − sampler_logp), not the other way round."),
        WrongAnswer("no cap", _tis(lambda t, s, m, cap=3.0: tis_weights(t, s, m, float("inf"))),
                    "truncate: min(weight, cap) — a token the sampler almost never emits would otherwise carry a "
                    "huge weight (the variance that TIS exists to bound)."),
        WrongAnswer("clamped from below",
                    _tis(lambda t, s, m, cap=3.0: tis_weights(t, s, m, cap).clamp(min=1 / cap) * m),
                    "truncated IS caps the weight from above only: min(w, cap). Raising small weights would "
                    "over-count tokens the trainer finds unlikely."),
        WrongAnswer("mask ignored", _tis(lambda t, s, m, cap=3.0: tis_weights(t, s, torch.ones_like(m), cap)),
                    "set the weights of masked positions (after the EOS) to 0."),
        WrongAnswer("sampler not detached",
                    _tis(lambda t, s, m, cap=3.0: torch.where(m.bool(), (t.detach() - s).exp().clamp(max=cap), 0.0)),
                    "you detached trainer_logp but not sampler_logp: a sampler's (or an old forward pass's) log-probs "
                    "can carry a graph, so detach both.", quick=False),
        WrongAnswer("not detached",
                    _tis(lambda t, s, m, cap=3.0: torch.where(m.bool(), (t - s).exp().clamp(max=cap), 0.0)),
                    "detach the weights: they are a fixed correction factor, not something to differentiate "
                    "(a gradient through them changes the estimator)."),
    ],
)

ITEMS = [LOGPROBS, MASKS, ADVANTAGES, OLD_LOGPROBS, BY_DESIGN, TIS]
