"""Exercise 07 — debugging a GRPO step: repair the buggy step, sort ratio deviations, truncated IS weights.

Items 07.1–07.4 grade one function, the learner's repaired ``grpo_step``, one family of invariants each.
Every case is a detection of :mod:`minigrpo.debugging.detections` and compares the number it measures
(0 for a correct step) with the reference's; every typical mistake is the teaching copy with exactly one
planted bug switched on, so a verdict names the bug that is still there.
"""

from __future__ import annotations

import functools
from functools import partial

import torch

from minigrpo.course.grading.core import Call, Case, Item, WrongAnswer, checked_by, f64
from minigrpo.debugging.buggy_step import BUGS, buggy_grpo_step
from minigrpo.debugging.detections import DETECTIONS, GROUP_SIZE, PROMPTS, TEMPERATURE, debugging_setup

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
    ],
    wrong_answers=[
        _wrong("logprob_off_by_one", "score token t+1 with logits[:, t] — log_softmax(logits[:, :-1] / T) gathered "
               "at ids[:, 1:] (the package's token_logprobs does it)."),
        _wrong("no_temperature_rescoring", "the loss's forward pass must divide the logits by the sampling "
               "temperature, like the old-log-prob and reference passes."),
        _wrong("ref_no_temperature", "score the reference model at the sampling temperature too, or the KL compares "
               "two different distributions from step 0."),
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
              "first EOS, nothing of the prompt, and use the group-normalised advantages.", 1e-6),
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
    ],
    wrong_answers=[
        _wrong("old_logp_after_step", "the old log-probs are recomputed after the optimizer step, so ρ = 1 at every "
               "inner step and the clip never acts: compute them once, before the loop."),
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
                    "π_old at its *current* weights, so the sampler's distribution silently differs — a mismatch."),
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


_tis = partial(checked_by, tis_weights)  # a typical mistake: refuses what the reference refuses, then errs
_GRAD_FLAG = Call(_weights_and_grad_flag, "with trainer_logp requiring grad; compared: the weights and whether "
                                          "they require grad")
_HAND = (f64([[-1.0, -0.5, -2.0, -0.3], [-0.2, -3.0, -1.0, -1.5]]),
         f64([[-1.2, -0.5, -0.4, -2.0], [-0.9, -0.1, -1.0, -1.0]]), torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]))

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
        WrongAnswer("not detached",
                    _tis(lambda t, s, m, cap=3.0: torch.where(m.bool(), (t - s).exp().clamp(max=cap), 0.0)),
                    "detach the weights: they are a fixed correction factor, not something to differentiate "
                    "(a gradient through them changes the estimator)."),
    ],
)

ITEMS = [LOGPROBS, MASKS, ADVANTAGES, OLD_LOGPROBS, BY_DESIGN, TIS]
