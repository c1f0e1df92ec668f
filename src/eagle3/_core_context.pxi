# Included by _core.pyx: batches and contexts (decoding, logits views, layer inputs, KV states).

# ---------------------------------------------------------------------------
# Batch
# ---------------------------------------------------------------------------

cdef class Batch:
    """A batch of tokens to decode, stored in NumPy arrays.

    ``Batch(capacity, n_seq_max=1)`` holds up to ``capacity`` entries; each
    entry is a token at a position, in one or more sequences (at most
    ``n_seq_max``), with an output flag that asks for its logits. Fill it
    entry by entry with :meth:`add`, or from arrays with :meth:`add_sequence`
    and :meth:`add_arrays` (no Python loop). ``tokens``, ``positions``,
    ``seq_ids`` and ``outputs`` are read-only views of the filled entries.
    """

    cdef readonly int32_t capacity
    cdef readonly int32_t n_seq_max
    cdef int32_t n
    cdef readonly uint64_t version
    cdef object _tokens_np, _pos_np, _seq_np, _nseq_np, _out_np
    cdef int32_t[::1] _tokens
    cdef int32_t[::1] _pos
    cdef int32_t[:, ::1] _seq
    cdef int32_t[::1] _nseq
    cdef int8_t[::1] _out

    def __cinit__(self, int capacity, int n_seq_max=1):
        if capacity <= 0:
            raise BatchError(f"capacity must be > 0, got {capacity}")
        if n_seq_max <= 0 or n_seq_max > e3_max_seq():
            raise BatchError(f"n_seq_max must be in [1, {e3_max_seq()}], got {n_seq_max}")
        self.capacity = capacity
        self.n_seq_max = n_seq_max
        self.n = 0
        self.version = 0
        self._tokens_np = np.zeros(capacity, dtype=np.int32)
        self._pos_np = np.zeros(capacity, dtype=np.int32)
        self._seq_np = np.zeros((capacity, n_seq_max), dtype=np.int32)
        self._nseq_np = np.zeros(capacity, dtype=np.int32)
        self._out_np = np.zeros(capacity, dtype=np.int8)
        self._tokens = self._tokens_np
        self._pos = self._pos_np
        self._seq = self._seq_np
        self._nseq = self._nseq_np
        self._out = self._out_np

    @classmethod
    def from_tokens(cls, tokens, int pos0=0, int seq_id=0, output="last", capacity=None, int n_seq_max=1):
        """A batch holding one sequence of tokens at positions ``pos0, pos0+1, ...``."""
        arr = int32_array(tokens, "tokens")
        cap = max(1, len(arr)) if capacity is None else capacity
        cdef Batch b = cls(cap, max(n_seq_max, seq_id + 1))
        b.add_sequence(arr, pos0, seq_id, output)
        return b

    def __len__(self):
        return self.n

    @property
    def n_tokens(self):
        return self.n

    def clear(self):
        """Remove every entry (the arrays are kept)."""
        self.n = 0
        self.version += 1

    cdef inline int _check_seq(self, int32_t seq_id) except -1:
        if seq_id < 0 or seq_id >= self.n_seq_max:
            raise BatchError(f"sequence id {seq_id} out of range for this batch (n_seq_max = {self.n_seq_max})")
        return 0

    def add(self, int32_t token, int32_t pos, seq_ids=0, bint output=False):
        """Append one entry; ``seq_ids`` is a sequence id or a list of them. Returns its index."""
        if self.n >= self.capacity:
            raise BatchError(f"batch is full (capacity {self.capacity})")
        cdef int32_t i = self.n
        cdef int32_t k = 0
        cdef int32_t s
        if isinstance(seq_ids, int):
            s = seq_ids
            self._check_seq(s)
            self._seq[i, 0] = s
            k = 1
        else:
            ids = list(seq_ids)
            if not ids or len(ids) > self.n_seq_max:
                raise BatchError(f"an entry needs 1..{self.n_seq_max} sequence ids, got {len(ids)}")
            if len(set(ids)) != len(ids):
                raise BatchError(f"duplicate sequence ids {ids}")
            for s in ids:
                self._check_seq(s)
                self._seq[i, k] = s
                k += 1
        self._tokens[i] = token
        self._pos[i] = pos
        self._nseq[i] = k
        self._out[i] = 1 if output else 0
        self.n = i + 1
        self.version += 1
        return i

    def add_sequence(self, tokens, int32_t pos0=0, int32_t seq_id=0, output="last"):
        """Append tokens of one sequence at positions ``pos0, pos0+1, ...``.

        ``output`` is ``"last"`` (logits for the last token only), ``"all"``,
        ``"none"``, or a boolean array with one flag per token.
        """
        arr = int32_array(tokens, "tokens")
        cdef int32_t k = <int32_t> arr.shape[0]
        if k == 0:
            return
        self._check_seq(seq_id)
        if self.n + k > self.capacity:
            raise BatchError(f"{k} more entries do not fit (capacity {self.capacity}, holding {self.n})")
        flags = self._output_flags(output, k)
        cdef int32_t n0 = self.n
        self._tokens_np[n0:n0 + k] = arr
        self._pos_np[n0:n0 + k] = np.arange(pos0, pos0 + k, dtype=np.int64)
        self._seq_np[n0:n0 + k, 0] = seq_id
        self._nseq_np[n0:n0 + k] = 1
        self._out_np[n0:n0 + k] = flags
        self.n = n0 + k
        self.version += 1

    def add_arrays(self, tokens, positions, seq_ids, outputs=False):
        """Append entries from arrays: one token, position and sequence id each.

        ``outputs`` is a bool or a boolean array of the same length.
        """
        tok = int32_array(tokens, "tokens")
        pos = int32_array(positions, "positions")
        k = tok.shape[0]
        seq = np.broadcast_to(int32_array(seq_ids, "seq_ids"), (k,)) if k else np.empty(0, np.int32)
        if pos.shape[0] != k:
            raise BatchError(f"{k} tokens but {pos.shape[0]} positions")
        if k == 0:
            return
        if seq.min() < 0 or seq.max() >= self.n_seq_max:
            raise BatchError(f"sequence ids must be in [0, {self.n_seq_max}) for this batch")
        if self.n + k > self.capacity:
            raise BatchError(f"{k} more entries do not fit (capacity {self.capacity}, holding {self.n})")
        if isinstance(outputs, (bool, np.bool_)):
            flags = np.full(k, 1 if outputs else 0, dtype=np.int8)
        else:
            flags = self._output_flags(outputs, k)
        n0 = self.n
        self._tokens_np[n0:n0 + k] = tok
        self._pos_np[n0:n0 + k] = pos
        self._seq_np[n0:n0 + k, 0] = seq
        self._nseq_np[n0:n0 + k] = 1
        self._out_np[n0:n0 + k] = flags
        self.n = n0 + k
        self.version += 1

    def _output_flags(self, output, int32_t k):
        if isinstance(output, str):
            flags = np.zeros(k, dtype=np.int8)
            if output == "last":
                flags[k - 1] = 1
            elif output == "all":
                flags[:] = 1
            elif output != "none":
                raise BatchError(f"output must be 'last', 'all', 'none' or a boolean array, got {output!r}")
            return flags
        arr = np.asarray(output)
        if arr.dtype != np.bool_ or arr.shape != (k,):
            raise BatchError(f"output flags must be a boolean array of length {k}")
        return arr.astype(np.int8)

    def _view(self, arr):
        v = arr[:self.n]
        v.flags.writeable = False
        return v

    @property
    def tokens(self):
        """Token ids of the filled entries (read-only int32 view)."""
        return self._view(self._tokens_np)

    @property
    def positions(self):
        """Positions of the filled entries (read-only int32 view)."""
        return self._view(self._pos_np)

    @property
    def seq_ids(self):
        """First sequence id of each filled entry (read-only int32 view)."""
        return self._view(self._seq_np[:, 0])

    @property
    def n_seq_ids(self):
        """Number of sequences each filled entry belongs to (read-only int32 view)."""
        return self._view(self._nseq_np)

    @property
    def outputs(self):
        """Output flags of the filled entries (read-only bool view)."""
        return self._view(self._out_np.view(np.bool_))

    def entry_seq_ids(self, int i):
        """All sequence ids of entry ``i``."""
        if i < 0 or i >= self.n:
            raise InvalidIndexError(f"entry {i} out of range (the batch holds {self.n})")
        return [int(self._seq[i, k]) for k in range(self._nseq[i])]

    def __repr__(self):
        return f"Batch(n_tokens={self.n}, capacity={self.capacity}, n_seq_max={self.n_seq_max})"

    def __reduce__(self):
        raise ArgumentTypeError("a Batch cannot be copied or pickled; fill a new one (add_arrays takes its "
                                "tokens, positions, seq_ids and outputs)")

    def __copy__(self):
        self.__reduce__()

    def __deepcopy__(self, memo):
        self.__reduce__()


# ---------------------------------------------------------------------------
# Context
# ---------------------------------------------------------------------------

cdef class _LogitsOwner:
    """Base object of a logits view: keeps its context's C object alive."""
    cdef ContextHandle ctx

    def __dealloc__(self):
        if self.ctx is not None:
            self.ctx.n_views -= 1


cdef class ContextHandle:
    """Owns a ``llama_context`` and its reusable ``llama_batch_ext``."""

    cdef llama_context * ptr
    cdef llama_batch_ext * bext
    cdef e3_cancel * cancel                   # set: llama.cpp aborts this context's decodes
    cdef readonly ModelHandle model
    cdef readonly ContextHandle other
    cdef readonly uint32_t n_ctx, n_batch, n_ubatch, n_seq_max
    cdef readonly bint is_mtp
    cdef readonly uint64_t serial            # successful decodes so far
    cdef public uint64_t kv_epoch             # changes of the KV cache by calls other than a generation's
    cdef Batch last_batch                     # batch of the last successful decode
    cdef uint64_t last_version
    cdef object last_outputs                  # int8 output flags of the last decode
    cdef int32_t last_n_outputs
    cdef int32_t out_capacity                 # rows llama.cpp's output buffer holds now
    cdef int n_views                          # live logits views into that buffer
    cdef set captured                         # layers whose input every decode captures
    cdef bint capture_grew                    # captured grew since the last decode: its buffer will move
    cdef tuple last_captured                  # captured at the last decode
    cdef bint last_one_seq                    # the last batch held one sequence (rows in batch order)
    cdef object __weakref__

    def __cinit__(self, ModelHandle model, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch,
                  uint32_t n_seq_max, bint mtp, ContextHandle other, int32_t n_threads,
                  int32_t n_threads_batch, bint flash_attn=True):
        cdef llama_context_params p = llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = n_ubatch
        p.n_seq_max = n_seq_max
        p.n_outputs_max = 0  # n_batch: a verify batch may ask for logits on every row
        p.ctx_type = LLAMA_CONTEXT_TYPE_MTP if mtp else LLAMA_CONTEXT_TYPE_DEFAULT
        p.no_perf = True
        p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else LLAMA_FLASH_ATTN_TYPE_DISABLED
        if n_threads > 0:
            p.n_threads = n_threads
        if n_threads_batch > 0:
            p.n_threads_batch = n_threads_batch
        p.ctx_other = other.ptr if other is not None else NULL
        cdef llama_context * c
        _Call.begin()
        with nogil:
            c = llama_init_from_model(model.ptr, p)
        self.ptr = c
        self.model = model
        self.other = other
        if model.endpoints:  # (its compute buffers are on the servers too)
            failed = _remote_failure(model)
            if failed is not None:
                raise RemoteError(failed[0], failed[1])
        if c == NULL:
            raise ContextError(_with_log("llama.cpp could not create the context"))
        self.is_mtp = mtp
        self.n_ctx = llama_n_ctx(c)
        self.n_batch = llama_n_batch(c)
        self.n_ubatch = llama_n_ubatch(c)
        self.n_seq_max = llama_n_seq_max(c)
        self.out_capacity = <int32_t> self.n_seq_max
        self.captured = set()
        self.last_captured = ()
        self.bext = llama_batch_ext_init(c)
        self.cancel = e3_cancel_attach(c)
        if self.bext == NULL or self.cancel == NULL:
            raise ContextError("llama.cpp could not allocate a batch for the context")

    def __dealloc__(self):
        if self.bext != NULL:
            llama_batch_ext_free(self.bext)
            self.bext = NULL
        if self.ptr != NULL:
            llama_free(self.ptr)
            self.ptr = NULL
        e3_cancel_free(self.cancel)  # (after the context: its abort callback reads it)
        self.cancel = NULL

    @property
    def n_threads(self):
        return llama_n_threads(self.ptr)

    @property
    def n_threads_batch(self):
        return llama_n_threads_batch(self.ptr)

    @property
    def tokens_decoded(self):
        cdef llama_perf_context_data perf = llama_perf_context(self.ptr)
        return perf.n_p_eval + perf.n_eval

    cdef int _check_seq(self, int32_t seq_id) except -1:
        if seq_id < 0 or <uint32_t> seq_id >= self.n_seq_max:
            raise BadSeqIdError(seq_id, self.n_seq_max)
        return 0

    cdef int32_t _check_batch(self, Batch batch) except -1:
        """Refuse a batch llama.cpp would abort on; returns its number of outputs."""
        cdef int32_t n = batch.n
        cdef int32_t i, k, s, n_out = 0
        cdef int32_t n_vocab = self.model.n_vocab
        if n == 0:
            raise DecodeError("the batch is empty")
        if <uint32_t> n > self.n_batch:
            raise DecodeError(f"the batch has {n} entries, more than this context's n_batch = {self.n_batch}")
        # per-sequence positions must continue from what the KV cache holds
        cdef int32_t n_seq = <int32_t> self.n_seq_max
        next_pos_np = np.full(n_seq, -2**31, dtype=np.int64)
        cdef int64_t[::1] next_pos = next_pos_np
        cdef llama_memory_t mem = llama_get_memory(self.ptr)
        for i in range(n):
            if batch._tokens[i] < 0 or batch._tokens[i] >= n_vocab:
                raise DecodeError(f"entry {i}: token {batch._tokens[i]} is not in the vocabulary (0..{n_vocab - 1})")
            for k in range(batch._nseq[i]):
                s = batch._seq[i, k]
                if s < 0 or s >= n_seq:
                    raise BadSeqIdError(s, n_seq)
                if next_pos[s] == -2**31:
                    next_pos[s] = llama_memory_seq_pos_max(mem, s) + 1
                if batch._pos[i] != next_pos[s]:
                    raise DecodeError(
                        f"entry {i}: position {batch._pos[i]} in sequence {s}, but the sequence continues at "
                        f"position {next_pos[s]} (positions must be consecutive; use seq_rm to drop a tail)")
                next_pos[s] += 1
            if batch._out[i]:
                n_out += 1
        if next_pos_np.max() > self.n_ctx:
            raise DecodeError(f"the batch goes past the context size n_ctx = {self.n_ctx}")
        if (n_out > self.out_capacity or self.capture_grew) and self.n_views > 0:
            raise DecodeError(
                "this decode needs a larger logits buffer, but logits views from an earlier decode are still "
                "alive; delete them or keep copies (np.array(view)) instead")
        return n_out

    def decode(self, Batch batch):
        """Decode ``batch``; raises DecodeError with the reason on failure."""
        cdef int32_t n_out = self._check_batch(batch)
        cdef int32_t n = batch.n
        cdef int32_t i, k, idx
        llama_batch_ext_clear(self.bext)
        for i in range(n):
            idx = llama_batch_ext_add_token(self.bext, batch._seq[i, 0], batch._tokens[i])
            if idx < 0:
                raise DecodeError(f"entry {i} was rejected by llama.cpp (code {idx})")
            llama_batch_ext_set_pos(self.bext, idx, &batch._pos[i])
            for k in range(1, batch._nseq[i]):
                llama_batch_ext_add_seq(self.bext, idx, batch._seq[i, k])
            if batch._out[i]:
                llama_batch_ext_set_output_logits(self.bext, idx, True)

        cdef int32_t rc = 0
        cdef int status
        e3_cancel_set(self.cancel, 0)  # a cancel is for what runs: not this decode
        cdef _Call call = _Call.begin((self,), cancellable=True)
        with nogil:
            status = e3_decode(self.ptr, self.bext, &rc, &call.err)
        call.returned()
        if status != 0:
            rc = -3  # (llama.cpp threw: its message says why)
        if n_out > self.out_capacity:
            self.out_capacity = n_out
        try:
            call.check_remote()
        except RemoteError:
            self.outputs_lost(False)
            raise
        if rc != 0:
            self.outputs_lost(False)
            PyErr_CheckSignals()  # Ctrl-C stopped it: KeyboardInterrupt, not a DecodeError
            reason = {1: "no KV cache slot for the batch (the context is full; clear or seq_rm first)",
                      2: "aborted", -1: "invalid batch"}.get(rc, "computation failed")
            if status != 0:
                reason = call.err.message.decode("utf-8", "replace")
            raise DecodeError(_with_log(f"llama_decode returned {rc}: {reason}"))
        self.serial += 1
        self.kv_epoch += 1
        self.last_batch = batch
        self.last_version = batch.version
        self.last_outputs = batch._out_np[:n].copy()
        self.last_n_outputs = n_out
        self.capture_grew = False
        self.last_captured = tuple(self.captured)
        self.last_one_seq = True
        for i in range(n):
            if batch._nseq[i] != 1 or batch._seq[i, 0] != batch._seq[0, 0]:
                self.last_one_seq = False
        return 0

    def capture_layer_inputs(self, layers):
        """Capture the input of each layer in ``layers`` at every later decode."""
        cdef e3_error err
        cdef int32_t lid
        cdef int32_t n_layer = llama_model_n_layer(self.model.ptr)
        for lid in layers:  # all or none
            if not 0 <= lid < n_layer:
                raise InvalidArgumentError(f"layer {lid} is not a layer of this model (0..{n_layer - 1})")
        for lid in layers:
            if lid in self.captured:
                continue
            if e3_capture_layer_input(self.ptr, lid, &err) != 0:
                raise InvalidArgumentError(err.message.decode("utf-8", "replace"))
            self.captured.add(lid)
            self.capture_grew = True

    def layer_inputs(self, layers):
        """Copies of the captured layer inputs of the last decode: float32 [len(layers), n_tokens, n_embd]."""
        if self.last_outputs is None:
            raise DecodeError("no layer inputs: nothing was decoded on this context since it last changed")
        if not self.last_one_seq and self.n_seq_max > 1:
            raise InvalidArgumentError("layer inputs are read after a batch of one sequence (llama.cpp computes "
                                       "the tokens of several sequences in its own order)")
        cdef int32_t n = len(self.last_outputs)
        cdef int32_t n_embd = llama_model_n_embd(self.model.ptr)
        out = np.empty((len(layers), n, n_embd), dtype=np.float32)
        cdef float[:, :, ::1] dst = out
        cdef const float * src
        cdef int32_t k, lid
        for k, lid in enumerate(layers):
            if lid not in self.last_captured:
                raise InvalidArgumentError(f"layer {lid}'s input was not captured at the last decode "
                                           f"(captured: {sorted(self.last_captured)}); call "
                                           f"capture_layer_inputs before decoding")
            src = e3_layer_input(self.ptr, lid)
            memcpy(&dst[k, 0, 0], src, <size_t> n * n_embd * sizeof(float))
        return out

    def cancel_running(self):
        """Make what runs on this context stop at its next check (any thread, no lock)."""
        e3_cancel_set(self.cancel, 1)

    cdef void outputs_lost(self, bint decoded):
        """Something else used this context (a session's draft, a generation): the last
        outputs are gone, and with ``decoded`` it counts as a decode no batch can claim."""
        if decoded:
            self.serial += 1
        self.last_batch = None
        self.last_outputs = None
        self.last_n_outputs = 0

    def is_last_decoded(self, Batch batch):
        return self.last_batch is batch and self.last_version == batch.version

    def logits(self, int32_t i):
        """Read-only float32 view of the logits of batch entry ``i`` of the last decode."""
        self.logits_check(i)
        cdef float * p = llama_get_logits_ith(self.ptr, i)
        if p == NULL:
            raise DecodeError(f"llama.cpp has no logits for entry {i}")
        cdef cnp.npy_intp dims[1]
        dims[0] = self.model.n_vocab
        arr = cnp.PyArray_SimpleNewFromData(1, dims, cnp.NPY_FLOAT32, <void *> p)
        cnp.PyArray_CLEARFLAGS(<cnp.ndarray> arr, cnp.NPY_ARRAY_WRITEABLE)
        cdef _LogitsOwner owner = _LogitsOwner.__new__(_LogitsOwner)
        owner.ctx = self
        self.n_views += 1
        cnp.set_array_base(<cnp.ndarray> arr, owner)
        return arr

    def argmax(self, int32_t i):
        """Index of the largest logit of entry ``i`` (no array is created)."""
        self.logits_check(i)
        cdef float * p = llama_get_logits_ith(self.ptr, i)
        if p == NULL:
            raise DecodeError(f"llama.cpp has no logits for entry {i}")
        cdef int32_t best = e3_logits_argmax(p, self.model.n_vocab)
        if best < 0:
            raise DecodeError(f"the logits of entry {i} contain NaN or +inf (or are all -inf): the model's weights "
                              f"are corrupt or its activations overflow")
        return best

    cdef int logits_check(self, int32_t i) except -1:
        if self.last_outputs is None:
            raise DecodeError("no logits: nothing was decoded on this context since it last changed")
        if i >= 0:
            if i >= len(self.last_outputs) or not self.last_outputs[i]:
                raise InvalidIndexError(f"entry {i} of the last batch did not request logits or does not exist")
        elif -i > self.last_n_outputs:
            raise InvalidIndexError(f"the last batch had {self.last_n_outputs} outputs, cannot index {i}")
        return 0

    def seq_rm(self, int32_t seq_id, int32_t p0, int32_t p1):
        if seq_id != -1:
            self._check_seq(seq_id)
        cdef bint ok
        with nogil:
            ok = llama_memory_seq_rm(llama_get_memory(self.ptr), seq_id, p0, p1)
        self.kv_epoch += 1
        return ok

    def seq_pos_max(self, int32_t seq_id):
        self._check_seq(seq_id)
        return llama_memory_seq_pos_max(llama_get_memory(self.ptr), seq_id)

    def seq_pos_min(self, int32_t seq_id):
        self._check_seq(seq_id)
        return llama_memory_seq_pos_min(llama_get_memory(self.ptr), seq_id)

    def clear(self):
        with nogil:
            llama_memory_clear(llama_get_memory(self.ptr), True)
        self.kv_epoch += 1
        self.outputs_lost(False)

    def state_get(self, int32_t seq_id):
        """The KV cache of sequence ``seq_id`` (< 0: the whole context's state) as llama.cpp writes it."""
        if seq_id >= 0:
            self._check_seq(seq_id)
        cdef size_t n = 0
        cdef _Call call = _Call.begin()
        call.end(e3_state_get(self.ptr, seq_id, NULL, 0, &n, &call.err))
        out = bytearray(n)
        cdef unsigned char * p = out
        call = _Call.begin()
        with nogil:
            rc = e3_state_get(self.ptr, seq_id, <uint8_t *> p, n, &n, &call.err)
        call.end(rc)
        return bytes(out[:n])

    def state_set(self, const unsigned char[::1] data, int32_t seq_id):
        """Restore what :meth:`state_get` wrote (the caller has checked it is this context's)."""
        if seq_id >= 0:
            self._check_seq(seq_id)
        if self.n_views > 0:
            raise SessionStateError("logits views of this context are alive; loading a state would overwrite "
                                    "them. Delete them (or copy them) first")
        cdef int rc
        cdef size_t n = data.shape[0]
        cdef const uint8_t * p = <const uint8_t *> &data[0] if n else NULL
        cdef _Call call = _Call.begin()
        with nogil:
            rc = e3_state_set(self.ptr, seq_id, p, n, &call.err)
        self.kv_epoch += 1
        self.outputs_lost(True)
        call.end(rc)
