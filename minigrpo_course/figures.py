"""Lean committed figures: every PNG output of a notebook stored with an adaptive palette of at most 256 colours.

Matplotlib writes 24-bit PNGs; a plot has few colours (its lines, text and their anti-aliased edges), so a palette
PNG of the same pixels-per-inch is a third of the size and looks the same (grey images are stored losslessly; in
colour ones only anti-aliased edges move, by a few levels of 255). ``minigrpo run`` stores every figure it executes this way, and

    python -m minigrpo_course.figures notebooks/*.ipynb notebooks/deep_dives/*.ipynb

re-encodes the figures of committed notebooks without running them (nothing else in the file changes). A figure
the palette would not make smaller is kept as it was, so running it twice changes nothing.
"""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

PNG = "image/png"


def compact_png(data: bytes) -> bytes:
    """``data`` (a PNG) re-encoded smaller with the same look, or ``data`` itself when that is not smaller: an
    opaque grey image as 8-bit grey (lossless); any other as an adaptive palette of at most 256 colours, without
    dithering (a plot's lines and text keep their colours; only anti-aliased edges move by a few levels)."""
    import numpy as np
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    if image.mode in ("P", "L"):
        return data
    rgba = np.asarray(image.convert("RGBA"))
    opaque = bool((rgba[..., 3] == 255).all())
    if opaque and (rgba[..., 0] == rgba[..., 1]).all() and (rgba[..., 1] == rgba[..., 2]).all():
        small = image.convert("L")
    elif opaque:
        small = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    else:
        small = image.convert("RGBA").quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    out = io.BytesIO()
    small.save(out, "PNG", optimize=True)
    return out.getvalue() if len(out.getvalue()) < len(data) else data


def compact_figures(nb) -> tuple[int, int]:
    """Re-encode every PNG output of ``nb`` (in place) with :func:`compact_png`; returns the PNG bytes before and
    after."""
    before = after = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            encoded = output.get("data", {}).get(PNG)
            if not isinstance(encoded, str):
                continue
            raw = base64.b64decode(encoded)
            new = compact_png(raw)
            before, after = before + len(raw), after + len(new)
            if new is not raw:
                output["data"][PNG] = base64.b64encode(new).decode("ascii") + "\n"
    return before, after


def main(argv: list[str] | None = None) -> int:
    """Re-encode the figures of the notebooks named on the command line; prints the bytes saved per notebook."""
    import nbformat

    from minigrpo_course.state import atomic_write_text

    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m minigrpo_course.figures NOTEBOOK.ipynb ...", file=sys.stderr)
        return 2
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        before, after = compact_figures(nb)
        if after < before:
            text = nbformat.writes(nb)
            atomic_write_text(path, text if text.endswith("\n") else text + "\n")
        print(f"{path}: figures {before / 1e3:.0f} kB -> {after / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
