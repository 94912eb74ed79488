"""From minigrpo to TRL: the same GRPO run in TRL's ``GRPOTrainer``, and what changes on the way.

Most of our ``GRPOConfig`` carries over by name. Four things trip a learner who moves:

1. **The batch unit.** Our ``prompts_per_step`` counts prompts; TRL's ``per_device_train_batch_size`` counts
   *completions* per process per micro-batch. One of our steps (``prompts_per_step × G`` completions over
   ``gradient_accumulation_steps`` micro-batches) is one TRL generation batch:
   ``per_device_train_batch_size = prompts_per_step × G / (gradient_accumulation_steps × num_processes)``.
2. **The step unit.** Our ``max_steps`` (and ``save_steps``, ``logging_steps``, ``eval_every``) count GRPO steps,
   each of ``num_iterations`` (μ) optimizer steps; TRL's count optimizer steps: they are ours × μ.
3. **Defaults that differ.** TRL decays the learning rate linearly, checkpoints the activations, and (from 1.x)
   multiplies the KL term by the importance ratio (``use_bias_correction_kl``), which changes the KL gradient even
   on-policy; ours keeps the rate constant and the KL term plain. :func:`trl_grpo_kwargs` sets TRL's fields so
   that the two losses and gradients agree (tests/test_trl_bridge.py checks it on one batch fed to both).
4. **Data and rewards.** Reward functions are already TRL's (``f(prompts, completions, **kwargs)``, see
   ``minigrpo.llm.data``); the prompts go in a ``datasets.Dataset`` with a ``prompt`` column. A chat template and a
   system prompt are not config fields there: a conversational prompt (a list of messages, the system message
   first) gets the template.

:data:`FIELDS` and :data:`METRICS` are the mapping as data (ours → TRL's, with a note where meanings differ);
:func:`markdown_table` renders them for docs/trl.md ("Graduating to TRL") (a test keeps the two equal).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, NamedTuple

from minigrpo.llm.grpo import GRPOConfig


class Mapping(NamedTuple):
    ours: str  #: our name (a GRPOConfig field or a logged metric)
    trl: str  #: TRL's name, or "—" where TRL has none
    note: str = ""  #: where the meanings differ (empty: same name, same meaning)


NONE = "—"

#: Every field of our GRPOConfig, in its order, with TRL's equivalent.
FIELDS: tuple[Mapping, ...] = (
    Mapping("max_steps", "max_steps", "TRL counts optimizer steps: ours × num_iterations"),
    Mapping("prompts_per_step", "per_device_train_batch_size",
            "TRL counts completions per process and micro-batch: prompts_per_step × num_generations / "
            "(gradient_accumulation_steps × num_processes)"),
    Mapping("num_generations", "num_generations"),
    Mapping("temperature", "temperature"),
    Mapping("top_p", "top_p", "ours also scores the policy's log-probs under the truncated distribution (the ratio "
                              "to the sampler is 1); TRL scores at the temperature only"),
    Mapping("top_k", "top_k", "as top_p"),
    Mapping("max_completion_length", "max_completion_length", "ours None: the task's default; TRL's default is 512"),
    Mapping("learning_rate", "learning_rate", "ours constant, no weight decay: the bridge sets "
                                              "lr_scheduler_type='constant', weight_decay=0"),
    Mapping("beta", "beta", "TRL ≥ 1.0 multiplies the KL term by the ratio (use_bias_correction_kl): "
                            "the bridge turns it off, as ours has no such factor"),
    Mapping("kl_estimator", NONE, "TRL always uses k3 (our default); other estimators have no equivalent"),
    Mapping("epsilon", "epsilon"),
    Mapping("epsilon_high", "epsilon_high"),
    Mapping("loss_type", "loss_type", "same four names and normalisers; across processes TRL's 'bnpo' averages "
                                      "each process's token mean, ours is the global token mean"),
    Mapping("scale_rewards", "scale_rewards"),
    Mapping("num_iterations", "num_iterations"),
    Mapping("gradient_accumulation_steps", "gradient_accumulation_steps",
            "TRL also generates once per this many micro-batches (steps_per_generation)"),
    Mapping("max_grad_norm", "max_grad_norm"),
    Mapping("filter_zero_std_groups", NONE, "TRL keeps zero-spread groups (their advantage is 0)"),
    Mapping("mask_truncated_completions", "mask_truncated_completions"),
    Mapping("use_chat_template", NONE, "TRL templates conversational prompts (lists of messages) and no others"),
    Mapping("system_prompt", NONE, "put a system message first in each prompt of the data set"),
    Mapping("bf16", "bf16", "TRL (through accelerate) also casts the trained model"),
    Mapping("gradient_checkpointing", "activation_checkpointing",
            "transformers 5's name (gradient_checkpointing: its deprecated alias); TRL's default is on, ours off"),
    Mapping("vllm_importance_sampling_correction", "vllm_importance_sampling_correction",
            "ours applies to any sampler; TRL's only with use_vllm; mode 'token_truncate' is ours"),
    Mapping("vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_max"),
    Mapping("seed", "seed", "the same seed draws other prompts and samples in each"),
    Mapping("eval_every", "eval_steps", "TRL generates on eval_dataset and logs its rewards, not pass@k; "
                                        "× num_iterations"),
    Mapping("eval_generations", "num_generations_eval"),
    Mapping("report_to", "report_to"),
    Mapping("logging_dir", NONE, "no field since transformers 5: the tracker's own setting "
                                 "(TENSORBOARD_LOGGING_DIR, ...)"),
    Mapping("logging_steps", "logging_steps", "× num_iterations"),
    Mapping("output_dir", "output_dir"),
    Mapping("save_steps", "save_steps", "× num_iterations; ours 0 (only at the end): TRL's save_steps = max_steps"),
    Mapping("resume_from_checkpoint", "resume_from_checkpoint", "TRL reads it from trainer.train(...)'s argument"),
    Mapping("checkpoint_dir", "output_dir", "our older name"),
    Mapping("checkpoint_every", "save_steps", "our older name"),
)

#: Every metric our GRPO trainer logs (per step), with TRL's name.
METRICS: tuple[Mapping, ...] = (
    Mapping("reward", "reward"),
    Mapping("reward_std", "reward_std"),
    Mapping("frac_reward_zero_std", "frac_reward_zero_std"),
    Mapping("rewards/<function>/mean", "rewards/<function>/mean", "with a DatasetTask; and /std"),
    Mapping("correct, format", "rewards/<function>/mean", "the built-in tasks' reward parts"),
    Mapping("completions/mean_length", "completions/mean_length", "TRL adds min/max and the terminated ones"),
    Mapping("completions/clipped_ratio", "completions/clipped_ratio"),
    Mapping("kl", "kl"),
    Mapping("entropy", "entropy"),
    Mapping("clip_ratio/low_mean", "clip_ratio/low_mean"),
    Mapping("clip_ratio/high_mean", "clip_ratio/high_mean"),
    Mapping("clip_ratio/region_mean", "clip_ratio/region_mean"),
    Mapping("grad_norm", "grad_norm"),
    Mapping("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/mean",
            "and /max; TRL logs them only with vLLM"),
    Mapping("sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/mean",
            "and /min, /max; TRL: only with vLLM"),
    Mapping("ratio_min, ratio_mean, ratio_max", NONE, "the spread of π_θ / π_old"),
    Mapping("skipped", NONE, "TRL never skips a step"),
    Mapping("loss", "loss", "the batch's loss, averaged over num_iterations"),
    Mapping("learning_rate", "learning_rate"),
    Mapping("step_time", "step_time"),
    Mapping("eval/pass@1, eval/pass@G", "eval_reward", "TRL logs the held-out reward (and per function), not "
                                                       "pass@k"),
)

_STEP_COUNTS = ("max_steps", "logging_steps")  # fields that TRL counts in optimizer steps


def trl_grpo_kwargs(cfg: GRPOConfig, num_processes: int = 1,
                    max_completion_length: int | None = None) -> dict[str, Any]:
    """The keyword arguments of the TRL ``GRPOConfig`` that runs ``cfg``'s training on ``num_processes`` processes.

    ``max_completion_length`` stands for the task's default when ``cfg.max_completion_length`` is None. A field
    set to a value that TRL cannot reproduce (``kl_estimator`` other than k3, ``filter_zero_std_groups``) is a
    ``ValueError``; ``output_dir``, ``logging_dir``, the data set and the chat template are the caller's."""
    if cfg.kl_estimator != "k3":
        raise ValueError(f"GRPOConfig.kl_estimator={cfg.kl_estimator!r} has no TRL equivalent (TRL uses k3)")
    if cfg.filter_zero_std_groups:
        raise ValueError("GRPOConfig.filter_zero_std_groups=True has no TRL equivalent (TRL keeps every group)")
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an int >= 1, got {num_processes!r}")
    completions = cfg.prompts_per_step * cfg.num_generations
    per_device, rest = divmod(completions, cfg.gradient_accumulation_steps * num_processes)
    if rest:
        raise ValueError(f"GRPOConfig.prompts_per_step × num_generations = {completions} completions must split "
                         f"evenly over gradient_accumulation_steps × num_processes = "
                         f"{cfg.gradient_accumulation_steps * num_processes} micro-batches for TRL")
    mu = cfg.num_iterations
    out = {name: getattr(cfg, name) for name in (
        "num_generations", "temperature", "top_p", "top_k", "learning_rate", "beta", "epsilon", "epsilon_high", "loss_type",
        "scale_rewards", "num_iterations", "gradient_accumulation_steps", "max_grad_norm",
        "mask_truncated_completions", "bf16", "vllm_importance_sampling_correction",
        "vllm_importance_sampling_clip_max", "seed", "report_to")}
    out.update({name: getattr(cfg, name) * mu for name in _STEP_COUNTS})
    out.update(per_device_train_batch_size=per_device, steps_per_generation=cfg.gradient_accumulation_steps,
               max_completion_length=cfg.max_completion_length or max_completion_length or 512,
               num_generations_eval=cfg.eval_generations, activation_checkpointing=cfg.gradient_checkpointing,
               lr_scheduler_type="constant", weight_decay=0.0, use_bias_correction_kl=False,
               vllm_importance_sampling_mode="token_truncate")
    if cfg.eval_every:
        out.update(eval_strategy="steps", eval_steps=cfg.eval_every * mu)
    if cfg.output_dir is not None:
        out.update(output_dir=str(cfg.output_dir), save_strategy="steps",
                   save_steps=(cfg.save_steps or cfg.max_steps) * mu)
    else:
        out.update(save_strategy="no")
    return out


def to_trl_config(cfg: GRPOConfig, num_processes: int = 1, max_completion_length: int | None = None, **overrides):
    """TRL's ``GRPOConfig`` for ``cfg`` (:func:`trl_grpo_kwargs`), with ``overrides`` (e.g. ``output_dir``,
    ``use_vllm=True``) applied last. Needs ``trl`` (``pip install -e ".[course]"``)."""
    try:
        import trl
    except ImportError as err:  # the library itself does not need trl; only this function does
        raise ImportError("to_trl_config needs trl: pip install trl (or the course extra)") from err
    kwargs = {**trl_grpo_kwargs(cfg, num_processes, max_completion_length), **overrides}
    if "activation_checkpointing" not in {f.name for f in fields(trl.GRPOConfig)}:  # transformers < 5
        kwargs["gradient_checkpointing"] = kwargs.pop("activation_checkpointing")
    return trl.GRPOConfig(**kwargs)


def markdown_table(rows: tuple[Mapping, ...]) -> str:
    """``rows`` as a Markdown table: ours | TRL's | note."""
    lines = ["| minigrpo | TRL | note |", "|---|---|---|"]
    for m in rows:
        trl_name = m.trl if m.trl == NONE else f"`{m.trl}`"
        ours = ", ".join(f"`{part.strip()}`" for part in m.ours.split(","))
        lines.append(f"| {ours} | {trl_name} | {m.note} |")
    return "\n".join(lines)


def readme_section() -> str:
    """The body of docs/trl.md's TRL tables (between its two markers)."""
    return (f"Configuration (`GRPOConfig` → `trl.GRPOConfig`):\n\n{markdown_table(FIELDS)}\n\n"
            f"Metrics (our history / trackers → TRL's logs):\n\n{markdown_table(METRICS)}")


def unmapped_fields() -> set[str]:
    """Fields of our GRPOConfig missing from :data:`FIELDS` (a test keeps this empty)."""
    return {f.name for f in fields(GRPOConfig)} - {m.ours for m in FIELDS}


__all__ = ["FIELDS", "METRICS", "Mapping", "markdown_table", "readme_section", "to_trl_config", "trl_grpo_kwargs",
           "unmapped_fields"]
