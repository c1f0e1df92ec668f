"""llama.cpp, ggml and common/ messages as records of the ``eagle3`` logger.

Quiet by default: the logger has a NullHandler and level WARNING, so only
warnings and errors reach an application's handlers (or Python's last-resort
stderr output). ``logging.getLogger("eagle3").setLevel(logging.DEBUG)`` with
a handler shows everything llama.cpp says.
"""

from __future__ import annotations

import atexit
import logging
import threading

from eagle3 import _core

logger = logging.getLogger("eagle3")
logger.addHandler(logging.NullHandler())
if logger.level == logging.NOTSET:
    logger.setLevel(logging.WARNING)

# ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5
_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}

# common/ threshold: 4 formats its trace lines (statistics included); the
# logger's level decides what is kept.
_COMMON_VERBOSITY = 4


# The last error lines llama.cpp logged on each thread, to explain failures
# that llama.cpp only reports as a NULL or an error code.
_recent = threading.local()


def _sink(level: int, line: str) -> None:
    py_level = _LEVELS.get(level, logging.INFO)
    if py_level >= logging.ERROR:
        errors = getattr(_recent, "errors", None)
        if errors is None:
            errors = _recent.errors = []
        errors.append(line.strip())
        del errors[:-8]
    if logger.isEnabledFor(py_level):
        logger.log(py_level, "%s", line.rstrip())


def take_errors() -> str:
    """The error lines llama.cpp logged on this thread since the last call, joined."""
    errors = getattr(_recent, "errors", None) or []
    _recent.errors = []
    return "; ".join(errors)


def install() -> None:
    _core.set_log_sink(_sink, _COMMON_VERBOSITY, take_errors)
    # no Python callbacks while the interpreter shuts down
    atexit.register(_core.set_log_sink, None, -1)
