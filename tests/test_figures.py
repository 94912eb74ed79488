"""Committed figures are palette PNGs (minigrpo_course/figures.py): smaller, the same size in pixels, visually the
same, and compacting twice changes nothing."""

import base64
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from minigrpo_course.figures import compact_figures, compact_png, main  # noqa: E402


def _plot_png() -> bytes:
    rng = np.random.default_rng(0)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3), dpi=72)
    for k in range(4):
        axes[0].plot(np.cumsum(rng.normal(size=300)), label=f"seed {k}")
    axes[0].legend()
    axes[1].imshow(rng.random((16, 16)), cmap="viridis")
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"), dtype=np.int16)


def test_a_plot_gets_smaller_and_looks_the_same():
    original = _plot_png()
    small = compact_png(original)
    assert len(small) < 0.7 * len(original)
    a, b = _pixels(original), _pixels(small)
    assert a.shape == b.shape
    diff = np.abs(a - b)
    assert diff.mean() < 1.0 and np.quantile(diff, 0.99) <= 16  # a few levels, on anti-aliased edges only
    assert compact_png(small) is small  # already a palette PNG: kept


def _notebook_with_figure(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("plot()")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "image/png": base64.b64encode(_plot_png()).decode("ascii") + "\n", "text/plain": "<Figure>"})]
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), cell]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_compacting_a_notebook_changes_only_its_figures_and_is_idempotent(tmp_path, capsys):
    path = _notebook_with_figure(tmp_path)
    before = nbformat.read(path, as_version=4)
    assert main([str(path)]) == 0
    after = nbformat.read(path, as_version=4)
    nbformat.validate(after)
    assert [c.source for c in after.cells] == [c.source for c in before.cells]
    assert after.cells[1].outputs[0].data["text/plain"] == "<Figure>"
    old_png = base64.b64decode(before.cells[1].outputs[0].data["image/png"])
    new_png = base64.b64decode(after.cells[1].outputs[0].data["image/png"])
    assert len(new_png) < len(old_png) and Image.open(io.BytesIO(new_png)).mode in ("P", "L")
    text = path.read_text()
    assert main([str(path)]) == 0 and path.read_text() == text  # twice: nothing changes
    assert "kB ->" in capsys.readouterr().out
    assert compact_figures(nbformat.read(path, as_version=4))[0] == len(new_png)


def test_a_grey_image_is_stored_losslessly():
    rng = np.random.default_rng(1)
    grey = (rng.random((40, 60)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(np.stack([grey] * 3, axis=-1)).save(out, "PNG")
    small = compact_png(out.getvalue())
    assert Image.open(io.BytesIO(small)).mode == "L" and len(small) < len(out.getvalue())
    assert (_pixels(small) == _pixels(out.getvalue())).all()
