# Included by _core.pyx: models (loaded here or on RPC servers), their vocabularies, chat templates and grammars.

# ---------------------------------------------------------------------------
# Remote devices (llama.cpp's RPC backend)
# ---------------------------------------------------------------------------

RPC_AVAILABLE = bool(e3_rpc_available())
MAX_DEVICES = llama_max_devices()


def rpc_serve(str endpoint, cache_dir, int32_t n_threads):
    """Serve this machine's CPU to RPC clients at ``endpoint`` until ``rpc_stop()``."""
    cdef bytes ep = endpoint.encode()
    cdef bytes cache = _fs_path(cache_dir) if cache_dir is not None else None
    cdef const char * cep = ep
    cdef const char * ccache = NULL
    if cache is not None:
        ccache = cache
    cdef int rc
    cdef _Call call = _Call.begin()
    with nogil:
        rc = e3_rpc_serve(cep, ccache, n_threads, &call.err)
    call.end(rc)


def rpc_stop():
    """Make ``rpc_serve()`` return (from any thread)."""
    e3_rpc_stop()


cdef object _remote_failure(ModelHandle model):
    """(endpoint, message) of the first failed connection among the model's, or None."""
    cdef e3_error err
    if model.endpoints and model.pid != os.getpid():
        return (model.endpoints[0].decode(), "the model was loaded before this process was forked: its connections "
                "are the parent's; load it again here (a server serves one client at a time)")
    for ep in model.endpoints:
        if e3_rpc_failed(ep, &err):
            return ep.decode(), err.message.decode("utf-8", "replace")
    return None


cdef int _check_remote(ContextHandle ctx) except -1:
    """Raise RemoteError when a server that ``ctx``'s model uses has failed."""
    if ctx.model.endpoints:
        with nogil:
            llama_synchronize(ctx.ptr)  # its answers are in: a failure is known
        failed = _remote_failure(ctx.model)
        if failed is not None:
            raise RemoteError(failed[0], failed[1])
    return 0


cdef class ModelHandle:
    """Owns a ``llama_model``."""

    cdef llama_model * ptr
    cdef const llama_vocab * vocab
    cdef readonly int32_t n_vocab
    cdef readonly bint has_vocab
    cdef readonly tuple endpoints            # the RPC servers (bytes "host:port") its layers may be on
    cdef readonly long pid                   # the process that loaded it (a forked child cannot use its servers)
    cdef object __weakref__

    def __cinit__(self, path, int n_gpu_layers=0, bint load_mtp=False, bint vocab_only=False,
                  bint check_tensors=False, use_mmap=None, bint use_mlock=False, tuple rpc_servers=(),
                  tensor_split=None, bint repack=True):
        cdef bytes bpath = _fs_path(path)
        cdef llama_model_params params = llama_model_default_params()
        self.endpoints = tuple(ep.encode() for ep in rpc_servers)
        self.pid = os.getpid()
        cdef ggml_backend_dev_t devices[65]  # (at most MAX_DEVICES, llama.cpp's 16, and a NULL)
        cdef float split[64]
        cdef int32_t n_dev = 0, got
        cdef e3_error err
        cdef const char * cep
        cdef int32_t room
        for ep in self.endpoints:
            cep = ep
            room = <int32_t> MAX_DEVICES - n_dev
            with nogil:
                got = e3_rpc_devices(cep, &devices[n_dev], room, &err)
            if got < 0:
                raise ModelLoadError(f"{path!s}: {err.message.decode('utf-8', 'replace')}")
            n_dev += got
        devices[n_dev] = NULL
        if self.endpoints:
            params.devices = devices
        if tensor_split is not None:
            if len(tensor_split) != n_dev:
                raise InvalidArgumentError(f"tensor_split has {len(tensor_split)} shares; the RPC servers have "
                                           f"{n_dev} devices (one share each, in order)")
            for i in range(MAX_DEVICES):
                split[i] = tensor_split[i] if i < n_dev else 0.0
            params.tensor_split = split
        params.n_gpu_layers = n_gpu_layers
        params.load_mtp = load_mtp
        params.vocab_only = vocab_only
        params.check_tensors = check_tensors
        params.use_extra_bufts = repack
        if use_mmap is None:  # llama.cpp's choice (mapping the file, on a CPU)
            params.load_mode = LLAMA_LOAD_MODE_MLOCK if use_mlock else LLAMA_LOAD_MODE_AUTO
        elif use_mmap:
            params.load_mode = LLAMA_LOAD_MODE_MMAP_MLOCK if use_mlock else LLAMA_LOAD_MODE_MMAP
        else:
            params.load_mode = LLAMA_LOAD_MODE_MLOCK if use_mlock else LLAMA_LOAD_MODE_NONE
        cdef const char * cpath = bpath
        cdef llama_model * m
        _Call.begin()
        with nogil:
            m = llama_model_load_from_file(cpath, params)
        failed = _remote_failure(self)
        if failed is not None:  # (llama.cpp loaded what it could not send, or gave up)
            if m != NULL:
                with nogil:
                    llama_model_free(m)
            raise ModelLoadError(f"{path!s}: {failed[1]}")
        if m == NULL:
            raise ModelLoadError(_with_log(f"{path!s}: llama.cpp could not load it"))
        self.ptr = m
        self.vocab = llama_model_get_vocab(m)
        self.n_vocab = llama_vocab_n_tokens(self.vocab)
        self.has_vocab = llama_vocab_type(self.vocab) != LLAMA_VOCAB_TYPE_NONE

    def __dealloc__(self):
        if self.ptr != NULL:
            llama_model_free(self.ptr)
            self.ptr = NULL

    def layer_devices(self):
        """[(layer, device name, description)] for each layer llama.cpp placed (-1: the output layer)."""
        cdef const char * name
        cdef const char * desc
        placed = []
        for il in range(-1, llama_model_n_layer(self.ptr)):
            if e3_model_layer_device(self.ptr, il, &name, &desc) == 0:
                placed.append((il, name.decode(), desc.decode()))
        return placed

    def device_bytes(self):
        """{device name: bytes of weights on it}."""
        cdef const char * names[64]
        cdef uint64_t sizes[64]
        cdef int32_t n = min(e3_model_device_bytes(self.ptr, names, sizes, 64), 64)
        return {names[i].decode(): sizes[i] for i in range(n)}

    @property
    def n_layer(self):
        return llama_model_n_layer(self.ptr)

    @property
    def n_layer_nextn(self):
        return llama_model_n_layer_nextn(self.ptr)

    @property
    def n_embd(self):
        return llama_model_n_embd(self.ptr)

    # llama.cpp reads per-layer head counts from layer 0 and aborts when there
    # are no layers (a vocab_only load has none)
    @property
    def n_head(self):
        return llama_model_n_head(self.ptr) if llama_model_n_layer(self.ptr) > 0 else 0

    @property
    def n_head_kv(self):
        return llama_model_n_head_kv(self.ptr) if llama_model_n_layer(self.ptr) > 0 else 0

    @property
    def n_ctx_train(self):
        return llama_model_n_ctx_train(self.ptr)

    @property
    def n_params(self):
        return llama_model_n_params(self.ptr)

    @property
    def size(self):
        return llama_model_size(self.ptr)

    @property
    def bos(self):
        return llama_vocab_bos(self.vocab)

    @property
    def eos(self):
        return llama_vocab_eos(self.vocab)

    @property
    def add_bos(self):
        return llama_vocab_get_add_bos(self.vocab)

    def description(self):
        cdef char buf[256]
        llama_model_desc(self.ptr, buf, sizeof(buf))
        return buf.decode("utf-8", "replace")

    def is_eog(self, int32_t token):
        return llama_vocab_is_eog(self.vocab, token)

    cdef int32_t _tokenize(self, const char * text, int32_t n_bytes, int32_t[::1] out, bint add_special,
                           bint parse_special) except? -1:
        cdef int32_t n = 0
        cdef int rc
        cdef _Call call = _Call.begin()
        with nogil:
            rc = e3_tokenize(self.vocab, text, n_bytes, &out[0], <int32_t> out.shape[0], add_special, parse_special,
                             &n, &call.err)
        call.end(rc)
        return n

    def chat_template(self):
        """The model's chat template (tokenizer.chat_template), or None."""
        cdef const char * t = llama_model_chat_template(self.ptr, NULL)
        return t.decode("utf-8", "replace") if t != NULL else None

    def apply_chat_template(self, list messages, bint add_generation_prompt, str template=None):
        """The prompt text of ``messages`` (role, content) pairs through the chat template."""
        roles = [role.encode("utf-8") for role, _ in messages]
        contents = [content.encode("utf-8") for _, content in messages]
        cdef Py_ssize_t n = len(messages), i
        cdef const char ** role_ptrs = <const char **> malloc(max(n, 1) * sizeof(char *))
        cdef const char ** content_ptrs = <const char **> malloc(max(n, 1) * sizeof(char *))
        if role_ptrs == NULL or content_ptrs == NULL:
            free(role_ptrs)
            free(content_ptrs)
            raise MemoryError()
        for i in range(n):
            role_ptrs[i] = <const char *> (<bytes> roles[i])
            content_ptrs[i] = <const char *> (<bytes> contents[i])
        tmpl = template.encode("utf-8") if template else None
        cdef _Call call = _Call.begin()
        cdef char * out = e3_chat_apply(self.ptr, <const char *> tmpl if tmpl is not None else NULL, role_ptrs,
                                        content_ptrs, <int32_t> n, add_generation_prompt, &call.err)
        free(role_ptrs)
        free(content_ptrs)
        return _shim_string(out, &call.err)

    def tokenize(self, str text, bint add_special, bint parse_special):
        cdef bytes data = text.encode("utf-8")
        cdef char * cdata
        cdef Py_ssize_t n_bytes
        PyBytes_AsStringAndSize(data, &cdata, &n_bytes)
        if n_bytes >= 2**31 - 16:
            raise InvalidArgumentError("text too long to tokenize")
        out = np.empty(<int32_t> n_bytes + 8, dtype=np.int32)
        cdef int32_t n = self._tokenize(cdata, <int32_t> n_bytes, out, add_special, parse_special)
        if n == -2**31:
            raise InvalidArgumentError("tokenization overflowed int32")
        if n < 0:  # more tokens than bytes (special tokens added): as many as it asked for
            out = np.empty(-n, dtype=np.int32)
            n = self._tokenize(cdata, <int32_t> n_bytes, out, add_special, parse_special)
            if n < 0:
                raise Eagle3Error("tokenization failed")
        out = out[:n].copy()
        if n and (out.min() < 0 or out.max() >= self.n_vocab):
            raise ModelLoadError(f"this model's tokenizer produced token ids outside its vocabulary (0.."
                                 f"{self.n_vocab - 1}): {int(out.min())}..{int(out.max())}")
        return out

    def detokenize(self, const int32_t[::1] tokens, bint remove_special, bint unparse_special):
        cdef int32_t n = <int32_t> tokens.shape[0]
        cdef int32_t i
        for i in range(n):
            if tokens[i] < 0 or tokens[i] >= self.n_vocab:
                raise InvalidArgumentError(f"token {tokens[i]} is not in this vocabulary (0..{self.n_vocab - 1})")
        if n == 0:
            return ""
        cdef int32_t cap = n * 8 + 16
        cdef bytearray buf = bytearray(cap)
        cdef char * p = buf
        cdef int32_t got = 0
        cdef int rc
        cdef _Call call = _Call.begin()
        with nogil:
            rc = e3_detokenize(self.vocab, &tokens[0], n, p, cap, remove_special, unparse_special, &got, &call.err)
        call.end(rc)
        if got < 0:
            cap = -got + 1
            buf = bytearray(cap)
            p = buf
            call = _Call.begin()
            with nogil:
                rc = e3_detokenize(self.vocab, &tokens[0], n, p, cap, remove_special, unparse_special, &got,
                                   &call.err)
            call.end(rc)
            if got < 0:
                raise Eagle3Error("detokenization failed")
        return bytes(buf[:got]).decode("utf-8", "replace")


def json_schema_to_grammar(str schema_json):
    """A GBNF grammar for a JSON schema (given as JSON text), by common/json-schema-to-grammar."""
    data = schema_json.encode("utf-8")
    cdef _Call call = _Call.begin()
    return _shim_string(e3_json_schema_to_grammar(data, &call.err), &call.err)
