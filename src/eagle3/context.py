"""Contexts: a model's KV cache, batch decoding and logits."""

from __future__ import annotations

import os

import numpy as np

from eagle3 import _core, _logging, _state, generation
from eagle3._core import Batch
from eagle3._lifetime import Resource
from eagle3.compat import check_pair
from eagle3._validate import as_int
from eagle3.errors import (ArgumentTypeError, BadSeqIdError, ContextError, Eagle3Error, InvalidArgumentError,
                           SessionStateError, StateError)
from eagle3.model import Model

_CTX_TYPES = ("default", "mtp")


def default_threads() -> int:
    """The CPUs this process may run on (llama.cpp's own default of 4 oversubscribes small machines)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _layer_list(layers) -> list:
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise ArgumentTypeError(f"layers must be a sequence of layer ids, got {type(layers).__name__}")
    layers = list(layers)
    if not layers:
        raise InvalidArgumentError("layers is empty")
    return layers


def _sizes(other: Context | None, n_ctx, n_batch, n_ubatch, n_seq_max) -> tuple[int, int, int, int]:
    """``(n_ctx, n_batch, n_ubatch, n_seq_max)``: a draft context's default to its target's."""
    if other is not None:
        n_ctx = other.n_ctx if n_ctx is None else n_ctx
        n_batch = other.n_batch if n_batch is None else n_batch
        n_ubatch = min(other.n_ubatch, n_batch) if n_ubatch is None else n_ubatch
        n_seq_max = other.n_seq_max if n_seq_max is None else n_seq_max
    n_ctx = as_int(512 if n_ctx is None else n_ctx, "n_ctx", 1)
    n_batch = as_int(min(512, n_ctx) if n_batch is None else n_batch, "n_batch", 1)
    n_ubatch = as_int(n_batch if n_ubatch is None else n_ubatch, "n_ubatch", 1)
    n_seq_max = as_int(1 if n_seq_max is None else n_seq_max, "n_seq_max", 1, _core.MAX_SEQ)
    if n_ubatch > n_batch:
        raise InvalidArgumentError(f"n_ubatch ({n_ubatch}) must be <= n_batch ({n_batch})")
    return n_ctx, n_batch, n_ubatch, n_seq_max


def _threads(other: Context | None, n_threads, n_threads_batch) -> tuple[int, int]:
    """A draft context runs on its target's threads; any other on the CPUs this process may use."""
    if n_threads is None:
        n_threads = other.n_threads if other is not None else default_threads()
    n_threads = as_int(n_threads, "n_threads", 1, 1024)
    if n_threads_batch is None:
        n_threads_batch = other.n_threads_batch if other is not None else n_threads
    return n_threads, as_int(n_threads_batch, "n_threads_batch", 1, 1024)


def _check_model_fits(model: Model, ctx_type: str, other: Context | None) -> None:
    """Refuse a context llama.cpp would build a broken graph for (it aborts); warn about a
    model whose logits are not next-token predictions."""
    for reason in model._generation_warnings:
        _logging.logger.warning("Context over %s: %s", model.path, reason)
    if ctx_type == "mtp" and (model.n_layer_nextn <= 0 or not model.load_mtp):
        raise ContextError(
            f"ctx_type='mtp' needs a model with NextN (MTP) layers loaded with load_mtp=True; {model.path} "
            f"has {model.n_layer_nextn} NextN layers" + ("" if model.load_mtp else " and was loaded without them"))
    if model.architecture == "eagle3":
        if other is not None:
            # llama.cpp builds the draft graph right away: a misfit aborts
            check_pair(other.model, model).raise_if_incompatible()
        elif not {"token_embd.weight", "output.weight"} <= model._tensors.keys():
            raise ContextError("this EAGLE-3 draft borrows the target's embeddings or output head: create "
                               "its context with other=target_ctx")


class Context(Resource):
    """A llama.cpp context over a :class:`Model`.

    ``Context(model, n_ctx=512, n_batch=512, n_ubatch=None, n_seq_max=1,
    ctx_type="default", other=None, n_threads=None, flash_attn=True)``.
    ``n_threads`` defaults to the CPUs this process may use; a draft context
    (``other=``) defaults to its target's threads. Sizes llama.cpp changes (it
    has a minimum ``n_ctx`` and splits it between sequences) are the
    attributes' values, and a warning says so.

    ``flash_attn`` (on by default, as llama.cpp's "auto" picks on a CPU) fuses
    attention into one kernel: a one-token pass costs markedly less than
    with ``flash_attn=False``. eagle3's build gives it one kernel for every
    pass size (stock ggml splits long caches for one-token passes and tiles
    many-token passes, each rounding in its own way), so a verify pass
    gives each token its one-token logits either way.

    A draft context for an EAGLE-3 session is created against its target
    with ``other=target_ctx`` (llama.cpp's ``ctx_other``: the draft borrows
    the target's embeddings and output head); its sizes then default to the
    target's. An MTP draft context is ``Context(model, ctx_type="mtp")`` over
    the target's own model.

    The context keeps its model alive; closing the context first closes the
    sessions and draft contexts that depend on it.
    """

    _kind = "context"
    _plain: _core.Pair | None = None  # see _plain_pair

    def __init__(self, model: Model, n_ctx: int | None = None, n_batch: int | None = None,
                 n_ubatch: int | None = None, n_seq_max: int | None = None, ctx_type: str = "default",
                 other: Context | None = None, n_threads: int | None = None,
                 n_threads_batch: int | None = None, flash_attn: bool = True) -> None:
        if not isinstance(model, Model):
            raise ArgumentTypeError(f"model must be an eagle3.Model, got {type(model).__name__}")
        if ctx_type not in _CTX_TYPES:
            raise InvalidArgumentError(f"ctx_type must be one of {_CTX_TYPES}, got {ctx_type!r}")
        if other is not None and not isinstance(other, Context):
            raise ArgumentTypeError(f"other must be an eagle3.Context, got {type(other).__name__}")
        if not isinstance(flash_attn, bool):
            raise ArgumentTypeError(f"flash_attn must be a bool, got {type(flash_attn).__name__}")
        model_handle = model._live()
        other_handle = other._live() if other is not None else None
        # a draft context shares its target's lock: a session drives both
        super().__init__(lock=other._lock if other is not None else None)
        sizes = _sizes(other, n_ctx, n_batch, n_ubatch, n_seq_max)
        _check_model_fits(model, ctx_type, other)
        n_threads, n_threads_batch = _threads(other, n_threads, n_threads_batch)
        self.model = model
        self.other = other
        self.ctx_type = ctx_type
        self._handle = h = _core.ContextHandle(model_handle, *sizes, ctx_type == "mtp", other_handle, n_threads,
                                               n_threads_batch, flash_attn)
        self.n_ctx: int = h.n_ctx
        self.n_batch: int = h.n_batch
        self.n_ubatch: int = h.n_ubatch
        self.n_seq_max: int = h.n_seq_max
        for name, asked in zip(("n_ctx", "n_batch", "n_ubatch", "n_seq_max"), sizes):
            if getattr(self, name) != asked:
                _logging.logger.warning("Context: llama.cpp made %s %d (asked for %d); the context reports "
                                        "the real value", name, getattr(self, name), asked)
        model._adopt(self)
        if other is not None:
            other._adopt(self)

    @property
    def n_threads(self) -> int:
        """Threads of one-token decodes."""
        return self._live().n_threads

    @property
    def n_threads_batch(self) -> int:
        """Threads of multi-token decodes (prompts, verification)."""
        return self._live().n_threads_batch

    @property
    def tokens_decoded(self) -> int:
        """Tokens llama.cpp has run through this context since it was created: every
        decode, a session's drafting and ``process`` on a draft context included."""
        return self._live().tokens_decoded

    def cancel(self) -> None:
        """Stop what runs on this context: a generation (of this context or of a session over
        it) ends at its next check, its live sequences with ``finish_reason="cancelled"`` and
        the tokens they have; a decode raises :class:`DecodeError`. Callable from any thread;
        a call that starts later is not affected."""
        self._cancel()

    def _cancel(self) -> None:
        handle = self._handle
        if handle is not None:
            handle.cancel_running()
        super()._cancel()

    def decode(self, batch: Batch) -> None:
        """Decode ``batch``; raises :class:`DecodeError` (with the reason) on failure.

        Positions of each sequence must continue from what the cache holds.
        The GIL is released while llama.cpp computes.
        """
        if not isinstance(batch, Batch):
            raise ArgumentTypeError(f"batch must be an eagle3.Batch, got {type(batch).__name__}")
        with self._lock:
            self._live().decode(batch)

    def logits(self, i: int = -1) -> np.ndarray:
        """Logits of entry ``i`` of the last decoded batch (``-1``: its last output).

        A read-only float32 view of llama.cpp's own buffer (no copy) whose
        base object keeps the context's memory alive. The values are those of
        the last decode: the next decode overwrites them, so copy what you
        want to keep (``np.array(view)``).
        """
        with self._lock:
            return self._live().logits(as_int(i, "i"))

    def argmax(self, i: int = -1) -> int:
        """Greedy token of entry ``i`` of the last decoded batch, without creating an array."""
        with self._lock:
            return self._live().argmax(as_int(i, "i"))

    def capture_layer_inputs(self, layers) -> None:
        """Capture the hidden state entering each of ``layers`` (layer ids,
        ``0 <= id < model.n_layer``) at every later decode, for every token of
        the batch: the features an EAGLE-3 head reads. Capture stays on for
        the context's life (as an EAGLE-3 session leaves it on its target).

        Raises :class:`InvalidArgumentError` for a layer the model lacks or an
        architecture whose graph does not record its layers' inputs.
        """
        layers = [as_int(lid, "layer id") for lid in _layer_list(layers)]
        with self._lock:
            self._live().capture_layer_inputs(layers)

    def layer_inputs(self, layers) -> np.ndarray:
        """The captured inputs of ``layers`` at the last decode, one row per
        batch entry: a new float32 array ``[len(layers), n_tokens, n_embd]``.

        Read after a batch of one sequence (llama.cpp orders the tokens of
        several sequences its own way); the layers must have been captured
        before that decode (:meth:`capture_layer_inputs`).
        """
        layers = [as_int(lid, "layer id") for lid in _layer_list(layers)]
        with self._lock:
            return self._live().layer_inputs(layers)

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        """Remove positions ``[p0, p1)`` of a sequence (``p1 < 0``: to the end;
        ``seq_id = -1``: every sequence). Returns False when the memory cannot
        remove a partial range."""
        with self._lock:
            return bool(self._live().seq_rm(as_int(seq_id, "seq_id"), as_int(p0, "p0"), as_int(p1, "p1")))

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position held for a sequence, -1 if it is empty."""
        with self._lock:
            return self._live().seq_pos_max(as_int(seq_id, "seq_id"))

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position held for a sequence, -1 if it is empty."""
        with self._lock:
            return self._live().seq_pos_min(as_int(seq_id, "seq_id"))

    def clear(self) -> None:
        """Empty the KV cache of every sequence."""
        with self._lock:
            self._live().clear()

    def save_state(self, seq_id: int | None = None) -> bytes:
        """The KV cache of sequence ``seq_id`` (``None``: llama.cpp's whole state of the
        context, its last logits included) as bytes for :meth:`load_state`, with a header
        that names the model and the context's sizes and a checksum. See docs/state.md."""
        seq = None if seq_id is None else as_int(seq_id, "seq_id")
        with self._lock:
            h = self._live()
            if seq is not None:
                self._check_seq_id(seq)
            kv = h.state_get(-1 if seq is None else seq)
            return _state.pack({"kind": "context", "seq_id": seq, **_state.context_identity(self)}, [kv])

    def load_state(self, data, seq_id: int | None = None) -> None:
        """Restore what :meth:`save_state` returned, on a context over the same model with the
        same sizes. A sequence's state loads into ``seq_id`` (``None``: the sequence it was
        saved from), replacing what that sequence held; a whole-context state replaces
        everything. Bytes that are empty, truncated, corrupted or of another model or
        context raise :class:`StateError` and leave the context as it was."""
        seq = None if seq_id is None else as_int(seq_id, "seq_id")
        description, parts = _state.unpack(data, "Context")
        _state.expect(description, "kind", "context", "context")
        for key, value in _state.context_identity(self).items():
            _state.expect(description, key, value, "context")
        saved = description.get("seq_id")
        if len(parts) != 1 or not len(parts[0]) or not (saved is None or isinstance(saved, int)):
            raise StateError("the state's description does not fit a context's state")
        if saved is None and seq is not None:
            raise StateError("this is the state of a whole context: load it without seq_id")
        target = -1 if saved is None else (saved if seq is None else seq)
        with self._lock:
            h = self._live()
            if target >= 0:
                self._check_seq_id(target)
            try:
                h.state_set(parts[0], target)
            except (InvalidArgumentError, Eagle3Error) as e:
                if isinstance(e, (StateError, SessionStateError)):
                    raise
                raise StateError(f"llama.cpp refused the state: {e}") from None

    def _check_seq_id(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.n_seq_max:
            raise BadSeqIdError(seq_id, self.n_seq_max)

    def generate(self, prompt, max_new_tokens: int = 128, sampling=None, **kwargs) -> generation.Generation:
        """Plain decoding (no speculation) with the sampler of ``Eagle3Session.generate``,
        one token per target pass, in C without the GIL. Arguments as there (no ``n_draft_max``),
        prefix reuse included: the prefix of ``prompt`` that this context holds from its last
        plain generation is kept, unless another call changed the cache since."""
        return self.generate_batch([prompt], max_new_tokens, sampling, **kwargs)[0]

    def generate_batch(self, prompts, max_new_tokens: int = 128, sampling=None,
                       **kwargs) -> generation.BatchGeneration:
        """Plain decoding of several prompts at once, one per sequence (at most ``n_seq_max``)."""
        if isinstance(prompts, str) or "n_draft_max" in kwargs:
            raise ArgumentTypeError("prompts is a list of prompts; plain decoding has no n_draft_max")
        s = generation.settings(max_new_tokens, sampling, n_draft_max=None, **kwargs)
        prompts = [generation.prompt_tokens(self.model, p) for p in prompts]
        with self._lock:
            return generation.run(self._plain_pair(), self.model, prompts, s)

    def _plain_pair(self) -> _core.Pair:
        """The pair plain generations run on: one per context, so that it knows what the
        cache holds after its last generation (a fresh pair would decode every prompt whole)."""
        if self._plain is None:
            self._plain = _core.Pair(self._live())
        return self._plain

    def close(self) -> None:
        super().close()
        self._plain = None  # the pair holds the llama.cpp context: let it go now

    def __repr__(self) -> str:
        if self.closed:
            return f"Context(closed, model={self.model.path!r})"
        kind = f", ctx_type={self.ctx_type!r}" if self.ctx_type != "default" else ""
        draft = ", other=<target>" if self.other is not None else ""
        return (f"Context(n_ctx={self.n_ctx}, n_batch={self.n_batch}, n_seq_max={self.n_seq_max}{kind}{draft}, "
                f"model={self.model.path!r})")
