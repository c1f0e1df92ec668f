"""The eagle3 exception hierarchy.

Every error the package raises derives from :class:`Eagle3Error`; errors
about a wrong value also derive from :class:`ValueError`, errors about a
wrong type from :class:`TypeError`. Errors from llama.cpp carry the reason
it logged.
"""

from __future__ import annotations

__all__ = [
    "Eagle3Error",
    "SessionInitError",
    "IncompatiblePairError",
    "ProcessError",
    "BadSeqIdError",
    "InvalidConfigError",
    "ModelLoadError",
    "ContextError",
    "DecodeError",
    "RemoteError",
    "BatchError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "InvalidIndexError",
    "SessionStateError",
    "StateError",
    "ClosedError",
]


class Eagle3Error(Exception):
    """Base class of every error raised by eagle3."""


class SessionInitError(Eagle3Error):
    """The speculative session could not be created.

    The most common cause is a draft that is not a valid EAGLE-3 draft model
    for this target, or contexts that do not fit together.
    """

    default_messages = {
        "eagle3": "failed to create EAGLE-3 draft session — check that `draft` is a context over a valid EAGLE-3 "
                  "draft model (3 extract layers) built from the same target",
        "mtp": "failed to create MTP draft session — check that `draft` is a context with ctx_type='mtp' over a "
               "target model that has NextN layers",
    }
    default_message = default_messages["eagle3"]

    def __init__(self, reason: str | None = None, kind: str = "eagle3"):
        self.reason = reason
        self.kind = kind
        message = self.default_messages.get(kind, f"failed to create the {kind} speculative session")
        super().__init__(f"{message}: {reason}" if reason else message)


class IncompatiblePairError(SessionInitError, ValueError):
    """The draft does not fit the target; ``report`` (a :class:`~eagle3.PairReport`) lists why."""

    def __init__(self, report):
        self.report = report
        super().__init__("; ".join(str(p) for p in report.problems), kind=getattr(report, "kind", "eagle3"))


class ProcessError(Eagle3Error):
    """``process()`` failed on the underlying speculative context."""

    def __init__(self, reason: str | None = None):
        self.reason = reason
        message = "speculative process failed"
        super().__init__(f"{message}: {reason}" if reason else message)


class BadSeqIdError(Eagle3Error, ValueError):
    """A sequence id outside ``[0, n_seq)``; ``seq_id`` and ``n_seq`` say which."""

    def __init__(self, seq_id: int, n_seq: int):
        self.seq_id = seq_id
        self.n_seq = n_seq
        super().__init__(f"sequence id {seq_id} out of range (n_seq = {n_seq})")


class InvalidConfigError(Eagle3Error, ValueError):
    """An invalid session configuration (for example ``n_draft_max <= 0``)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"invalid EAGLE-3 session config: {reason}")


class ModelLoadError(Eagle3Error):
    """A model file could not be loaded."""


class ContextError(Eagle3Error):
    """A context could not be created with the given parameters."""


class DecodeError(Eagle3Error):
    """A batch could not be decoded (bad batch, no KV slot, or a failed computation)."""


class RemoteError(DecodeError):
    """An RPC server the model's layers are on died, closed the connection or answered
    garbage. ``endpoint`` says which. The models that use the server are lost (their
    weights there went with it): close them, and load them again once it runs."""

    def __init__(self, endpoint: str, reason: str):
        self.endpoint = endpoint
        self.reason = reason
        super().__init__(reason if endpoint in reason else f"RPC server {endpoint}: {reason}")


class InvalidArgumentError(Eagle3Error, ValueError):
    """An argument with a value out of range or inconsistent with the object's state."""


class ArgumentTypeError(Eagle3Error, TypeError):
    """An argument of the wrong type."""


class InvalidIndexError(InvalidArgumentError, IndexError):
    """An index that does not name an existing entry (for example logits of a non-output row)."""


class BatchError(InvalidArgumentError):
    """A batch operation with invalid arguments (full batch, bad sequence id, ...)."""


class SessionStateError(Eagle3Error):
    """A session call out of order, for example ``accept()`` without ``draft()``."""


class StateError(Eagle3Error):
    """A saved state that cannot be loaded here: empty, truncated, corrupted, of another
    format version, or saved from other models, context sizes or another kind of session.
    The object it was to load into is left as it was."""


class ClosedError(Eagle3Error):
    """The object (or one it depends on) was closed."""
