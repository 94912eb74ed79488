"""Data parallelism for the trainers: one process per device, each with its share of the batch.

Launched as ``accelerate launch --num_processes N -m minigrpo train ...`` (or ``torchrun``), every process runs the
same trainer on its own prompts; :class:`Distributed` is the little they need to agree on, written with
``torch.distributed`` collectives (the process group comes from ``accelerate``'s ``PartialState``: NCCL on GPUs,
gloo on CPUs):

- **groups stay whole on one rank**: each rank samples whole groups, so group advantages need nothing from the
  others (``scale_rewards="batch"`` gathers the rewards: the batch std is global);
- **the loss normalisers are global** (:meth:`Distributed.sum`): each rank's loss is its tokens' share of the
  *global* batch's loss, and the gradients are **summed** across ranks (:meth:`Distributed.sum_gradients`), so the
  gradient equals the one-process gradient of the same global batch (DDP averages instead, and TRL scales its loss
  by the number of processes to undo it: the same thing);
- **metrics are gathered** (:meth:`Distributed.gather`, :meth:`Distributed.reduce_metrics`);
- **only rank 0 writes** logs and checkpoints (:func:`is_main_process`);
- **sampling seeds differ per rank** and are reproducible (:meth:`Distributed.seed`): rank 0 keeps the config's
  seed, so a one-process run is unchanged.

In one process (no launcher) every method is the identity: the trainers' numbers are exactly those of before.

Its users: ``llm.grpo.GRPOTrainer``, ``llm.sft.SFTTrainer``, ``diffusion.grpo.DiffusionGRPOTrainer`` (summed
gradients) and PPO (``control.ppo``, through ``control.onpolicy.train_loop``: averaged gradients, its loss being a
minibatch mean). ``tests/test_distributed.py`` and ``tests/test_distributed_trainers.py`` check each against one
process in two gloo processes.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

#: rank r > 0 samples with seed + r × SEED_STRIDE (rank 0: the seed itself)
SEED_STRIDE = 1_000_003


def launched() -> bool:
    """True when a launcher (``accelerate launch``, ``torchrun``) started more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


_warned_alone = False


def warn_if_alone_but_asked_for_more() -> None:
    """One warning when a launcher prepared several processes and this one runs alone: ``accelerate launch --cpu
    --num_processes 2`` starts a single process (accelerate's simple launcher) yet sets ``MASTER_ADDR`` for a
    group (``WORLD_SIZE`` is unset), so a run the user meant to split trains in one process, silently."""
    global _warned_alone
    env = os.environ
    asked = "MASTER_ADDR" in env and any(k.startswith("ACCELERATE_") for k in env)
    if asked and not launched() and not _warned_alone:
        _warned_alone = True
        warnings.warn("a launcher prepared several processes (MASTER_ADDR is set) but only this one runs "
                      "(WORLD_SIZE is unset): training in one process. `accelerate launch --cpu` starts one "
                      "process; on CPUs use `accelerate launch --multi_gpu --num_processes N` (gloo) or "
                      "`torchrun --nproc_per_node N`", stacklevel=3)


def init_process_group() -> None:
    """Join the launcher's process group (once) through ``accelerate``'s ``PartialState``; nothing in one process."""
    if launched() and not dist.is_initialized():
        from accelerate import PartialState

        PartialState()  # reads the launcher's environment; gloo on CPU, NCCL on CUDA


def is_main_process() -> bool:
    """Rank 0 (or the only process): the one that writes logs, checkpoints and progress bars."""
    return not dist.is_initialized() or dist.get_rank() == 0


class Distributed:
    """The collectives one trainer needs; in one process each is the identity (no copy, no change in numbers)."""

    def __init__(self):
        init_process_group()
        warn_if_alone_but_asked_for_more()
        self.active = dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.active else 0
        self.world_size = dist.get_world_size() if self.active else 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def seed(self, seed: int) -> int:
        """This rank's sampling seed: ``seed`` on rank 0, a distinct reproducible one on every other rank."""
        return seed + SEED_STRIDE * self.rank

    def broadcast_parameters(self, model: torch.nn.Module) -> None:
        """Start every rank from rank 0's weights (as DDP does when it wraps a model)."""
        if self.active:
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t.data, src=0)

    def sum(self, value: int | float) -> int | float:
        """``value`` summed over ranks (e.g. a token count: the global normaliser)."""
        if not self.active:
            return value
        t = torch.tensor(float(value), dtype=torch.float64, device=self._device())
        dist.all_reduce(t)
        return type(value)(t.item())

    def from_main(self, value: float) -> float:
        """Rank 0's ``value`` on every rank (e.g. an evaluation that rank 0 alone ran, so that all stop together)."""
        if not self.active:
            return value
        t = torch.tensor(float(value), dtype=torch.float64, device=self._device())
        dist.broadcast(t, src=0)
        return t.item()

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` ``[n, ...]`` of every rank, concatenated in rank order ``[world_size × n, ...]`` (equal ``n``)."""
        if not self.active:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)

    def local(self, n: int) -> slice:
        """This rank's rows of a gathered tensor whose ranks hold ``n`` rows each."""
        return slice(self.rank * n, (self.rank + 1) * n)

    def barrier(self) -> None:
        """Wait until every rank gets here (e.g. until rank 0 has written a cache the others then read)."""
        if self.active:
            dist.barrier()

    def sum_gradients(self, model: torch.nn.Module) -> None:
        """Sum the gradients over ranks (a rank that had no rows contributes zeros)."""
        if not self.active:
            return
        for p in model.parameters():
            if p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """One value per metric over all ranks: the max of ``…max`` keys, the min of ``…min`` keys, else the mean
        over the ranks that report the key (NaN counts as not reported, e.g. a rank that finished no episode; NaN if
        none does). Non-numbers are kept from this rank."""
        if not self.active:
            return metrics
        every: list[dict] = [{} for _ in range(self.world_size)]
        dist.all_gather_object(every, {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and v == v})
        out = dict(metrics)
        for key in {k for d in every for k in d}:
            values = [d[key] for d in every if key in d]
            last = key.rsplit("/", 1)[-1].rsplit("_", 1)[-1]
            out[key] = max(values) if last == "max" else min(values) if last == "min" else sum(values) / len(values)
        return out

    def _device(self) -> torch.device:
        on_gpu = dist.get_backend() == "nccl"
        return torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")


__all__ = ["Distributed", "SEED_STRIDE", "init_process_group", "is_main_process", "launched",
           "warn_if_alone_but_asked_for_more"]
