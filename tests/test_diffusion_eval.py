"""Lesson 09's measurements: the independent judge (another architecture, a disjoint split) and diversity."""

import math

import pytest
import torch

from minigrpo.diffusion.rewards import (DigitClassifier, DigitMLP, digits_classifier, digits_judge, train_classifier,
                                        training_half)
from minigrpo_course.experiments.diffusion_eval import (judge_accuracy, mean_pairwise_distance, per_prompt_diversity,
                                                        per_prompt_table, seed_table, spread)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_training_halves_are_disjoint_stratified_and_miss_the_test_split():
    from minigrpo.diffusion.data import load_digits_images, train_test_split

    _, labels = load_digits_images(8)
    index = torch.arange(labels.numel(), dtype=torch.float32).view(-1, 1, 1, 1)  # "images" that hold their row number
    sets = [set(training_half(index, labels, h)[0].flatten().long().tolist()) for h in (None, 0, 1)]
    test = set(train_test_split(index, labels, 0.2, seed=0)[2].flatten().long().tolist())
    assert not sets[1] & sets[2] and sets[1] | sets[2] == sets[0] and not sets[0] & test
    for h in (0, 1):
        counts = torch.bincount(training_half(index, labels, h)[1], minlength=10)
        assert counts.min() >= 69 and abs(len(sets[h + 1]) - len(sets[0]) / 2) <= 5  # ~720 each, about 71 per digit
    with pytest.raises(ValueError, match="half must be"):
        training_half(index, labels, 2)


def test_judge_is_another_architecture_on_the_other_half_and_is_cached(tmp_path):
    """Measured on this split: the MLP judge 0.981 held-out accuracy, the half-0 CNN 0.989; asserted > 0.9."""
    judge, acc = digits_judge(cache_dir=tmp_path)
    assert isinstance(judge, DigitMLP) and acc > 0.9
    again, acc2 = digits_judge(cache_dir=tmp_path)  # from the cache file
    assert isinstance(again, DigitMLP) and acc2 == acc
    x = torch.randn(5, 1, 16, 16)
    torch.testing.assert_close(again(x), judge(x))
    with pytest.raises(ValueError, match="arch must be one of"):
        train_classifier(torch.zeros(4, 1, 16, 16), torch.tensor([0, 1, 0, 1]), arch="resnet")


def test_judge_accuracy_counts_argmax_hits():
    clf = DigitClassifier(image_size=8)
    imgs = torch.rand(6, 1, 8, 8) * 2 - 1                                # in [-1, 1]: the judge clamps its inputs
    with torch.no_grad():
        pred = clf(imgs).argmax(-1)
    labels = pred.clone()
    labels[:2] = (labels[:2] + 1) % 10
    assert judge_accuracy(clf, imgs, labels).tolist() == [False, False, True, True, True, True]
    with pytest.raises(ValueError, match="labels must be"):
        judge_accuracy(clf, imgs, labels[:3])


def test_pairwise_distances_by_hand():
    blank, full = -torch.ones(1, 1, 4, 4), torch.ones(1, 1, 4, 4)
    half = blank.clone()
    half[..., :2, :] = 1.0                                            # top half inked
    imgs = torch.cat([blank, full, half])
    # rms: |blank − full| = 2 everywhere; blank–half and full–half differ by 2 on half the pixels → 2/√2
    assert mean_pairwise_distance(imgs) == pytest.approx((2 + 2 * math.sqrt(2)) / 3)
    assert mean_pairwise_distance(torch.cat([half, half, half])) == 0
    bottom = blank.clone()
    bottom[..., 2:, :] = 1.0
    # cosine on ink: top and bottom halves do not overlap → 1; full vs half → 1 − 8/√(16·8) = 1 − 1/√2
    assert mean_pairwise_distance(torch.cat([half, bottom]), "cosine") == pytest.approx(1.0)
    assert mean_pairwise_distance(torch.cat([full, half]), "cosine") == pytest.approx(1 - 1 / math.sqrt(2))
    with pytest.raises(ValueError, match="at least 2 images"):
        mean_pairwise_distance(half)
    with pytest.raises(ValueError, match="metric must be"):
        mean_pairwise_distance(imgs, "l1")


def test_per_prompt_diversity_groups_by_label():
    g = torch.Generator().manual_seed(0)
    same = torch.randn(1, 1, 4, 4, generator=g).repeat(3, 1, 1, 1)      # prompt 7: three identical images
    varied = torch.randn(3, 1, 4, 4, generator=g)                        # prompt 2: three different ones
    div = per_prompt_diversity(torch.cat([varied, same]), torch.tensor([2, 2, 2, 7, 7, 7]))
    assert set(div) == {2, 7} and div[7] == 0
    assert div[2] == pytest.approx(mean_pairwise_distance(varied))


def test_spread_and_table():
    assert spread([1.0, 2.0, 3.0], 2) == "2.00 ± 1.00 (1.00–3.00)"
    assert spread([0.5]) == "0.500"
    with pytest.raises(ValueError, match="non-empty"):
        spread([])
    text = seed_table({"base": {"reward": [0.5, 0.5]}}, keys=("reward",))
    assert "0.500 ± 0.000 (0.500–0.500)" in text


def test_digits_classifier_default_is_unchanged_by_the_half_option(tmp_path):
    """``half=None`` hashes the same settings as before the option existed (caches stay valid)."""
    import hashlib
    import json

    settings = {"image_size": 8, "seed": 0, "epochs": 1}
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    digits_classifier(8, 0, tmp_path, epochs=1)
    assert (tmp_path / f"digit_classifier_{key}.pt").exists()


def test_per_prompt_table_averages_the_seeds():
    before = {3: (0.4, 0.5, 0.42), 4: (0.5, 0.8, 0.40)}
    after = [{3: (0.8, 0.9, 0.30), 4: (1.0, 1.0, 0.10)}, {3: (0.6, 0.7, 0.34), 4: (0.9, 1.0, 0.20)}]
    text = per_prompt_table(before, after)
    assert "0.40 → 0.70" in text and "0.40 → 0.15" in text and "2 seeds" in text


def test_show_grid_draws_ink_black_as_lesson_08(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minigrpo_course.experiments.diffusion_eval import INK_CMAP, show_grid

    monkeypatch.setattr(plt, "show", lambda: None)
    show_grid(torch.zeros(4, 1, 4, 4), rows=2, title="t", row_labels=["a", "b"], scores=[0.1, 0.2, 0.3, 0.4])
    images = [ax.images[0] for ax in plt.gcf().axes]
    assert INK_CMAP == "gray_r" and len(images) == 4
    assert all(im.get_cmap().name == "gray_r" and im.get_clim() == (-1, 1) for im in images)
    plt.close("all")
