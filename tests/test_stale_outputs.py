"""Committed lesson and solution outputs come from a full-mode run of today's package code.

``minigrpo run`` records in each notebook what its outputs were made with (the mode, and a fingerprint of every
``minigrpo`` module the notebook imports: ``minigrpo_course.provenance``). When a module's code changes, every
notebook that imports it fails here until it is re-executed in full mode and its prose checked against the new
outputs. Exercises are generated from the solutions and carry no outputs of their own.
"""

from pathlib import Path

import nbformat
import pytest

from minigrpo_course import provenance

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = sorted(p for d in ("notebooks", "notebooks/deep_dives", "solutions") for p in (ROOT / d).glob("*.ipynb"))


@pytest.mark.parametrize("path", EXECUTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_outputs_were_made_in_full_mode_by_todays_code(path):
    nb = nbformat.read(path, as_version=4)
    rel = path.relative_to(ROOT)
    rerun = f"re-run it with `minigrpo run {rel} --in-place` and check its prose against the new outputs"
    entry = nb.metadata.get(provenance.METADATA_KEY)
    assert entry, f"{rel} has no record of the code its outputs were made with: {rerun}"
    assert entry.get("mode") == "full", f"{rel}'s committed outputs come from a {entry.get('mode')} run: {rerun}"
    stale = provenance.stale_modules(nb)
    assert not stale, f"{rel}'s outputs were made before the code of {', '.join(stale)} changed: {rerun}"
