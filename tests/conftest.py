"""Shared test set-up: one torch thread (2 shared cores: spinning thread pools make runs erratic; another count
with LATHE_TEST_THREADS, how bench/golden_drift.py measures what threads change), quiet, deterministic
defaults, bytecode cached, the imported modules frozen out of the garbage collector's scans, and the files in
tests/suite_order.txt's order (longest first, so that the README's `-n auto --dist loadfile` starts the long files
first and ends on short ones)."""

import gc
import os
import sys
from pathlib import Path

if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    # An environment that turns Python's bytecode cache off (this sandbox does) makes each of the ~150 Pythons the
    # suite starts (lathe train, torchrun ranks, the workers) compile lathe's modules again: ~0.4 CPU s each. The
    # suite runs Python as it runs by default: compiled files kept in the (git-ignored) __pycache__ folders.
    sys.dont_write_bytecode = False

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("LATHE_TEST_THREADS", "1")))
if "TORCH_EXTENSIONS_DIR" not in os.environ:
    # DeepSpeed compiles its CPU ops once into torch's extensions folder under ~/.cache. Tests that give the
    # processes they start a private HOME (a fresh tokenization cache) would compile them again, a minute or
    # more each: point them all at the folder torch would use for the real HOME.
    from torch.utils.cpp_extension import get_default_build_root

    accelerator = (
        f"rocm{torch.version.hip}" if torch.version.hip else f"cu{torch.version.cuda}" if torch.version.cuda else "cpu"
    )
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(
        get_default_build_root(), f"{python}_{accelerator.replace('.', '')}"
    )
if "PYTEST_XDIST_WORKER" in os.environ:
    # Under `-n N` the N workers share the cores: the processes a test starts (lathe train, torchrun ranks) get
    # their share of threads, not every core each (torch's thread pools spin: oversubscribed, runs crawl).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


ORDER = Path(__file__).with_name("suite_order.txt")


def longest_first(items: list) -> None:
    """Reorder `items` in place: whole files, in tests/suite_order.txt's order, then the files it does not list
    (new ones) in their collected order; the tests inside a file keep their order (module fixtures stay shared)."""
    listed = [line.split("#")[0].strip() for line in ORDER.read_text().splitlines()] if ORDER.is_file() else []
    rank = {name: at for at, name in enumerate(name for name in listed if name)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


# Test files that share a session fixture which launches processes (tests/train/conftest.py's fsdp_ranks: one
# torchrun launch, ~27 CPU s): `--dist loadfile` hands them to one worker as one unit, or each worker would launch it.
SAME_WORKER = {"tests/train/test_chunked_loss.py": "tests/train/test_fsdp.py"}


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's file scheduling, with SAME_WORKER's files in one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return SAME_WORKER.get(file, file)

    return Scheduling(config, log)


_frozen_for = [None]


def pytest_collection_finish(session):
    """Freeze what collection created (torch, transformers, peft, the test modules: ~10^6 objects, alive for the
    whole session) out of the garbage collector's full scans. transformers.Trainer, the reference in the comparison
    tests, calls gc.collect() at every train() (accelerate's free_memory), and each full scan of a worker's
    objects took ~0.35 CPU s: about 40% of the in-process tests' time went there. Collections still run and free
    what the tests create; only objects that live before the first test are never scanned again."""
    _freeze()
    _frozen_for[0] = ""


def pytest_runtest_logstart(nodeid, location):
    """The same at the start of each test file, for the modules the previous file imported lazily (its module
    fixtures are finalized by then). Only where the tests run: xdist's controller only reports them."""
    module = nodeid.split("::")[0]
    if _frozen_for[0] is not None and module != _frozen_for[0]:
        _frozen_for[0] = module
        _freeze()


def _freeze() -> None:
    gc.collect()  # the garbage goes first: a frozen cycle is never freed
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """Tests marked `hf` compare against transformers, `gpu` ones need a CUDA device: skip them cleanly
    where it is missing."""
    longest_first(items)
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


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the README's command): one worker per CPU this process may use, counting logical CPUs (a 2-vCPU
    machine can report one physical core), and at most one per 4 GiB of available memory (a test that launches
    two ranks holds about 2.5 GiB). PYTEST_XDIST_AUTO_NUM_WORKERS still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        import psutil

        by_memory = psutil.virtual_memory().available // (4 << 30)
    except ImportError:
        by_memory = cpus
    return max(1, min(cpus, by_memory))
