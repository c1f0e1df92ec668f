"""Speculative-decoding sessions: every drafter llama.cpp's common/speculative has.

:class:`Eagle3Session` drives **EAGLE-3** speculative decoding
(``COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3`` in llama.cpp): a target model plus
a small, separately trained EAGLE-3 draft model that predicts the next tokens
from hidden states extracted out of the target. :class:`MtpSession` drives
**MTP**, where the draft heads (NextN layers) live inside the target model.
:class:`DraftSession` drafts with a separate small model of the target's
vocabulary (``draft-simple``), and :class:`NgramSession` with no model at all,
from n-grams of the token history (``ngram-simple``, ``ngram-map-k``,
``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache``). All share one lifecycle
and one engine, and differ only in what drafts:

================  ===========================  =======================  =====================  ================
..                ``Eagle3Session``            ``MtpSession``           ``DraftSession``       ``NgramSession``
================  ===========================  =======================  =====================  ================
draft weights     a separate EAGLE-3 model     the target's NextN       a small model of the   none
                                               layers                   same vocabulary
draft context     ``Context(draft_model,       ``Context(target_model,  ``Context(draft_model, none
                  other=target_ctx)``          ctx_type="mtp")``        n_ctx=..., ...)``
================  ===========================  =======================  =====================  ================

The speculative loop, after each decode on the **target** context::

    target.decode(batch)
    session.process(batch)
    drafts = session.draft(0, n_past, last_token)
    # verify drafts on the target, count the accepted ones ...
    session.accept(0, n_accepted)

The session turns on the hidden-state extraction it needs on both contexts
when it is created, so create it before the first target decode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator

import numpy as np

from eagle3 import _core, _logging, _state, generation, stats
from eagle3._core import Batch
from eagle3.compat import check_draft_model, check_pair
from eagle3.generation import BatchGeneration, Generation, TokenStream
from eagle3._lifetime import Resource
from eagle3.context import Context
from eagle3._validate import as_int
from eagle3.errors import (ArgumentTypeError, Eagle3Error, InvalidArgumentError, InvalidConfigError, SessionInitError,
                           StateError)
from eagle3.sampling import SamplingParams
from eagle3.stats import GenerationStats


@dataclasses.dataclass(frozen=True)
class Eagle3SessionConfig:
    """Parameters of a speculative session, as in llama.cpp's
    ``common_params_speculative_draft``.

    ``Eagle3SessionConfig(n_seq, n_draft_max)``; ``n_min`` (default 0) and
    ``p_min`` (default 0.0) via :meth:`with_n_min` and :meth:`with_p_min`.
    """

    n_seq: int = 1
    """Number of concurrent sequences (usually 1)."""
    n_draft_max: int = 3
    """Maximum tokens drafted per :meth:`Eagle3Session.draft` call (``n_max`` upstream)."""
    n_min: int = 0
    """Drafts shorter than this are dropped (``n_min`` upstream)."""
    p_min: float = 0.0
    """Drafting stops when the best candidate's probability falls below this (``p_min`` upstream)."""

    def with_n_min(self, n_min: int) -> Eagle3SessionConfig:
        """A copy with the minimum draft length set."""
        return dataclasses.replace(self, n_min=n_min)

    def with_p_min(self, p_min: float) -> Eagle3SessionConfig:
        """A copy with the draft probability floor set."""
        return dataclasses.replace(self, p_min=p_min)

    def validate(self, kind: str = "eagle3") -> None:
        """Raise :class:`InvalidConfigError` if a value is out of range."""
        def is_int(v: Any) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        for name in ("n_seq", "n_draft_max", "n_min"):
            if not is_int(getattr(self, name)):
                raise InvalidConfigError(f"{name} must be an integer")
        if not isinstance(self.p_min, (int, float, np.floating)) or isinstance(self.p_min, bool):
            raise InvalidConfigError("p_min must be in [0, 1]")
        _core.check_session_config(kind, self.n_seq, self.n_draft_max, self.n_min, float(self.p_min))


def _config(config, n_seq, n_draft_max, n_min, p_min, kind: str) -> Eagle3SessionConfig:
    if config is None:
        config = Eagle3SessionConfig(n_seq, n_draft_max, n_min, p_min)
    elif not isinstance(config, Eagle3SessionConfig):
        raise ArgumentTypeError(f"config must be an Eagle3SessionConfig, got {type(config).__name__}")
    config.validate(kind)
    return config


class _SpeculativeSession(Resource):
    """The lifecycle every drafter shares. A kind of drafter is a subclass that names
    its row of the shim's drafter table (``_session_kind``) and checks its contexts."""

    _kind = "session"
    _session_kind = ""  # a key of _core.SESSION_KINDS
    _label = ""         # in statistics lines

    def __init__(self, target_ctx: Context, draft_ctx: Context, n_seq: int = 1, n_draft_max: int = 3,
                 n_min: int = 0, p_min: float = 0.0, *, config: Eagle3SessionConfig | None = None) -> None:
        self._open(target_ctx, draft_ctx, _config(config, n_seq, n_draft_max, n_min, p_min, self._session_kind))

    def _open(self, target_ctx: Context, draft_ctx: Context | None, config: Eagle3SessionConfig,
              ngram: dict | None = None) -> None:
        contexts = (("target_ctx", target_ctx),) + ((("draft_ctx", draft_ctx),) if ngram is None else ())
        for name, ctx in contexts:
            if not isinstance(ctx, Context):
                raise ArgumentTypeError(f"{name} must be an eagle3.Context, got {type(ctx).__name__}")
        self._check_contexts(target_ctx, draft_ctx)
        super().__init__(lock=target_ctx._lock)
        self.target = target_ctx
        self.draft_ctx = draft_ctx
        self._config = config
        # a draft context of its own (MTP, a draft model) has a lock of its own: the session holds both
        contexts = (target_ctx,) if draft_ctx is None else (target_ctx, draft_ctx)
        locks = tuple(dict.fromkeys(ctx._lock for ctx in contexts))
        with self._lock:
            self._handle = _core.Pair(target_ctx._live(), draft_ctx._live() if draft_ctx is not None else None,
                                      self._session_kind,
                                      (config.n_seq, config.n_draft_max, config.n_min, float(config.p_min)), locks,
                                      ngram)
        self.generation_stats = GenerationStats()
        """The counters of every generate/generate_batch call of this session, summed."""
        for ctx in contexts:
            ctx._adopt(self)

    def _check_contexts(self, target_ctx: Context, draft_ctx: Context | None) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def _locked(self) -> Iterator[_core.Pair]:
        """The pair, with the locks of both contexts held (and the session still open then)."""
        with self._live():
            yield self._live()

    def cancel(self) -> None:
        """End the running generation at its next check (between rounds, or inside the
        target's pass): its live sequences finish with ``finish_reason="cancelled"`` and keep
        their tokens. Callable from any thread; a generation that starts later is not affected."""
        self.target._cancel()

    # -- configuration -----------------------------------------------------

    @property
    def config(self) -> Eagle3SessionConfig:
        """The configuration given at construction."""
        return self._config

    @property
    def n_seq(self) -> int:
        return self._config.n_seq

    @property
    def n_draft_max(self) -> int:
        """Maximum tokens per draft."""
        return self._config.n_draft_max

    @property
    def n_min(self) -> int:
        return self._config.n_min

    @property
    def p_min(self) -> float:
        return self._config.p_min

    @property
    def need_embd(self) -> bool:
        """True when the drafter needs post-norm embeddings on the target
        (``llama_set_embeddings``). EAGLE-3 and MTP in this llama.cpp read
        pre-norm hidden states instead, so this is False."""
        return bool(self._live().need_embd)

    @property
    def need_embd_pre_norm(self) -> bool:
        """True when the drafter needs pre-norm hidden states on the target.
        The session turned them on when it was created."""
        return bool(self._live().need_embd_pre_norm)

    # -- the speculative loop ----------------------------------------------

    def begin(self, seq_id: int, prompt) -> None:
        """Optional: call at the start of a generation with the prompt tokens
        just decoded into the target for ``seq_id``."""
        with self._locked() as pair:
            pair.begin(as_int(seq_id, "seq_id"), prompt)

    def process(self, batch: Batch) -> None:
        """Hand the session the batch that was just decoded on the target.

        Call after every successful ``target.decode(batch)`` so the session
        can harvest the hidden states it drafts from. Raises
        :class:`ProcessError` if the draft side fails, and
        :class:`SessionStateError` for a batch that is not the one just decoded.
        """
        if not isinstance(batch, Batch):
            raise ArgumentTypeError(f"batch must be an eagle3.Batch, got {type(batch).__name__}")
        with self._locked() as pair:
            pair.process(batch)

    def draft(self, seq_id: int, n_past: int, id_last: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Draft up to :attr:`n_draft_max` tokens for ``seq_id``.

        ``n_past`` is the number of tokens in the target's KV cache for the
        sequence; ``id_last`` the last token sampled on the target (not yet
        decoded). Returns an int32 array; the C code writes straight into its
        buffer (``out``, if given, else a new array: the result is a view of it).
        """
        with self._locked() as pair:
            return pair.draft(as_int(seq_id, "seq_id"), as_int(n_past, "n_past"), as_int(id_last, "id_last"), out)

    def draft_logits(self) -> np.ndarray:
        """The draft's logits (float32, one per target token id; -inf where a ``d2t`` draft
        vocabulary has no entry) at the last step of the latest :meth:`draft`: the step
        that chose the last drafted token when the draft stopped at its length limit (with
        ``p_min``, possibly the step after it, whose token was dropped). A copy; available
        until the next call on the session or its contexts.

        With ``n_draft_max=1`` these are the draft's first-step logits given the target's
        hidden states: what a conversion check compares with the checkpoint's own forward
        pass."""
        with self._locked() as pair:
            return pair.draft_logits()

    def draft_many(self, seq_ids, n_past, id_last) -> tuple[np.ndarray, np.ndarray]:
        """Draft for several sequences in one call.

        Returns ``(tokens, lengths)``: row ``k`` of the int32 matrix ``tokens``
        holds ``lengths[k]`` drafted tokens for ``seq_ids[k]``.
        """
        with self._locked() as pair:
            return pair.draft_many(seq_ids, n_past, id_last)

    def accept(self, seq_id: int, n_accepted: int) -> None:
        """Report how many tokens of the last draft of ``seq_id`` the target
        accepted (0 when every draft token was rejected)."""
        with self._locked() as pair:
            pair.accept(as_int(seq_id, "seq_id"), as_int(n_accepted, "n_accepted"))

    # -- whole generations, looped in C -------------------------------------

    def _generate(self, prompts, max_new_tokens, kwargs) -> BatchGeneration:
        s = generation.settings(max_new_tokens, **kwargs)
        model = self.target.model
        tokens = [generation.prompt_tokens(model, p) for p in prompts]
        with self._locked() as pair:
            result = generation.run(pair, model, tokens, s)
        self.generation_stats = self.generation_stats + result.stats
        return result

    def generate(self, prompt, max_new_tokens: int = 128, sampling: SamplingParams | None = None, *,
                 stop_tokens=(), stop_strings=(), n_draft_max: int | str | None = None, logprobs: int = 0,
                 trace: bool = False, reuse: bool = True, json_schema: dict | None = None,
                 **sampling_overrides) -> Generation:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` (text or token ids) on sequence 0.

        The whole draft, verify, process, accept and trim loop runs inside the
        extension without the GIL. ``temperature=0`` is greedy (the result is
        the target's own greedy decoding); otherwise tokens are sampled from
        the target's distribution, losslessly.

        ``sampling`` (:class:`SamplingParams`; greedy when omitted) is llama.cpp's sampler
        chain; any of its fields given as a keyword (``temperature=0.7``, ``seed=1``, ...)
        overrides it. In order: ``logit_bias`` ({token: bias}; ``-inf`` bans a token), the
        penalties over the last ``penalty_last_n`` tokens (the prompt's included; -1: the
        whole context), ``grammar`` (GBNF, rule ``root``) or ``json_schema`` (a dict, turned
        into a grammar by llama.cpp's common/json-schema-to-grammar), then top-k, typical-p,
        top-p, min-p and temperature. A grammar applies to the target's
        verification: every emitted token obeys it, and drafted tokens it
        forbids count as rejected.

        ``verify`` chooses how drafts are checked at temperature > 0 (greedy is
        always exact); both sample the target's own distribution.
        ``"rejection"`` (the default: it keeps more drafts and is the faster,
        bench/verification.py) draws the drafts from the draft's own
        distribution q (the same transforms, without penalties or grammar) and
        keeps each with probability min(1, p/q), resampling a rejected position
        from max(0, p - q); a seed's tokens differ from plain sampling's.
        ``"match"`` keeps drafted tokens while they equal the target's own
        samples, so a seed gives the same tokens with and without speculation.

        ``logprobs=k`` fills :attr:`Generation.logprobs` and the ``k`` best
        alternatives; ``trace=True`` records every round (drafted tokens, the
        draft's probability of each, how many were kept, timings) in
        :attr:`Generation.trace`.

        ``n_draft_max`` caps the draft length. ``"auto"`` picks, as it runs,
        the length that yields the most tokens per second from this session's
        measured round costs and acceptance, down to plain decoding (no
        drafts) for the rest of the generation when no length pays
        (``stats.n_plain_rounds`` counts those rounds; the sequence's draft
        state is then reset). The session keeps what it measured for its next
        generations.

        Prefix reuse: the longest prefix of ``prompt`` that the contexts already hold
        (from this session's last generation on the sequence, or a loaded state) is kept
        and only the rest is decoded, so ``generate(prompt + output, n)`` continues a
        generation at the cost of its new tokens; ``stats.n_reused`` counts the kept
        tokens. The output is the same as without reuse. ``reuse=False`` decodes the
        whole prompt (the sequence's cache is cleared first). See docs/state.md.
        """
        kwargs = dict(sampling=sampling, stop_tokens=stop_tokens, stop_strings=stop_strings,
                      n_draft_max=n_draft_max, logprobs=logprobs, trace=trace, reuse=reuse, json_schema=json_schema,
                      **sampling_overrides)
        return self._generate([prompt], max_new_tokens, kwargs)[0]

    def generate_batch(self, prompts, max_new_tokens: int = 128, sampling: SamplingParams | None = None,
                       **kwargs) -> BatchGeneration:
        """Generate for several prompts at once, one per sequence (at most ``n_seq``).

        Each round verifies every live sequence's drafts in one target batch;
        sequences finish independently. Arguments as :meth:`generate`. The prefix all
        prompts share is decoded once, on one sequence, and copied to the others
        (``llama_memory_seq_cp``); each sequence also keeps what its caches hold of its
        own prompt (``stats.n_reused`` per sequence). Each
        :class:`Generation` holds its sequence's own counters; the result's
        ``stats`` those of the whole call.
        """
        if isinstance(prompts, str):
            raise ArgumentTypeError("prompts is a list of prompts")
        return self._generate(list(prompts), max_new_tokens, dict(sampling=sampling, **kwargs))

    def stream(self, prompt, max_new_tokens: int = 128, sampling: SamplingParams | None = None, *,
               text: bool = False, **kwargs) -> TokenStream:
        """Like :meth:`generate`, but yields each token as soon as it is accepted (an int), or
        with ``text=True`` the text as it is produced (strs that never end inside a UTF-8
        character; joined, they are the generation's text, spaces included).

        The returned iterator's ``generation`` holds the :class:`Generation`
        once it is exhausted. Between rounds the contexts are free: a call
        that uses them in the meantime ends the stream with SessionStateError.
        """
        if not isinstance(text, bool):
            raise ArgumentTypeError(f"text must be a bool, got {type(text).__name__}")
        s = generation.settings(max_new_tokens, sampling, **kwargs)
        model = self.target.model
        tokens = generation.prompt_tokens(model, prompt)
        rounds = generation.stream(self._live(), model, tokens, s, self._live)
        if text:
            return TokenStream(generation.stream_text(model, tokens, rounds))
        return TokenStream(generation.one_by_one(rounds))

    # -- state -------------------------------------------------------------

    def _state_identity(self) -> dict[str, Any]:
        return {"kind": "session", "session_kind": self._session_kind, "n_seq": self.n_seq,
                "target": _state.context_identity(self.target),
                "draft": _state.context_identity(self.draft_ctx) if self.draft_ctx is not None else None}

    def save_state(self) -> bytes:
        """Everything a later :meth:`generate` goes on from, as bytes for :meth:`load_state`:
        for each sequence the target's and the draft context's KV caches, the drafter's own
        state (EAGLE-3's pending boundary row, MTP's pending hidden row, the token history the
        n-gram drafters search) and the tokens the caches hold (what prefix reuse compares a
        new prompt with). A header names the models, the contexts' sizes and the session kind,
        and a checksum covers it all. Counters are not part of it. See docs/state.md."""
        with self._locked() as pair:
            parts, seqs = [], []
            for seq in range(self.n_seq):
                tgt, dft, spec, held, in_step = pair.seq_state(seq)
                parts += [tgt, dft or b"", spec, b"" if held is None else held.astype("<i4").tobytes()]
                seqs.append({"held": -1 if held is None else len(held), "in_step": in_step})
            return _state.pack({**self._state_identity(), "seqs": seqs}, parts)

    def load_state(self, data) -> None:
        """Restore what :meth:`save_state` returned, into this session or a fresh one over the
        same models with contexts of the same sizes: the next :meth:`generate` of the saved
        prompt and output goes on exactly as the saving session would have. Bytes that are
        empty, truncated, corrupted or of another pair, context size or session kind raise
        :class:`StateError` and change nothing; the session stays usable."""
        description, parts = _state.unpack(data, type(self).__name__)
        for key, value in self._state_identity().items():
            _state.expect(description, key, value, "session")
        seqs = description.get("seqs")
        if not isinstance(seqs, list) or len(seqs) != self.n_seq or len(parts) != 4 * self.n_seq:
            raise StateError("the state's description does not fit this session's sequences")
        n_vocab = self.target.model.n_vocab
        restore = []
        for seq, info in enumerate(seqs):
            tgt, dft, spec, held = parts[4 * seq:4 * seq + 4]
            n_held = info.get("held") if isinstance(info, dict) else None
            if not isinstance(n_held, int) or isinstance(n_held, bool) or n_held < -1 or \
                    len(held) != 4 * max(n_held, 0) or not len(tgt) or \
                    bool(len(dft)) != (self.draft_ctx is not None) or not _state.spec_state_ok(spec, n_vocab):
                raise StateError(f"the state's part for sequence {seq} is malformed")
            tokens = None if n_held < 0 else np.frombuffer(held, "<i4").astype(np.int32)
            if tokens is not None and len(tokens) and (tokens.min() < 0 or tokens.max() >= n_vocab):
                raise StateError(f"the state's tokens of sequence {seq} are outside this vocabulary")
            restore.append((tgt, dft if self.draft_ctx is not None else None, spec, tokens,
                            bool(info.get("in_step"))))
        with self._locked() as pair:
            pair.ready_for_restore()  # (logits views alive: refused before anything changes)
            try:
                for seq, (tgt, dft, spec, tokens, in_step) in enumerate(restore):
                    pair.set_seq_state(seq, tgt, dft, spec, tokens, in_step)
            except Eagle3Error as e:
                # (checked bytes of the same models: llama.cpp should not refuse them)
                for seq in range(self.n_seq):
                    pair.forget_seq(seq)
                raise StateError(f"llama.cpp refused the state ({e}); the session's sequences are now empty") \
                    from None
            finally:
                pair.restored()

    # -- statistics --------------------------------------------------------

    def _counters(self, seq_id: int | None) -> GenerationStats:
        with self._locked() as pair:
            return GenerationStats(**pair.counters(-1 if seq_id is None else as_int(seq_id, "seq_id")))

    def stats(self, seq_id: int | None = None) -> dict[str, Any]:
        """Counters since creation (or :meth:`reset_stats`), of one sequence or all.

        Keys: ``n_draft_calls``, ``n_drafted``, ``n_seq_rounds`` (accept
        calls; also as ``n_accept_calls``), ``n_accepted``,
        ``n_process_calls``, ``acceptance_rate``, ``mean_accepted_length``
        (tau), ``accepted_per_position`` (int64 array: accept calls that
        accepted more than k tokens), ``acceptance_per_position``,
        ``draft_lengths``, and ``t_draft_s``, ``t_process_s``, ``t_accept_s``.
        The derived figures are defined in :mod:`eagle3.stats`.
        """
        return stats.session_dict(self._counters(seq_id))

    def reset_stats(self) -> None:
        """Zero the session's counters and :attr:`generation_stats`."""
        with self._locked() as pair:
            pair.reset_counters()
            self.generation_stats = GenerationStats()

    def print_stats(self) -> None:
        """Log the speculative statistics (draft and accept counts, timings)
        at INFO level on the ``eagle3`` logger."""
        line = stats.format_line(self._label, self._counters(None))
        _logging.logger.info("%s", line)
        with self._locked() as pair:
            pair.print_upstream_stats()

    def __repr__(self) -> str:
        c = self._config
        state = "closed" if self.closed else "open"
        return (f"{type(self).__name__}(n_seq={c.n_seq}, n_draft_max={c.n_draft_max}, n_min={c.n_min}, "
                f"p_min={c.p_min}, {state})")


class Eagle3Session(_SpeculativeSession):
    """An EAGLE-3 draft session over a target context and an EAGLE-3 draft context.

    ``Eagle3Session(target_ctx, draft_ctx, n_seq=1, n_draft_max=3, n_min=0,
    p_min=0.0)`` or ``Eagle3Session(target_ctx, draft_ctx, config=cfg)``.
    ``target_ctx`` is a default context over the main model; ``draft_ctx`` a
    context over a separate EAGLE-3 draft model trained against that target,
    created with ``other=target_ctx``.

    Raises :class:`SessionInitError` when the pair does not fit (for example
    a draft that is not a valid EAGLE-3 model) and
    :class:`InvalidConfigError` for a bad configuration. The session keeps
    both contexts alive; closing either context closes the session first.
    """

    _session_kind = "eagle3"
    _label = "EAGLE-3"

    def _check_contexts(self, target_ctx: Context, draft_ctx: Context) -> None:
        if draft_ctx.ctx_type != "default":
            raise SessionInitError("an EAGLE-3 draft context has ctx_type='default'")
        check_pair(target_ctx.model, draft_ctx.model).raise_if_incompatible()


class MtpSession(_SpeculativeSession):
    """An MTP draft session: the target's own NextN heads draft the tokens.

    ``MtpSession(target_ctx, mtp_ctx, ...)`` with the same arguments as
    :class:`Eagle3Session`, where ``mtp_ctx = Context(target_model,
    ctx_type="mtp")``.
    """

    _session_kind = "mtp"
    _label = "MTP"

    def _check_contexts(self, target_ctx: Context, draft_ctx: Context) -> None:
        if draft_ctx.ctx_type != "mtp":
            raise SessionInitError("an MTP session needs a draft context created with ctx_type='mtp'", kind="mtp")
        if target_ctx.ctx_type != "default":
            raise SessionInitError("the target context of an MTP session has ctx_type='default'", kind="mtp")


class DraftSession(_SpeculativeSession):
    """A draft-model session: a separate small model of the target's vocabulary drafts
    the tokens (llama.cpp's ``draft-simple``).

    ``DraftSession(target_ctx, draft_ctx, n_seq=1, n_draft_max=3, n_min=0, p_min=0.0)``
    where ``draft_ctx = Context(draft_model, n_ctx=target_ctx.n_ctx,
    n_batch=target_ctx.n_batch, n_seq_max=n_seq, n_threads=...)``: the draft context has
    its own threads and sizes (at least the target's ``n_ctx`` and ``n_batch``, and
    exactly ``n_seq`` sequences). The draft drafts greedily; with ``verify="rejection"``
    its tokens are drawn from its own distribution and kept with probability min(1, p/q).

    The vocabularies are checked the way llama.cpp checks them (the same tokenizer type,
    the same BOS and EOS, sizes within 128 tokens, the same text for every token from id
    5): a draft that does not fit raises :class:`IncompatiblePairError`, whose ``report``
    says why. A drafted token the target's vocabulary lacks ends the draft there.
    """

    _session_kind = "draft"
    _label = "draft model"

    def _check_contexts(self, target_ctx: Context, draft_ctx: Context) -> None:
        if draft_ctx.ctx_type != "default" or target_ctx.ctx_type != "default":
            raise SessionInitError("a draft-model session takes two contexts with ctx_type='default'", kind="draft")
        check_draft_model(target_ctx.model, draft_ctx.model).raise_if_incompatible()


# NgramSession's methods, and the parameters of each, as llama.cpp names them
_NGRAM_METHODS = {
    "simple": ("size_n", "size_m"),
    "map-k": ("size_n", "size_m", "min_hits"),
    "map-k4v": ("size_n", "size_m", "min_hits"),
    "mod": ("n_match", "mod_n_min", "mod_n_max"),
    "cache": ("lookup_cache_static", "lookup_cache_dynamic"),
}


class NgramSession(_SpeculativeSession):
    """An n-gram session: drafts come from the token history itself, with no draft model
    (llama.cpp's n-gram drafters). It pays on text that repeats what came before: code
    edits, quotes, structured output.

    ``NgramSession(target_ctx, method="simple", n_seq=1, n_draft_max=16, n_min=0, **params)``.
    The methods and their parameters (llama.cpp's names and defaults,
    ``_core.NGRAM_DEFAULTS``; its ``--spec-ngram-*`` options):

    - ``"simple"``: the last ``size_n`` tokens (12) are looked up in the history and the
      ``size_m`` tokens (48) that followed the latest match are the draft;
    - ``"map-k"`` / ``"map-k4v"``: a map from ``size_n``-grams to the ``size_m``-grams
      that followed them (k4v keeps up to four), proposed once a key was seen
      ``min_hits`` times (1);
    - ``"mod"``: a hashed table of ``n_match``-grams (24) shared by the sequences, drafts
      of ``mod_n_min`` (48) to ``mod_n_max`` (64) tokens;
    - ``"cache"``: 1- to 4-gram statistics of the history, and optionally of the
      ``lookup_cache_static`` / ``lookup_cache_dynamic`` files ``llama-lookup-create``
      writes (a file that is not one for this vocabulary raises
      :class:`SessionInitError`).

    Drafts are capped at ``n_draft_max`` (``"auto"`` in :meth:`generate` picks the length,
    or plain decoding, as it runs). A proposal is deterministic, so ``verify="rejection"``
    keeps a drafted token x with probability p(x) and otherwise draws from p without x:
    the same as ``"match"``.
    """

    _label = "n-gram"

    def __init__(self, target_ctx: Context, method: str = "simple", n_seq: int = 1, n_draft_max: int = 16,
                 n_min: int = 0, **params) -> None:
        if not isinstance(method, str) or method not in _NGRAM_METHODS:
            raise InvalidArgumentError(f"method must be one of {sorted(_NGRAM_METHODS)}, got {method!r}")
        for name in params:
            if name not in _NGRAM_METHODS[method]:
                raise InvalidArgumentError(f"{name!r} is not a parameter of the n-gram method {method!r} (its "
                                           f"parameters: {', '.join(_NGRAM_METHODS[method])})")
        for name, value in params.items():
            if name.startswith("lookup_cache"):
                if value is not None and not isinstance(value, (str, os.PathLike)):
                    raise ArgumentTypeError(f"{name} must be a path, got {type(value).__name__}")
            else:
                params[name] = as_int(value, name)
        self.method = method
        self._session_kind = f"ngram-{method}"
        self.params = {**{k: v for k, v in _core.NGRAM_DEFAULTS.items() if k in _NGRAM_METHODS[method]}, **params}
        """The method's parameters, llama.cpp's defaults where not given."""
        config = _config(None, n_seq, n_draft_max, n_min, 0.0, self._session_kind)  # (the shim checks params)
        self._open(target_ctx, None, config, params)

    def _check_contexts(self, target_ctx: Context, draft_ctx: None) -> None:
        if target_ctx.ctx_type != "default":
            raise SessionInitError("the target context of an n-gram session has ctx_type='default'",
                                   kind=self._session_kind)

    def __repr__(self) -> str:
        c = self._config
        state = "closed" if self.closed else "open"
        params = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return (f"NgramSession(method={self.method!r}, n_seq={c.n_seq}, n_draft_max={c.n_draft_max}, "
                f"n_min={c.n_min}{params}, {state})")
