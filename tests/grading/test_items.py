"""Every graded item of every exercise, on all its cases (the notebook's check cells run only the
quick ones). By default they grade solutions/ and must pass; grade your own work with
    python -m pytest tests/grading --grade-source exercises
The test_exNN.py files next to this one add property tests that go beyond fixed cases.
"""

import pytest

from minigrpo_course.grading import EXERCISES, run_item

ALL_ITEMS = [item for _, (_, its) in EXERCISES.items() for item in its]


@pytest.mark.parametrize("item", ALL_ITEMS, ids=lambda i: f"{i.id}-{i.function}")
def test_item(item, learner):
    result = run_item(item, learner(item.exercise).get(item.function))
    assert result.passed, "\n" + result.report()
