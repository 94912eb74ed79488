from pathlib import Path

import pytest

from minigrpo_course.grading.notebooks import find_notebook, load_functions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def grade_source(request) -> str:
    return request.config.getoption("--grade-source")


@pytest.fixture(scope="session")
def learner(grade_source):
    """``learner(exercise)`` -> the functions defined in that exercise's notebook."""
    cache = {}

    def load(exercise: str):
        if exercise not in cache:
            if grade_source in ("solutions", "exercises"):
                path = find_notebook(exercise, ROOT / grade_source)
            else:
                path = Path(grade_source)
            cache[exercise] = load_functions(path)
        return cache[exercise]

    return load


@pytest.fixture(scope="session")
def learner_fn(learner):
    """``learner_fn(exercise, name)`` -> the learner's function, or a clear failure if undefined."""

    def get(exercise: str, name: str):
        fn = learner(exercise).get(name)
        if fn is None:
            pytest.fail(f"`{name}` is not defined by exercise {exercise}'s notebook (did its cell run?)")
        return fn

    return get
