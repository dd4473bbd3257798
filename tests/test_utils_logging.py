"""lathe.utils.logging: transformers.utils.logging's functions for lathe's library logger, so a script's
`set_verbosity_info()` / `get_logger()` / handler calls work on lathe after its import changes."""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys

import pytest

from lathe import Trainer
from lathe.utils import logging as lathe_logging
from tests.train.trainer_helpers import Regression, regression_items, training_args


@pytest.fixture(autouse=True)
def restore_library_logger():
    library = logging.getLogger("lathe")
    level, handlers, propagate = library.level, list(library.handlers), library.propagate
    yield
    library.setLevel(level)
    library.handlers[:] = handlers
    library.propagate = propagate


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def train_and_capture(tmp_path, **options) -> list[str]:
    handler = Lines()
    lathe_logging.add_handler(handler)
    try:
        args = training_args(tmp_path, max_steps=2, **options)
        Trainer(model=Regression(), args=args, train_dataset=regression_items(8)).train()
    finally:
        lathe_logging.remove_handler(handler)
    return handler.messages


def test_get_logger_without_a_name_is_the_library_logger():
    assert lathe_logging.get_logger() is logging.getLogger("lathe")
    assert lathe_logging.get_logger("lathe.train.trainer") is logging.getLogger("lathe.train.trainer")


def test_verbosity_decides_what_the_trainer_logs_and_log_level_overrides_it(tmp_path):
    """As transformers' test_log_level: the summary appears at info, not at warning; log_level="debug"
    shows it, log_level="error" hides it, whatever the verbosity was."""
    lathe_logging.set_verbosity_warning()
    assert lathe_logging.get_verbosity() == logging.WARNING
    assert not any("Running training" in line for line in train_and_capture(tmp_path / "a"))
    lathe_logging.set_verbosity_info()
    assert lathe_logging.get_verbosity() == logging.INFO
    assert "***** Running training *****" in train_and_capture(tmp_path / "b")
    assert not any("Running training" in line for line in train_and_capture(tmp_path / "c", log_level="error"))
    assert lathe_logging.get_verbosity() == logging.ERROR  # log_level sets the library level, as in transformers
    assert "***** Running training *****" in train_and_capture(tmp_path / "d", log_level="debug")
    assert lathe_logging.get_verbosity() == logging.DEBUG


def test_remove_handler_refuses_a_handler_it_does_not_hold():
    with pytest.raises(ValueError, match="not a handler of the 'lathe' logger"):
        lathe_logging.remove_handler(logging.StreamHandler())
    with pytest.raises(ValueError, match="needs a logging.Handler"):
        lathe_logging.add_handler(None)


def test_with_no_logging_configured_set_verbosity_prints_and_explicit_format_applies():
    """A script with no logging setup: set_verbosity_info() alone makes info lines reach stderr (Python's
    last-resort handler would drop them); enable_explicit_format() is transformers' format; propagation
    switches; disable_default_handler silences."""
    script = (
        "from lathe.utils import logging\n"
        "logging.set_verbosity_info()\n"
        "logging.get_logger('lathe.demo').info('plain line')\n"
        "logging.enable_explicit_format()\n"
        "logging.get_logger('lathe.demo').info('explicit line')\n"
        "logging.reset_format()\n"
        "logging.disable_default_handler()\n"
        "logging.get_logger('lathe.demo').info('silenced line')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    lines = done.stderr.splitlines()
    assert lines[0] == "plain line"
    assert lines[1].startswith("[INFO|<string>:5] ") and lines[1].endswith(" >> explicit line")
    assert len(lines) == 2


def test_propagation_switches_as_transformers():
    lathe_logging.disable_propagation()
    assert logging.getLogger("lathe").propagate is False
    lathe_logging.enable_propagation()
    assert logging.getLogger("lathe").propagate is True
    assert lathe_logging.get_log_levels_dict()["info"] == logging.INFO


@pytest.mark.hf
def test_every_function_has_transformers_parameters():
    from transformers.utils import logging as theirs

    names = [n for n, v in vars(lathe_logging).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert len(names) == 16
    for name in names:
        assert list(inspect.signature(getattr(lathe_logging, name)).parameters) == list(
            inspect.signature(getattr(theirs, name)).parameters
        ), name
