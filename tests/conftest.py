"""Shared test set-up: one torch thread (2 shared cores: spinning thread pools make runs erratic),
and quiet, deterministic defaults."""

import os

import pytest
import torch

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked `hf` compare against transformers; skip them cleanly where it is missing."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        skip = pytest.mark.skip(reason="transformers is not installed (pip install 'lathe[test]')")
        for item in items:
            if "hf" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def tmp_output(tmp_path):
    """An output_dir inside pytest's temporary folder."""
    return str(tmp_path / "output")


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
