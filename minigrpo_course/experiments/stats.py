"""How the course reports a number measured over seeds: one convention, used by every lesson.

The standard (stated in lesson 00 and the README, followed everywhere):

- A comparison that the prose draws a conclusion from is run on at least 3 seeds and shown with its spread.
- The spread is the **sample standard deviation over seeds** (``ddof=1``, the n − 1 form), written
  ``mean ± sd (n seeds)``; with 5 seeds or fewer the per-seed values are listed too.
- A difference smaller than the seeds' spread is called "within noise", not a win.
- Where one seed is all a lesson can afford, the prose says so and what one seed can and cannot show.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (n − 1) of ``values``; sd is nan for a single value."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("mean_sd needs at least one value")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float("nan")


def spread(values: Sequence[float], digits: int = 3, per_seed: bool | None = None) -> str:
    """``"0.764 ± 0.019 (3 seeds: 0.752, 0.786, 0.755)"``: mean ± sample sd (n − 1) over seeds.

    ``per_seed``: list each value (default: when there are 5 or fewer)."""
    mean, sd = mean_sd(values)
    n = len(values)
    if n == 1:
        return f"{mean:.{digits}f} (1 seed: no spread)"
    text = f"{mean:.{digits}f} ± {sd:.{digits}f} ({n} seeds"
    if per_seed if per_seed is not None else n <= 5:
        text += ": " + ", ".join(f"{x:.{digits}f}" for x in values)
    return text + ")"


def within_noise(a: Sequence[float], b: Sequence[float]) -> bool:
    """True when the means of ``a`` and ``b`` differ by less than the larger of their sample sds."""
    (ma, sa), (mb, sb) = mean_sd(a), mean_sd(b)
    return abs(ma - mb) < max(sa, sb)
