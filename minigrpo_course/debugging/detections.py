"""Detections: one invariant of a correct GRPO step each, measured on a tiny model.

Every detection runs a step (by default the teaching copy :func:`buggy_grpo_step` with the given
``bugs``; or any ``step(model, ref_model, batch, optimizer, cfg) -> StepRecord``, e.g. a learner's
repaired one) on copies of ``model`` — the caller's model never changes — and returns a
:class:`Detection`: passed or not, the number it measured, and what that means.

=================================  ============================================  ===========================
detection                          invariant                                     catches
=================================  ============================================  ===========================
logprobs_match_sampler             trainer log-probs of the sampled tokens ==    off-by-one, temperature
                                   the sampler's (recorded while sampling)       forgotten when rescoring
ratio_is_one_at_first_inner_step   before any update π_θ = π_old: ρ = 1          old/new scored differently
kl_zero_at_step0                   reference = policy at step 0: KL = 0          reference scored differently
loss_matches_hand_value            at ρ = 1, β = 0 the loss is −Σ A_b L_b / Σ L_b  prompt/padding counted, EOS
                                   (L_b: completion length incl. its EOS)        dropped, batch-normalised A
invariant_to_tokens_after_eos      junk after the EOS changes no loss/gradient   padding counted, EOS masked
zero_grad_on_all_equal_groups      a group of equal rewards teaches nothing      batch-normalised A, no eps
no_grad_into_advantages            the advantage is a constant                   advantage not detached
advantages_fixed_across_inner_steps  μ > 1: the advantage is the rollout's       advantage from current policy
old_logp_is_rollout_policy         μ > 1: π_old stays the rollout's policy       old log-probs after the step
=================================  ============================================  ===========================
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from minigrpo.advantages import group_advantages
from minigrpo_course.debugging.buggy_step import RolloutBatch, StepConfig, StepRecord, buggy_grpo_step, make_batch
from minigrpo.llm.models import make_tiny_model
from minigrpo.llm.sft import SFTConfig, train_sft
from minigrpo.llm.tasks import AdditionTask
from minigrpo.llm.tokenizer import build_char_tokenizer

#: Prompts of the detections' batches (G = 4 completions each).
PROMPTS = ("12+34=", "45+67=", "50+50=", "7+8=")
GROUP_SIZE, MAX_NEW_TOKENS, TEMPERATURE = 4, 6, 0.7

Step = Callable[..., StepRecord]


@dataclass
class Detection:
    name: str
    passed: bool
    value: float  #: what was measured (compare with ``threshold``)
    threshold: float
    message: str

    def __str__(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name:<36} {self.value:10.3g}  {self.message}"


def debugging_setup(seed: int = 0, sft_steps: int = 40, hidden_size: int = 32):
    """A pad == eos character tokenizer (GPT-2 style) and a tiny Llama briefly fine-tuned on addition, so its
    completions end with EOS and carry padding after it. Returns ``(model, tokenizer)``, the model in eval mode."""
    tok = build_char_tokenizer()
    tok.pad_token = tok.eos_token
    model = make_tiny_model(tok, "llama", seed=seed, hidden_size=hidden_size)
    train_sft(model, tok, AdditionTask(eval_size=20), SFTConfig(steps=sft_steps, batch_size=32, learning_rate=1e-2,
                                                                seed=seed), progress=False)
    return model.eval(), tok


def _step_fn(step: Step | None, bugs: Iterable[str]) -> Step:
    return step if step is not None else functools.partial(buggy_grpo_step, bugs=frozenset(bugs))


def _batch(model, tokenizer, rewards=None) -> RolloutBatch:
    return make_batch(model, tokenizer, list(PROMPTS), GROUP_SIZE, MAX_NEW_TOKENS, TEMPERATURE, rewards)


def _run(model, tokenizer, step: Step, cfg: StepConfig | None = None, lr: float = 0.0, with_ref: bool = False,
         batch: RolloutBatch | None = None) -> tuple[StepRecord, RolloutBatch]:
    """Run ``step`` on a copy of ``model``: SGD with ``lr`` = 0 (nothing moves) or Adam with ``lr`` > 0."""
    policy = copy.deepcopy(model)
    ref = copy.deepcopy(model).eval().requires_grad_(False) if with_ref else None
    batch = batch if batch is not None else _batch(model, tokenizer)  # sampling runs under no_grad
    opt = torch.optim.Adam(policy.parameters(), lr=lr) if lr > 0 else torch.optim.SGD(policy.parameters(), lr=0.0)
    return step(policy, ref, batch, opt, cfg or StepConfig()), batch


def _masked_max(x: torch.Tensor, mask: torch.Tensor) -> float:
    v = x[mask.bool()].abs()
    return float("inf") if torch.isnan(v).any() else v.max().item()


def _result(name, value, threshold, ok_msg, bad_msg, strict=False) -> Detection:
    passed = bool(value == 0) if strict else bool(value < threshold)
    return Detection(name, passed, float(value), threshold, ok_msg if passed else bad_msg)


def logprobs_match_sampler(model, tokenizer, step: Step | None = None, bugs: Iterable[str] = ()) -> Detection:
    rec, b = _run(model, tokenizer, _step_fn(step, bugs))
    v = _masked_max(rec.logp - b.gen.sampler_logprobs, b.gen.completion_mask)
    return _result("logprobs_match_sampler", v, 1e-4, "the trainer scores the sampled tokens as the sampler did",
                   "the trainer's log-probs of the sampled tokens differ from the sampler's: check the alignment "
                   "(logits[t] predict token t+1) and the temperature")


def ratio_is_one_at_first_inner_step(model, tokenizer, step: Step | None = None, bugs: Iterable[str] = ()) -> Detection:
    rec, b = _run(model, tokenizer, _step_fn(step, bugs))
    v = _masked_max(rec.ratio[0] - 1, b.gen.completion_mask)
    return _result("ratio_is_one_at_first_inner_step", v, 1e-6, "ρ = 1 before any update",
                   "ρ ≠ 1 before any update: the old and the new log-probs are not computed the same way")


def kl_zero_at_step0(model, tokenizer, step: Step | None = None, bugs: Iterable[str] = ()) -> Detection:
    rec, b = _run(model, tokenizer, _step_fn(step, bugs), StepConfig(beta=0.04), with_ref=True)
    v = _masked_max(rec.kl, b.gen.completion_mask)
    return _result("kl_zero_at_step0", v, 1e-6, "KL to a reference equal to the policy is 0",
                   "KL ≠ 0 while the reference equals the policy: the reference is scored differently "
                   "(temperature, alignment, mode)")


def loss_matches_hand_value(model, tokenizer, step: Step | None = None, bugs: Iterable[str] = ()) -> Detection:
    rec, b = _run(model, tokenizer, _step_fn(step, bugs))
    lengths = b.gen.completion_mask.sum(1).double()
    adv = group_advantages(b.rewards.double(), b.group_size)
    expected = -(adv * lengths).sum() / lengths.sum()
    v = abs(rec.loss[0] - expected.item())
    v = float("inf") if v != v else v
    return _result("loss_matches_hand_value", v, 1e-6, f"loss = −Σ A·L / Σ L = {expected.item():.6f}",
                   f"loss {rec.loss[0]:.6f} ≠ −Σ A·L / Σ L = {expected.item():.6f}: the loss counts other tokens "
                   "than the completions up to their EOS, or the advantages are not the group-normalised rewards")


def invariant_to_tokens_after_eos(model, tokenizer, step: Step | None = None, bugs: Iterable[str] = ()) -> Detection:
    fn = _step_fn(step, bugs)
    b = _batch(model, tokenizer)
    after = b.gen.completion_mask == 0
    if not after.any():
        raise ValueError("no completion of the batch ended before max_new_tokens: nothing follows an EOS to change")
    junk = tokenizer.convert_tokens_to_ids("7")
    gen2 = replace(b.gen, completion_ids=b.gen.completion_ids.masked_fill(after, junk))
    rec1, _ = _run(model, tokenizer, fn, batch=b)
    rec2, _ = _run(model, tokenizer, fn, batch=replace(b, gen=gen2))
    v = max(abs(rec1.loss[0] - rec2.loss[0]), (rec1.grad - rec2.grad).abs().max().item())
    v = float("inf") if v != v else v
    return _result("invariant_to_tokens_after_eos", v, 1e-6, "tokens after the EOS change nothing",
                   "tokens after the EOS changed the loss or the gradient: the mask counts padding (or was built "
                   "from token ids, not positions)")


def zero_grad_on_all_equal_groups(model, tokenizer, step: Step | None = None, bugs: Iterable[str] = ()) -> Detection:
    rewards = torch.arange(len(PROMPTS), dtype=torch.float32).repeat_interleave(GROUP_SIZE)  # equal within a group
    rec, _ = _run(model, tokenizer, _step_fn(step, bugs), batch=_batch(model, tokenizer, rewards))
    g = rec.grad
    v = float("inf") if not torch.isfinite(g).all() else g.abs().max().item()
    return _result("zero_grad_on_all_equal_groups", v, 0.0, "groups of equal rewards give exactly zero gradient",
                   "groups of equal rewards moved the policy (or gave NaN): normalise within each group, add eps, "
                   "and give an all-equal group advantage 0", strict=True)


def no_grad_into_advantages(model, tokenizer, step: Step | None = None, bugs: Iterable[str] = ()) -> Detection:
    rec, _ = _run(model, tokenizer, _step_fn(step, bugs), StepConfig(kl_in_reward=0.1), with_ref=True)
    v = float(rec.advantages[0].requires_grad)
    return _result("no_grad_into_advantages", v, 0.5, "the advantage is a constant (no gradient reaches it)",
                   "the advantage requires grad: the KL-shaped reward was computed from log-probs with their graph; "
                   "compute it from the rollout's (detached) log-probs")


def advantages_fixed_across_inner_steps(model, tokenizer, step: Step | None = None,
                                        bugs: Iterable[str] = ()) -> Detection:
    rec, _ = _run(model, tokenizer, _step_fn(step, bugs), StepConfig(kl_in_reward=0.1, num_iterations=2), lr=1e-2,
                  with_ref=True)
    v = (rec.advantages[1].detach() - rec.advantages[0].detach()).abs().max().item()
    return _result("advantages_fixed_across_inner_steps", v, 0.0, "the advantage is computed once, from the rollout",
                   "the advantage changed between inner steps: it must come from the rollout's policy, not the "
                   "current one", strict=True)


def old_logp_is_rollout_policy(model, tokenizer, step: Step | None = None, bugs: Iterable[str] = ()) -> Detection:
    rec, b = _run(model, tokenizer, _step_fn(step, bugs), StepConfig(num_iterations=2), lr=1e-2)
    v = _masked_max(rec.old_logp[1] - rec.old_logp[0], b.gen.completion_mask)
    moved = _masked_max(rec.ratio[1] - 1, b.gen.completion_mask)
    return _result("old_logp_is_rollout_policy", v, 0.0, f"π_old is fixed; at the second inner step max|ρ − 1| = "
                   f"{moved:.2g}", "π_old moved after the first optimizer step: the ratio is 1 again and the clip "
                   "cannot act; snapshot the old log-probs once, before any update", strict=True)


#: Every detection, in the order a debugger would run them.
DETECTIONS: dict[str, Callable[..., Detection]] = {f.__name__: f for f in (
    logprobs_match_sampler, ratio_is_one_at_first_inner_step, kl_zero_at_step0, loss_matches_hand_value,
    invariant_to_tokens_after_eos, zero_grad_on_all_equal_groups, no_grad_into_advantages,
    advantages_fixed_across_inner_steps, old_logp_is_rollout_policy)}


def run_detections(model, tokenizer, step: Step | None = None, bugs: Iterable[str] = ()) -> list[Detection]:
    """Every detection on one step (or on the teaching copy with ``bugs``)."""
    return [d(model, tokenizer, step, bugs) for d in DETECTIONS.values()]


__all__ = ["DETECTIONS", "Detection", "PROMPTS", "debugging_setup", "run_detections", *DETECTIONS]
