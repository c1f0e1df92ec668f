# Included by _core.pyx: the pair: a target context with its draft side, driven step by step or by the engine.

cdef class Pair:
    """A target context and, for speculation, its draft context and session.

    The one owner of what a caller drives at once: the locks of both contexts
    (``with pair:``), the session's decode bookkeeping (which target decode it
    has processed), the draft context's outputs that its calls overwrite, and
    the engine that runs whole generations on the pair. Without a draft it is
    plain decoding on the target alone.
    """

    cdef readonly ContextHandle target_ctx, draft_ctx
    cdef readonly SessionHandle session
    cdef EngineHandle engine
    cdef tuple locks
    cdef uint64_t created_serial, processed_serial
    cdef uint64_t engine_serial      # the target's serial after the engine's last call
    cdef readonly uint64_t n_generations   # generations started so far
    cdef readonly int32_t n_seq, n_draft_max, n_min
    cdef readonly bint need_embd, need_embd_pre_norm
    cdef bint has_draft_logits         # draft() of one sequence left the draft's logits ...
    cdef uint64_t draft_logits_serial  # ... while the draft context had this serial
    cdef uint64_t tgt_epoch, dft_epoch # the contexts' KV epochs when the engine last left them
    cdef bint engine_known             # ... and the engine knows what they hold (prefix reuse)
    cdef object __weakref__

    def __cinit__(self, ContextHandle target, ContextHandle draft=None, str kind="", tuple config=(1, 0, 0, 0.0),
                  tuple locks=(), dict ngram=None):
        self.target_ctx = target
        self.draft_ctx = draft
        self.locks = locks
        cdef e3_spec_info info
        if kind:
            self.session = SessionHandle(kind, target, draft, config, ngram)
            info = self.session.info
            self.n_seq, self.n_draft_max, self.n_min = info.n_seq, info.n_draft_max, info.n_min
            self.need_embd, self.need_embd_pre_norm = info.need_embd, info.need_embd_pre_norm
        else:
            self.n_seq = <int32_t> target.n_seq_max
        self.created_serial = self.processed_serial = target.serial

    def __enter__(self):
        for lock in self.locks:
            lock.acquire()
        return self

    def __exit__(self, *exc):
        for lock in reversed(self.locks):
            lock.release()

    # -- the step-by-step loop ----------------------------------------------

    cdef _Call _call(self, bint cancellable=False):
        """A native call on both contexts (see _Call)."""
        return _Call.begin((self.target_ctx, self.draft_ctx), cancellable)

    cdef int _spec_done(self, _Call call, int rc) except -1:
        # every session call may decode on the draft context: its logits are gone, and the
        # engine no longer knows what the draft side holds
        self.engine_known = False
        if self.draft_ctx is not None:
            self.draft_ctx.outputs_lost(False)
        self.has_draft_logits = False
        return call.end(rc)

    cdef int _ready_for_draft_side(self) except -1:
        if self.draft_ctx is not None and self.draft_ctx.n_views > 0:
            raise SessionStateError(
                "logits views of the draft context are alive; the session would overwrite them. Delete them first")
        return 0

    def begin(self, int32_t seq_id, prompt):
        arr = int32_array(prompt, "prompt")
        cdef const int32_t[::1] view = arr
        cdef _Call call = self._call()
        cdef int rc = e3_spec_begin(self.session.ptr, seq_id, &view[0] if view.shape[0] else NULL,
                                    <int32_t> view.shape[0], &call.err)
        self._spec_done(call, rc)

    def process(self, Batch batch):
        tgt = self.target_ctx
        if tgt.serial == self.created_serial:
            raise SessionStateError(
                "process() needs a batch decoded on the target after the session was created; decode first")
        if not tgt.is_last_decoded(batch):
            raise SessionStateError(
                "process() takes the batch that was just decoded on the target context (this batch was not, "
                "or was changed after decoding)")
        if self.processed_serial == tgt.serial:
            raise SessionStateError("this decode was already processed; decode the next batch first")
        self._ready_for_draft_side()
        cdef int32_t n = batch.n
        # private copies: the shim reads them without the GIL
        tokens = batch._tokens_np[:n].copy()
        pos = batch._pos_np[:n].copy()
        seq = batch._seq_np[:n, 0].copy()
        cdef const int32_t[::1] t = tokens
        cdef const int32_t[::1] p = pos
        cdef const int32_t[::1] s = seq
        cdef int rc
        cdef _Call call = self._call()
        with nogil:
            rc = e3_spec_process(self.session.ptr, n, &t[0], &p[0], &s[0], &call.err)
        self._spec_done(call, rc)
        self.processed_serial = tgt.serial

    cdef object _draft(self, sid, npast, last, caps, int32_t[::1] out, int32_t stride):
        """One e3_spec_draft call for k requests; returns their lengths."""
        cdef Py_ssize_t k = sid.shape[0]
        self._ready_for_draft_side()
        lengths = np.zeros(k, dtype=np.int32)
        if k == 0:
            return lengths
        cdef const int32_t[::1] a = sid
        cdef const int32_t[::1] b = npast
        cdef const int32_t[::1] c = last
        cdef const int32_t[::1] d = caps
        cdef int32_t[::1] L = lengths
        cdef int32_t nk = <int32_t> k
        cdef int rc
        cdef _Call call = self._call()
        with nogil:
            rc = e3_spec_draft(self.session.ptr, nk, &a[0], &b[0], &c[0], &d[0], &out[0], stride, &L[0],
                               &call.err)
        self._spec_done(call, rc)
        return lengths

    def draft(self, int32_t seq_id, int32_t n_past, int32_t id_last, out=None):
        """Draft for one sequence into ``out`` (or a new array); returns the filled view."""
        if out is None:
            out = np.empty(self.n_draft_max, dtype=np.int32)
        elif not (isinstance(out, np.ndarray) and out.dtype == np.int32 and out.ndim == 1
                  and out.flags.c_contiguous and out.flags.writeable):
            raise ArgumentTypeError("out must be a writeable, contiguous, one-dimensional int32 NumPy array")
        if out.shape[0] < self.n_draft_max:
            raise InvalidArgumentError(f"out has {out.shape[0]} elements; drafts can have up to {self.n_draft_max}")
        one = np.array([seq_id, n_past, id_last, 0], dtype=np.int32)
        lengths = self._draft(one[0:1], one[1:2], one[2:3], one[3:4], out, <int32_t> out.shape[0])
        if lengths[0] > 0 and self.draft_ctx is not None:
            self.has_draft_logits, self.draft_logits_serial = True, self.draft_ctx.serial
        return out[:lengths[0]]

    def draft_logits(self):
        """A copy of the draft's logits at the last step of the latest one-sequence draft()."""
        dctx = self.draft_ctx
        if dctx is None:
            raise SessionStateError("this drafter has no draft model, hence no draft logits")
        if not self.has_draft_logits or dctx.serial != self.draft_logits_serial:
            raise SessionStateError("no draft logits: they are those of the latest draft() of one sequence that "
                                    "drafted something, until the next call on the session or its contexts")
        cdef float * p = llama_get_logits_ith(dctx.ptr, 0)
        if p == NULL:
            raise DecodeError("llama.cpp has no logits for the draft's last step")
        cdef int32_t n = dctx.model.n_vocab
        out = np.empty(n, dtype=np.float32)
        cdef float[::1] o = out
        memcpy(&o[0], p, n * sizeof(float))
        return out

    def draft_many(self, seq_ids, n_past, id_last, n_max=None):
        """Draft for several sequences in one call: ``(tokens[k, n_draft_max], lengths[k])``."""
        sid = int32_array(seq_ids, "seq_ids")
        npast = int32_array(n_past, "n_past")
        last = int32_array(id_last, "id_last")
        k = sid.shape[0]
        if npast.shape[0] != k or last.shape[0] != k:
            raise InvalidArgumentError("seq_ids, n_past and id_last must have the same length")
        caps = np.zeros(k, np.int32) if n_max is None else int32_array(n_max, "n_max")
        if caps.shape[0] != k:
            raise InvalidArgumentError("n_max must have one entry per sequence")
        out = np.zeros((k, self.n_draft_max), dtype=np.int32)
        lengths = self._draft(sid, npast, last, caps, out.reshape(-1) if k else np.zeros(1, np.int32),
                              self.n_draft_max)
        return out, lengths

    def accept(self, int32_t seq_id, int32_t n_accepted):
        cdef _Call call = self._call()
        cdef int rc = e3_spec_accept(self.session.ptr, seq_id, n_accepted, &call.err)
        self._spec_done(call, rc)

    def counters(self, int32_t seq_id=-1):
        """The session's counters of one sequence (or all, -1) as a dict of e3_counters' fields."""
        cdef e3_counters c
        cdef _Histograms h = _Histograms(self.n_draft_max)
        cdef _Call call = _Call.begin()
        call.end(e3_spec_counters(self.session.ptr, seq_id, &c, &h.view, &call.err))
        return _counters_dict(&c, h, self.n_draft_max)

    def reset_counters(self):
        e3_spec_reset_counters(self.session.ptr)

    def print_upstream_stats(self):
        e3_spec_print_upstream_stats(self.session.ptr)

    # -- whole generations ---------------------------------------------------

    cdef void _engine_used(self):
        # the engine decoded on both contexts: no batch of the caller's can claim
        # the target's outputs, and the session is in step with the target
        self.target_ctx.outputs_lost(True)
        if self.draft_ctx is not None:
            self.draft_ctx.outputs_lost(False)
        self.has_draft_logits = False
        self.engine_serial = self.processed_serial = self.target_ctx.serial
        self._mark_known()

    cdef void _mark_known(self):
        # the contexts' epochs move on, so another pair's engine sees that they changed
        self.target_ctx.kv_epoch += 1
        self.tgt_epoch = self.target_ctx.kv_epoch
        if self.draft_ctx is not None:
            self.draft_ctx.kv_epoch += 1
            self.dft_epoch = self.draft_ctx.kv_epoch
        self.engine_known = True

    cdef bint _still_known(self):
        """Whether the contexts hold what the engine last left in them."""
        return (self.engine_known and self.engine is not None and self.target_ctx.kv_epoch == self.tgt_epoch
                and (self.draft_ctx is None or self.draft_ctx.kv_epoch == self.dft_epoch))

    cdef int _ready_for_engine(self) except -1:
        for ctx in (self.target_ctx, self.draft_ctx):
            if ctx is not None and (<ContextHandle> ctx).n_views > 0:
                raise SessionStateError("logits views of these contexts are alive; generation would overwrite "
                                        "them. Delete them (or copy them) first")
        return 0


    def start(self, seq_ids, list prompts, settings):
        """Start a generation of one prompt per sequence; returns its number (for :meth:`step`)."""
        self._ready_for_engine()
        if self.engine is None:
            self.engine = EngineHandle(self.target_ctx, self.session)
        # a sequence ends when its context is full: it never holds more than n_ctx tokens
        room = max(1, min(settings.max_new_tokens, <int64_t> self.target_ctx.n_ctx))
        outputs = [np.zeros(room, dtype=np.int32) for _ in prompts]
        k = settings.logprobs
        logprobs = [(np.zeros(room, np.float32), np.full((room, k), -1, np.int32), np.full((room, k), -np.inf, np.float32))
                    for _ in prompts] if k else None
        reuse = E3_REUSE_NONE if not settings.reuse else E3_REUSE_ALL if self._still_known() else E3_REUSE_SHARED
        cdef _Request request = _Request(seq_ids, prompts, outputs, settings, logprobs, reuse)
        cdef int rc
        cdef uint64_t setups = e3_engine_setups(self.engine.ptr)
        for ctx in (self.target_ctx, self.draft_ctx):  # a cancel is for what runs: not this generation
            if ctx is not None:
                e3_cancel_set((<ContextHandle> ctx).cancel, 0)
        cdef _Call call = self._call(cancellable=True)
        with nogil:
            rc = e3_engine_start(self.engine.ptr, &request.req, &call.err)
        call.returned()
        if rc < 0 and e3_engine_setups(self.engine.ptr) == setups:
            _raise_shim(&call.err)  # refused: nothing changed, a generation in progress goes on
        # from here the contexts have changed: a generation in progress is over
        self.engine.outputs = outputs  # C writes into them from now on
        self.engine.logprobs = logprobs
        self.n_generations += 1
        self._engine_used()
        call.end(rc)
        return self.n_generations

    def check_current(self, uint64_t generation):
        """Raise SessionStateError unless ``generation`` is the last one started and
        nothing has used the contexts since its last round."""
        if generation != self.n_generations or self.target_ctx.serial != self.engine_serial:
            raise SessionStateError("the contexts were used by another call while streaming this generation")

    cdef int _rounds(self, bint until_done) except -1:
        """One round (or all, ``until_done``); returns the sequences still generating.
        Ctrl-C stops the round it lands in and raises KeyboardInterrupt."""
        self._ready_for_engine()
        cdef int rc = 1
        cdef _Call call = self._call(cancellable=True)
        try:
            while rc > 0:
                with nogil:
                    rc = e3_engine_step(self.engine.ptr, &call.err)
                PyErr_CheckSignals()
                call.check_remote()
                if not until_done:
                    break
        finally:
            call.returned()
            self._engine_used()
        return call.end(rc)

    def step(self, uint64_t generation):
        """One round of generation ``generation``; returns the sequences still generating."""
        self.check_current(generation)
        return self._rounds(False)

    def run(self):
        """The current generation's rounds until every sequence is done."""
        self._rounds(True)

    def tokens(self, int32_t i):
        """The tokens request ``i`` has generated so far (a view of its output array)."""
        return self.engine.outputs[i][:e3_engine_n_tokens(self.engine.ptr, i)]

    def logprobs(self, int32_t i):
        """Request ``i``'s ``(logprobs, top_ids, top_logprobs)`` so far (views), or None."""
        if self.engine.logprobs is None:
            return None
        n = e3_engine_n_tokens(self.engine.ptr, i)
        return tuple(a[:n] for a in self.engine.logprobs[i])

    def trace(self, int32_t i):
        """Request ``i``'s rounds, as recorded with ``trace=True``: a dict of NumPy arrays."""
        cdef int32_t n = e3_engine_trace(self.engine.ptr, i, NULL, NULL, NULL, 0)
        cdef int32_t width = max(self.n_draft_max, 1)
        rounds = np.zeros(max(n, 1), dtype=_TRACE_ROUND_DTYPE)
        drafted = np.full((max(n, 1), width), -1, np.int32)
        draft_p = np.full((max(n, 1), width), np.nan, np.float32)
        cdef e3_trace_round[::1] rv = rounds
        cdef int32_t[:, ::1] dv = drafted
        cdef float[:, ::1] pv = draft_p
        n = e3_engine_trace(self.engine.ptr, i, &rv[0], &dv[0, 0], &pv[0, 0], n)
        fields = {name: rounds[name][:n].copy() for name in rounds.dtype.names}
        return {**fields, "drafted": drafted[:n], "draft_p": draft_p[:n]}

    # -- state ---------------------------------------------------------------

    def _engine(self):
        if self.engine is None:
            self.engine = EngineHandle(self.target_ctx, self.session)
        return self.engine

    def seq_state(self, int32_t seq_id):
        """``(target KV, draft KV or None, drafter state, held tokens or None, in_step)`` of a sequence."""
        cdef size_t n = 0
        tgt = self.target_ctx.state_get(seq_id)
        dft = self.draft_ctx.state_get(seq_id) if self.draft_ctx is not None else None
        cdef _Call call = _Call.begin()
        call.end(e3_spec_state_get(self.session.ptr, seq_id, NULL, 0, &n, &call.err))
        spec = bytearray(n)
        cdef unsigned char * sp = spec
        call = _Call.begin()
        call.end(e3_spec_state_get(self.session.ptr, seq_id, <uint8_t *> sp, n, &n, &call.err))
        held = None
        cdef int32_t in_step = 0
        cdef int32_t k
        cdef int32_t[::1] hv
        if self._still_known():
            k = e3_engine_held(self.engine.ptr, seq_id, NULL, 0, &in_step)
            if k >= 0:
                held = np.zeros(k, np.int32)
                hv = held
                e3_engine_held(self.engine.ptr, seq_id, &hv[0] if k else NULL, k, &in_step)
        return tgt, dft, bytes(spec), held, bool(in_step)

    def set_seq_state(self, int32_t seq_id, tgt, dft, spec, held, bint in_step):
        """Restore one sequence; the caller has checked every part."""
        engine = self._engine()
        self.target_ctx.state_set(tgt, seq_id)
        if self.draft_ctx is not None:
            self.draft_ctx.state_set(dft, seq_id)
        cdef const unsigned char[::1] sv = spec
        cdef _Call call = self._call()
        rc = e3_spec_state_set(self.session.ptr, seq_id, <const uint8_t *> &sv[0] if sv.shape[0] else NULL,
                               sv.shape[0], &call.err)
        self._spec_done(call, rc)
        cdef const int32_t[::1] hv = int32_array(() if held is None else held, "held")
        cdef int32_t n_held = -1 if held is None else <int32_t> hv.shape[0]  # -1: not known
        call = _Call.begin()
        call.end(e3_engine_set_held(self.engine.ptr, seq_id, &hv[0] if n_held > 0 else NULL, n_held,
                                    in_step and n_held >= 0, &call.err))

    def ready_for_restore(self):
        self._ready_for_engine()

    def forget_seq(self, int32_t seq_id):
        """After a failed restore: the sequence is empty on both contexts, the drafter starts over."""
        cdef e3_error err
        llama_memory_seq_rm(llama_get_memory(self.target_ctx.ptr), seq_id, -1, -1)
        if self.session is not None:
            e3_spec_reset_seq(self.session.ptr, seq_id)
        if self.engine is not None:
            e3_engine_set_held(self.engine.ptr, seq_id, NULL, -1, 0, &err)

    def restored(self):
        """The contexts now hold what the engine was told."""
        self.target_ctx.outputs_lost(True)
        if self.draft_ctx is not None:
            self.draft_ctx.outputs_lost(False)
        self.has_draft_logits = False
        self.processed_serial = self.target_ctx.serial  # (a stream in progress ends: engine_serial is stale)
        self._mark_known()

    def finish_reason(self, int32_t i):
        return FINISH_REASONS.get(e3_engine_finish(self.engine.ptr, i))

    def generation_counters(self, int32_t i=-1):
        """Counters of request ``i`` of the current generation (all of it: -1), as :meth:`counters`."""
        cdef e3_counters c
        cdef _Histograms h = _Histograms(self.n_draft_max)
        e3_engine_counters(self.engine.ptr, i, &c, &h.view)
        return _counters_dict(&c, h, self.n_draft_max)
