"""minigrpo: policy-gradient reinforcement learning from REINFORCE to GRPO, one tested step at a time.

The library a learner reads: algorithms only. Shared math lives at the top (`advantages`, `losses`,
`trust_region`, `attention`, `grpo_common`); each "world" the course trains in has its own sub-package:
`control` (gymnasium environments), `llm` (a small language model, or a pretrained one) and `diffusion`
(DDPM and flow-matching image models). `infra` holds the plumbing a first reading can skip (config checks,
tracking and checkpoints, several processes); `cli` is `python -m minigrpo train ...`.

The course built on it (grading, interview practice, progress, the notebooks' experiment helpers, lesson
07's planted bugs, the `minigrpo` command) is the separate package `minigrpo_course`, which imports this one;
nothing here imports it.

`import minigrpo` does not import torch: `get_device` and `seed_everything` are loaded from
`minigrpo.utils` the first time they are used, so the command line starts fast.
"""

from __future__ import annotations

import importlib

from minigrpo.smoke import SMOKE_ENV_VAR, is_smoke, smoke_or_full

__version__ = "0.1.0"

#: names served lazily (PEP 562): importing their module imports torch
_LAZY = {"get_device": "minigrpo.utils", "seed_everything": "minigrpo.utils"}

__all__ = ["SMOKE_ENV_VAR", "get_device", "is_smoke", "seed_everything", "smoke_or_full", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'minigrpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
