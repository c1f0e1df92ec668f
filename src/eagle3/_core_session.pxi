# Included by _core.pyx: speculative sessions, their counters, the generation engine and its requests.

MAX_SEQ = e3_max_seq()
MAX_LAYERS = e3_max_layers()
MAX_EXPERTS = e3_max_experts()
DRAFT_AUTO = E3_DRAFT_AUTO
FINISH_REASONS = {E3_RUNNING: None, E3_FINISH_LENGTH: "length", E3_FINISH_STOP: "stop",
                  E3_FINISH_CONTEXT: "context", E3_FINISH_CANCELLED: "cancelled"}
SESSION_KINDS = {(<bytes> e3_spec_kind_key(k)).decode(): k for k in range(E3_SPEC_KIND_COUNT)}
"""The drafters the shim has (its drafter table), by name."""


cdef e3_ngram_config _defaults
e3_ngram_config_default(&_defaults)
NGRAM_DEFAULTS = {"size_n": _defaults.size_n, "size_m": _defaults.size_m, "min_hits": _defaults.min_hits,
                  "n_match": _defaults.n_match, "mod_n_min": _defaults.mod_n_min, "mod_n_max": _defaults.mod_n_max}
"""llama.cpp's defaults for the n-gram drafters' integer parameters."""


def _clamp32(v):
    """Integers beyond C's int32 pass as the nearest int32 (which every rule refuses)."""
    return max(-2**31, min(int(v), 2**31 - 1))


cdef class _SpecConfig:
    """An ``e3_spec_config`` and the bytes its cache-file paths point into."""
    cdef e3_spec_config cfg
    cdef tuple paths

    def __cinit__(self, str kind, n_seq, n_draft_max, n_min, double p_min, dict ngram=None):
        self.cfg.kind = SESSION_KINDS[kind]
        self.cfg.n_seq = <uint32_t> max(0, min(int(n_seq), 2**32 - 1))
        self.cfg.n_draft_max = _clamp32(n_draft_max)
        self.cfg.n_min = _clamp32(n_min)
        self.cfg.p_min = <float> p_min
        ngram = dict(ngram or {})
        self.paths = tuple(os.fsencode(ngram.pop(name)) if ngram.get(name) else None
                           for name in ("lookup_cache_static", "lookup_cache_dynamic"))
        if not ngram.keys() <= NGRAM_DEFAULTS.keys():
            raise InvalidArgumentError(f"unknown n-gram parameters {sorted(ngram.keys() - NGRAM_DEFAULTS.keys())}")
        v = {**NGRAM_DEFAULTS, **{name: _clamp32(value) for name, value in ngram.items()}}
        cdef e3_ngram_config * g = &self.cfg.ngram
        g.size_n, g.size_m, g.min_hits = v["size_n"], v["size_m"], v["min_hits"]
        g.n_match, g.mod_n_min, g.mod_n_max = v["n_match"], v["mod_n_min"], v["mod_n_max"]
        g.lookup_cache_static = <const char *> self.paths[0] if self.paths[0] is not None else NULL
        g.lookup_cache_dynamic = <const char *> self.paths[1] if self.paths[1] is not None else NULL


def check_session_config(str kind, n_seq, n_draft_max, n_min, double p_min, dict ngram=None):
    """Raise InvalidConfigError if a session configuration is out of range (the shim's rules)."""
    cdef _SpecConfig c = _SpecConfig(kind, n_seq, n_draft_max, n_min, p_min, ngram)
    cdef _Call call = _Call.begin()
    call.end(e3_spec_check_config(&c.cfg, &call.err))


def vocab_mismatch(ModelHandle target, ModelHandle draft):
    """Why ``draft``'s vocabulary does not fit ``target``'s by llama.cpp's rules for a
    draft model, or None when it fits."""
    cdef char why[512]
    why[0] = 0
    if e3_vocab_compatible(target.ptr, draft.ptr, why, sizeof(why)):
        return None
    return why.decode("utf-8", "replace")


# ---------------------------------------------------------------------------
# Counters: e3_counters (and its histograms) as one dict, built here only
# ---------------------------------------------------------------------------

cdef class _Histograms:
    """The two histogram arrays beside an e3_counters, and the C view of them."""
    cdef readonly object accepted_per_position, draft_lengths
    cdef e3_histograms view

    def __cinit__(self, int32_t n_draft_max):
        self.accepted_per_position = np.zeros(max(n_draft_max, 0) + 1, dtype=np.int64)
        self.draft_lengths = np.zeros(max(n_draft_max, 0) + 1, dtype=np.int64)
        cdef int64_t[::1] a = self.accepted_per_position
        cdef int64_t[::1] b = self.draft_lengths
        self.view.accepted_per_pos = &a[0]
        self.view.draft_lengths = &b[0]
        self.view.n_hist = <int32_t> a.shape[0]


cdef dict _counters_dict(const e3_counters * c, _Histograms h, int32_t n_draft_max):
    cdef dict d = c[0]  # every field of e3_counters, by name
    d["accepted_per_position"] = h.accepted_per_position[:max(n_draft_max, 0)]
    d["draft_lengths"] = h.draft_lengths
    return d


# ---------------------------------------------------------------------------
# Speculative sessions, and the generation engine with its requests
# ---------------------------------------------------------------------------

cdef class SessionHandle:
    """Owns an ``e3_spec`` (a ``common_speculative`` and its bookkeeping)."""

    cdef e3_spec * ptr
    cdef readonly ContextHandle target_ctx, draft_ctx
    cdef e3_spec_info info

    def __cinit__(self, str kind, ContextHandle target, ContextHandle draft, tuple config, dict ngram=None):
        cdef _SpecConfig c = _SpecConfig(kind, *config, ngram)
        cdef llama_context * dptr = draft.ptr if draft is not None else NULL
        cdef _Call call = _Call.begin()
        with nogil:
            self.ptr = e3_spec_create(target.ptr, dptr, &c.cfg, &call.err)
        if self.ptr == NULL and call.err.status == E3_ERR_INIT:
            raise SessionInitError(_with_log(call.err.message.decode("utf-8", "replace")), kind=kind)
        call.end(-1 if self.ptr == NULL else 0)
        self.target_ctx = target
        self.draft_ctx = draft
        e3_spec_get_info(self.ptr, &self.info)

    def __dealloc__(self):
        # runs before the context handles are released: the spec goes first
        if self.ptr != NULL:
            e3_spec_free(self.ptr)
            self.ptr = NULL


cdef class EngineHandle:
    """Owns an ``e3_engine``: the draft/verify/accept loop in C, run without the GIL."""

    cdef e3_engine * ptr
    cdef readonly list outputs       # one int32 array per request; C writes the tokens into them
    cdef public object logprobs      # None, or per request (logprobs, top_ids, top_logprobs) arrays C writes

    def __cinit__(self, ContextHandle target, SessionHandle session):
        cdef _Call call = _Call.begin()
        self.ptr = e3_engine_create(target.ptr, session.ptr if session is not None else NULL, target.cancel, &call.err)
        call.end(-1 if self.ptr == NULL else 0)
        self.outputs = []
        self.logprobs = None

    def __dealloc__(self):
        if self.ptr != NULL:
            e3_engine_free(self.ptr)
            self.ptr = NULL


# e3_logit_bias and e3_trace_round, as NumPy sees them
_LOGIT_BIAS_DTYPE = np.dtype([("token", np.int32), ("bias", np.float32)], align=True)
_TRACE_ROUND_DTYPE = np.dtype([("round", np.int32), ("n_drafted", np.int32), ("n_accepted", np.int32),
                               ("t_draft_s", np.float64), ("t_verify_s", np.float64)], align=True)


cdef class _Request:
    """An ``e3_request`` and the arrays its pointers point into, filled once from validated settings."""
    cdef e3_request req
    cdef object keep                 # the Python objects behind the pointers
    cdef const int32_t ** prompts
    cdef int32_t * lengths
    cdef int32_t ** outs
    cdef const char ** strings
    cdef float ** lps
    cdef int32_t ** top_ids
    cdef float ** top_lps

    def __cinit__(self, seq_ids, list prompts, list outputs, s, list logprobs=None, int reuse=E3_REUSE_NONE):
        cdef Py_ssize_t n = len(prompts), i
        sids = int32_array(seq_ids, "seq_ids")
        if sids.shape[0] != n or n == 0:
            raise InvalidArgumentError("one sequence id per prompt, and at least one prompt")
        arrays = [int32_array(p, "prompt") for p in prompts]
        stops = int32_array(list(s.stop_tokens), "stop_tokens") if s.stop_tokens else np.zeros(1, np.int32)
        encoded = [x.encode("utf-8") for x in s.stop_strings]
        sampling = s.sampling
        bias = np.zeros(max(len(sampling.logit_bias), 1), dtype=_LOGIT_BIAS_DTYPE)
        for i, (token, value) in enumerate(sampling.logit_bias):
            bias[i] = (token, value)
        grammar = sampling.grammar.encode("utf-8") if sampling.grammar else None
        self.keep = (sids, arrays, outputs, stops, encoded, bias, grammar, logprobs)
        self.prompts = <const int32_t **> malloc(n * sizeof(int32_t *))
        self.lengths = <int32_t *> malloc(n * sizeof(int32_t))
        self.outs = <int32_t **> malloc(n * sizeof(int32_t *))
        self.strings = <const char **> malloc(max(len(encoded), 1) * sizeof(char *))
        self.lps = <float **> malloc(n * sizeof(float *))
        self.top_ids = <int32_t **> malloc(n * sizeof(int32_t *))
        self.top_lps = <float **> malloc(n * sizeof(float *))
        if not (self.prompts and self.lengths and self.outs and self.strings and self.lps and self.top_ids
                and self.top_lps):
            raise MemoryError()
        cdef const int32_t[::1] view
        cdef int32_t[::1] outv
        for i in range(n):
            view = arrays[i]
            outv = outputs[i]
            self.prompts[i] = &view[0] if view.shape[0] else NULL
            self.lengths[i] = <int32_t> view.shape[0]
            self.outs[i] = &outv[0]
        for i in range(len(encoded)):
            self.strings[i] = <const char *> (<bytes> encoded[i])
        cdef float[::1] lpv, tlv
        cdef int32_t[::1] tiv
        for i in range(n if logprobs else 0):
            lpv, tiv, tlv = logprobs[i][0], logprobs[i][1].reshape(-1), logprobs[i][2].reshape(-1)
            self.lps[i], self.top_ids[i], self.top_lps[i] = &lpv[0], &tiv[0], &tlv[0]
        cdef const int32_t[::1] sv = sids
        cdef const int32_t[::1] stv = stops
        self.req.n_seq = <int32_t> n
        self.req.seq_ids = &sv[0]
        self.req.prompts = self.prompts
        self.req.n_prompt = self.lengths
        self.req.out = self.outs
        self.req.max_new = s.max_new_tokens
        # e3_sampling, field for field (SamplingParams mirrors it)
        self.req.sampling.temperature = sampling.temperature
        self.req.sampling.top_k = sampling.top_k
        self.req.sampling.top_p = sampling.top_p
        self.req.sampling.min_p = sampling.min_p
        self.req.sampling.typical_p = sampling.typical_p
        self.req.sampling.penalty_last_n = sampling.penalty_last_n
        self.req.sampling.repeat_penalty = sampling.repeat_penalty
        self.req.sampling.frequency_penalty = sampling.frequency_penalty
        self.req.sampling.presence_penalty = sampling.presence_penalty
        cdef e3_logit_bias[::1] bv = bias
        self.req.sampling.logit_bias = &bv[0]
        self.req.sampling.n_logit_bias = <int32_t> len(sampling.logit_bias)
        self.req.sampling.grammar = <const char *> grammar if grammar is not None else NULL
        self.req.sampling.verify = E3_VERIFY_REJECTION if sampling.verify == "rejection" else E3_VERIFY_MATCH
        self.req.sampling.seed = sampling.seed
        self.req.stop_tokens = &stv[0]
        self.req.n_stop_tokens = <int32_t> len(s.stop_tokens)
        self.req.stop_strings = self.strings
        self.req.n_stop_strings = <int32_t> len(encoded)
        self.req.n_draft = s.n_draft
        self.req.n_logprobs = s.logprobs if logprobs else 0
        self.req.logprobs = self.lps
        self.req.top_ids = self.top_ids
        self.req.top_logprobs = self.top_lps
        self.req.trace = s.trace
        self.req.reuse = reuse

    def __dealloc__(self):
        free(self.prompts)
        free(self.lengths)
        free(self.outs)
        free(self.strings)
        free(self.lps)
        free(self.top_ids)
        free(self.top_lps)
