"""minigrpo: policy-gradient reinforcement learning from REINFORCE to GRPO, one tested step at a time.

Shared math lives at the top (`advantages`, `losses`); each "world" the course trains in has its own
sub-package (`control` for gymnasium environments; later `llm` and `diffusion`).
"""

__version__ = "0.1.0"

from minigrpo.utils import SMOKE_ENV_VAR, get_device, is_smoke, seed_everything, smoke_or_full

__all__ = ["SMOKE_ENV_VAR", "get_device", "is_smoke", "seed_everything", "smoke_or_full", "__version__"]
