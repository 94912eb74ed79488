"""Test-suite configuration shared by tests/, notebooks/ and solutions/.

Notebooks run in smoke mode: the variable is set here, before nbval starts any kernel, and
kernels inherit it.
"""

import os

import pytest

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


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run where CUDA is present and are skipped elsewhere (CI has no GPU)."""
    gpu_tests = [item for item in items if "gpu" in item.keywords]
    if not gpu_tests:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in gpu_tests:
            item.add_marker(skip)


def _one_torch_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


#: One torch thread (the tiny models' fastest), restored afterwards so that later modules keep theirs. Use with
#: ``pytestmark = pytest.mark.usefixtures("one_torch_thread")`` (per test), or ``"one_torch_thread_module"``
#: (once for a module whose module-scoped fixtures already train or sample).
one_torch_thread = pytest.fixture(_one_torch_thread, name="one_torch_thread")
one_torch_thread_module = pytest.fixture(_one_torch_thread, scope="module", name="one_torch_thread_module")
