"""Shared test set-up: one torch thread (2 shared cores: spinning thread pools make runs erratic; another count
with LATHE_TEST_THREADS, how bench/golden_drift.py measures what threads change), and quiet, deterministic
defaults."""

import os

import pytest
import torch

torch.set_num_threads(int(os.environ.get("LATHE_TEST_THREADS", "1")))


def pytest_collection_modifyitems(config, items):
    """Tests marked `hf` compare against transformers, `gpu` ones need a CUDA device: skip them cleanly
    where it is missing."""
    if not torch.cuda.is_available():
        skip_gpu = pytest.mark.skip(reason="needs a CUDA device (tests/gpu; bench/gpu/run.py runs them on one)")
        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(skip_gpu)
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
