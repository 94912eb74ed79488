"""The smoke/full switch, without importing torch.

``minigrpo.utils`` re-exports these names; the command line reads them from here so that
``minigrpo --help`` stays fast.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

#: The one environment variable that switches every notebook and trainer to its tiny "smoke"
#: configuration (about a minute per notebook on 2 CPU cores). The test-suite sets it.
SMOKE_ENV_VAR = "MINIGRPO_SMOKE"
_TRUE = {"1", "true", "yes", "on"}


def is_smoke() -> bool:
    """True when ``MINIGRPO_SMOKE`` is set to 1/true/yes/on (case-insensitive)."""
    return os.environ.get(SMOKE_ENV_VAR, "").strip().lower() in _TRUE


def smoke_or_full(smoke: T, full: T) -> T:
    """Pick a setting: ``smoke`` under the smoke switch, ``full`` otherwise.

    >>> iterations = smoke_or_full(smoke=5, full=200)
    """
    return smoke if is_smoke() else full
