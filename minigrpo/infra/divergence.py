"""Training that diverges stops with a sentence, not by training on NaN or failing deep inside torch.

A learning rate that is too high first shows as a loss, a gradient norm or weights that are no longer
finite numbers, or as logits the sampler cannot draw from (``torch.multinomial``: "probability tensor
contains either inf, nan or element < 0"). The trainers check those quantities where they appear and
raise :class:`TrainingDiverged`, which names the trainer, the step, the quantity and a likely cause.
The command line prints its sentence and exits with status 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch


class TrainingDiverged(RuntimeError):
    """A loss, a gradient norm, the weights or the policy's logits stopped being finite numbers."""


def likely_cause(learning_rate: float) -> str:
    """The usual cause in a few words: a learning rate that is too high (or, at 0, the model or the data)."""
    if learning_rate > 0:
        return f"learning_rate {learning_rate:g} is likely too high (try {learning_rate / 10:g})"
    return "the learning rate is 0, so the model's weights or its inputs hold NaN or inf"


def diverged(trainer: str, step: int, quantity: str, learning_rate: float) -> TrainingDiverged:
    """The exception and its sentence: ``GRPO step 7: the loss is NaN or inf; learning_rate 10 is ...``."""
    return TrainingDiverged(f"{trainer} step {step}: {quantity} is NaN or inf; {likely_cause(learning_rate)}")


def stop_if_not_finite(value: float, trainer: str, step: int, quantity: str, learning_rate: float) -> None:
    """Raise :class:`TrainingDiverged` when ``value`` (a loss, a gradient norm) is NaN or ±inf."""
    if not math.isfinite(value):
        raise diverged(trainer, step, quantity, learning_rate)


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """True when every entry of every tensor is finite (one host sync for all of them)."""
    flags = [torch.isfinite(t).all() for t in tensors]
    return bool(torch.stack(flags).all()) if flags else True


def stop_if_weights_diverged(model: torch.nn.Module, trainer: str, step: int, learning_rate: float) -> None:
    """Raise :class:`TrainingDiverged` when a trainable weight of ``model`` is NaN or ±inf after ``step``."""
    if not all_finite(p.detach() for p in model.parameters() if p.requires_grad):
        raise diverged(trainer, step, "a weight of the model", learning_rate)


def check_weights_before_training(model: torch.nn.Module, trainer: str) -> None:
    """A ``ValueError`` (bad input, not divergence) when ``model`` arrives with NaN or ±inf weights."""
    if not all_finite(p.detach() for p in model.parameters() if p.is_floating_point()):
        raise ValueError(f"{trainer}: the model's weights hold NaN or inf before training (saved by a run "
                         f"that diverged?): load a checkpoint from before it")


@contextmanager
def logits_guard(trainer: str, step: int, learning_rate: float) -> Iterator[None]:
    """Around sampling: torch's error for NaN or inf probabilities becomes :class:`TrainingDiverged`."""
    try:
        yield
    except RuntimeError as exc:
        if "probability tensor contains" not in str(exc):
            raise
        raise diverged(trainer, step, "the policy's logits (while sampling)", learning_rate) from exc


__all__ = ["TrainingDiverged", "all_finite", "check_weights_before_training", "diverged", "likely_cause",
           "logits_guard", "stop_if_not_finite", "stop_if_weights_diverged"]
