"""Ownership rules shared by every eagle3 object.

A ``Resource`` owns one low-level handle. It keeps strong references to the
resources it depends on (a context to its model, a session to its contexts)
and tracks the resources that depend on it weakly. ``close()`` closes those
dependents first, newest first, then drops the handle; llama.cpp's objects
are freed when their last handle reference goes, which the handles arrange
in the order llama.cpp needs. ``close()`` is idempotent, every object is a
context manager, and any use after ``close()`` raises :class:`ClosedError`.
Resources cannot be copied or pickled (a copy would share the handle).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from eagle3.errors import ArgumentTypeError, ClosedError


class Resource:
    _kind = "object"

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self._handle: Any = None
        self._lock = lock if lock is not None else threading.RLock()
        self._dependents: weakref.WeakValueDictionary[int, Resource] = weakref.WeakValueDictionary()
        self._next_dependent = 0

    def _adopt(self, dependent: Resource) -> None:
        """Register ``dependent`` to be closed before this object."""
        with self._lock:
            self._dependents[self._next_dependent] = dependent
            self._next_dependent += 1

    def _live(self) -> Any:
        handle = self._handle
        if handle is None:
            raise ClosedError(f"this {self._kind} is closed")
        return handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _cancel(self) -> None:
        """Stop what runs on this object and its dependents now, without their locks."""
        for dependent in list(self._dependents.values()):
            dependent._cancel()

    def close(self) -> None:
        """Close the dependents of this object, then free it. Safe to call twice.

        What runs on it in another thread (a generation, a decode) is cancelled
        first, so close() waits for the end of a round, not of a generation."""
        self._cancel()
        with self._lock:
            if self._handle is None:
                return
            for key in sorted(self._dependents.keys(), reverse=True):
                dependent = self._dependents.get(key)
                if dependent is not None:
                    dependent.close()
            self._handle = None

    def _refuse_copy(self, *args: Any) -> Any:
        raise ArgumentTypeError(
            f"an eagle3 {self._kind} owns llama.cpp memory and cannot be copied or pickled; "
            f"create another one (in another process: from the same files)")

    __copy__ = __deepcopy__ = __reduce__ = __reduce_ex__ = _refuse_copy

    def __enter__(self):
        self._live()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
