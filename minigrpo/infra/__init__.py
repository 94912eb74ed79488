"""Plumbing the algorithms lean on, skippable on a first reading.

- `minigrpo.infra.checks`: input validation and the checks every config dataclass runs (clear errors instead
  of silent NaNs or broadcasting).
- `minigrpo.infra.tracking`: experiment tracking (TensorBoard, trackio, W&B) and resumable checkpoints.
- `minigrpo.infra.distributed`: data parallelism across processes (`accelerate launch`, `torchrun`).
- `minigrpo.infra.atomic`: writes that are all or nothing (files, checkpoint folders).
- `minigrpo.infra.divergence`: `TrainingDiverged`, the sentence a trainer stops with on NaN/inf.
"""
