"""The course's one convention for numbers over seeds (minigrpo_course.experiments.stats)."""

import math

import pytest

from minigrpo_course.experiments.stats import mean_sd, spread, within_noise


def test_mean_sd_is_the_sample_sd_with_n_minus_1():
    mean, sd = mean_sd([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert sd == pytest.approx(math.sqrt(5 / 3))  # sum of squares 5, over n - 1 = 3 (population: sqrt(5/4))


def test_one_value_has_no_spread_and_none_is_refused():
    assert math.isnan(mean_sd([0.5])[1])
    assert spread([0.5]) == "0.500 (1 seed: no spread)"
    with pytest.raises(ValueError, match="at least one"):
        mean_sd([])


def test_spread_lists_seeds_up_to_five():
    assert spread([0.1, 0.2, 0.3]) == "0.200 ± 0.100 (3 seeds: 0.100, 0.200, 0.300)"
    assert spread([1, 2, 3, 4, 5, 6], digits=1) == "3.5 ± 1.9 (6 seeds)"
    assert spread([1, 2, 3, 4, 5, 6], digits=1, per_seed=True).endswith("1.0, 2.0, 3.0, 4.0, 5.0, 6.0)")


def test_within_noise():
    assert within_noise([0.654, 0.66, 0.648], [0.657, 0.65, 0.664])
    assert not within_noise([0.76, 0.75, 0.77], [0.67, 0.62, 0.72])
