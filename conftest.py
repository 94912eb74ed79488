"""Test-suite configuration shared by tests/, notebooks/ and solutions/.

Notebooks run in smoke mode: the variable is set here, before nbval starts any kernel, and
kernels inherit it.
"""

import os

os.environ.setdefault("MINIGRPO_SMOKE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TQDM_DISABLE", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--grade-source",
        default=os.environ.get("MINIGRPO_GRADE_SOURCE", "solutions"),
        help="where the grading tests load the learner's functions from: 'solutions' (default), "
        "'exercises', or a path to a notebook",
    )
