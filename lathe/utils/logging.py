"""transformers.utils.logging for lathe's library logger ("lathe"): `set_verbosity_info()`,
`get_logger()`, handlers and formats, so a script that tunes transformers' logging tunes lathe's after
its import changes. TrainingArguments.log_level goes through `set_verbosity` too.

Unlike transformers, importing lathe configures nothing and "lathe" propagates to the root logger
(an application's logging setup sees lathe's records). A default stderr handler is added when a level
is set and neither "lathe" nor the root logger has a handler, so the level set is what gets printed."""

from __future__ import annotations

import logging
import threading
from logging import CRITICAL, DEBUG, ERROR, FATAL, INFO, NOTSET, WARN, WARNING  # noqa: F401

LIBRARY = "lathe"
log_levels = {"detail": DEBUG, "debug": DEBUG, "info": INFO, "warning": WARNING, "error": ERROR, "critical": CRITICAL}

_lock = threading.Lock()
_default_handler: logging.Handler | None = None


def _library_logger() -> logging.Logger:
    return logging.getLogger(LIBRARY)


def get_log_levels_dict() -> dict[str, int]:
    return log_levels


def get_logger(name: str | None = None) -> logging.Logger:
    """The named logger; without a name, lathe's library logger (transformers: its own)."""
    return logging.getLogger(LIBRARY if name is None else name)


def get_verbosity() -> int:
    """The level lathe's records must reach to be emitted (the effective level of "lathe")."""
    return _library_logger().getEffectiveLevel()


def set_verbosity(verbosity: int) -> None:
    _library_logger().setLevel(verbosity)
    if not _library_logger().handlers and not logging.getLogger().handlers:
        enable_default_handler()  # otherwise Python's last-resort handler would drop everything below WARNING


def set_verbosity_info() -> None:
    set_verbosity(INFO)


def set_verbosity_warning() -> None:
    set_verbosity(WARNING)


def set_verbosity_debug() -> None:
    set_verbosity(DEBUG)


def set_verbosity_error() -> None:
    set_verbosity(ERROR)


def enable_default_handler() -> None:
    """Add lathe's stderr handler to "lathe" (one handler, however often this is called)."""
    global _default_handler
    with _lock:
        if _default_handler is None:
            _default_handler = logging.StreamHandler()
        if _default_handler not in _library_logger().handlers:
            _library_logger().addHandler(_default_handler)


def disable_default_handler() -> None:
    with _lock:
        if _default_handler is not None:
            _library_logger().removeHandler(_default_handler)


def add_handler(handler: logging.Handler) -> None:
    if handler is None:
        raise ValueError("add_handler needs a logging.Handler, got None")
    _library_logger().addHandler(handler)


def remove_handler(handler: logging.Handler) -> None:
    if handler is None or handler not in _library_logger().handlers:
        raise ValueError(f"remove_handler: {handler!r} is not a handler of the {LIBRARY!r} logger")
    _library_logger().removeHandler(handler)


def disable_propagation() -> None:
    _library_logger().propagate = False


def enable_propagation() -> None:
    _library_logger().propagate = True


def enable_explicit_format() -> None:
    """Every handler of "lathe" writes `[LEVEL|file:line] time >> message`, as transformers' format."""
    for handler in _library_logger().handlers:
        handler.setFormatter(logging.Formatter("[%(levelname)s|%(filename)s:%(lineno)s] %(asctime)s >> %(message)s"))


def reset_format() -> None:
    for handler in _library_logger().handlers:
        handler.setFormatter(None)
