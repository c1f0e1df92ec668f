# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, embedsignature=True
"""Low-level objects over llama.cpp and the speculative shim.

Each handle owns one raw pointer and holds strong references to the handles
it depends on, so the C objects are always freed in the order llama.cpp needs
(session, draft context, draft model, target context, target model) however
Python collects them. The public classes in the pure-Python layer wrap these
handles and add lifetimes, locking and context managers.
"""

from cpython.bytes cimport PyBytes_AsStringAndSize
from cpython.exc cimport PyErr_CheckSignals, PyErr_SetInterrupt
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy
from libc.stdlib cimport malloc, free

import os
import threading
from collections import namedtuple

cimport numpy as cnp
import numpy as np

from eagle3._llama cimport *
from eagle3._shim cimport *

from eagle3.errors import (
    ArgumentTypeError,
    BadSeqIdError,
    BatchError,
    ContextError,
    DecodeError,
    Eagle3Error,
    InvalidArgumentError,
    InvalidConfigError,
    InvalidIndexError,
    ModelLoadError,
    ProcessError,
    RemoteError,
    SessionInitError,
    SessionStateError,
)

cnp.import_array()
llama_backend_init()


# ---------------------------------------------------------------------------
# Logging bridge: C messages -> a Python callable set by eagle3._logging
# ---------------------------------------------------------------------------

cdef object _log_sink = None
cdef object _log_explain = None   # returns the error lines logged on this thread since its last call
cdef bint _log_live = False


cdef void _log_trampoline(int level, const char * text, void * user_data) noexcept nogil:
    if not _log_live:
        return
    with gil:
        sink = _log_sink
        if sink is not None:
            try:
                sink(level, text.decode("utf-8", "replace"))
            except KeyboardInterrupt:
                PyErr_SetInterrupt()  # Ctrl-C landed in the sink: raise it where the call returns
            except BaseException:
                pass


def set_log_sink(sink, int common_verbosity, explain=None):
    """Route llama.cpp, ggml and common/ messages to ``sink(level, line)``; None stops it.
    ``explain()`` returns (and forgets) the error lines logged on the calling thread."""
    global _log_sink, _log_live, _log_explain
    _log_sink = sink
    _log_explain = explain
    _log_live = sink is not None
    if _log_live:
        e3_log_set(_log_trampoline, NULL)
    else:
        e3_log_set(NULL, NULL)
    e3_log_set_common_verbosity(common_verbosity)


cdef inline void _log_reset() except *:
    # before a call that can fail: older lines do not explain it
    if _log_explain is not None:
        _log_explain()


cdef class _SigintWatch:
    """While alive (on the main thread), Ctrl-C sets ``cancel`` so llama.cpp stops
    what runs on the context; Python's own handler still runs and raises later."""
    cdef bint active

    def __cinit__(self):
        self.active = False

    cdef _SigintWatch start(self, e3_cancel * cancel):
        if threading.current_thread() is threading.main_thread():
            e3_cancel_watch_sigint(cancel)
            self.active = True
        return self

    cdef void stop(self):
        if self.active:
            e3_cancel_unwatch_sigint()
            self.active = False

    def __dealloc__(self):
        self.stop()


cdef str _with_log(str message):
    """``message`` and what llama.cpp logged about it, if anything."""
    logged = _log_explain() if _log_explain is not None else ""
    return f"{message} (llama.cpp: {logged})" if logged else message


def eagle3_target_support(str arch):
    """0: ``arch`` cannot be an EAGLE-3 target; 1: target layer ids < n_layer; 2: ids <= n_layer."""
    return e3_eagle3_target_support(arch.encode())


def system_info():
    """llama.cpp's description of the CPU features and backends in use."""
    return llama_print_system_info().decode("utf-8", "replace")


MultiTokenCounts = namedtuple("MultiTokenCounts", ["products", "row_loads"])


def multi_token_counts():
    """What the CPU's multi-token matrix kernels did since the process started:
    ``MultiTokenCounts(products, row_loads)``, the weight-row by token products
    they computed and the weight rows they loaded for them (a pass of k
    tokens loads each row once per group of up to four tokens). ``None``
    where this build has no such kernels."""
    cdef uint64_t products = 0, row_loads = 0
    if not e3_multi_token_counts(&products, &row_loads):
        return None
    return MultiTokenCounts(products, row_loads)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

cdef object _as_int32_array(object values, str what):
    """Integer input as a C-contiguous int32 array (no silent casts from floats)."""
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int32)
    if arr.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{what} must be integers, got dtype {arr.dtype}")
    if arr.dtype != np.int32 and (arr.min() < -2**31 or arr.max() >= 2**31):
        raise InvalidArgumentError(f"{what} do not fit in int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


# ---------------------------------------------------------------------------
# GGUF metadata, read through ggml's C gguf API without loading weights
# ---------------------------------------------------------------------------

cdef object _gguf_scalar(const gguf_context * g, int64_t i, gguf_type t):
    cdef const void * p = gguf_get_val_data(g, i)
    if t == GGUF_TYPE_UINT8:
        return (<const unsigned char *> p)[0]
    if t == GGUF_TYPE_INT8:
        return (<const signed char *> p)[0]
    if t == GGUF_TYPE_UINT16:
        return (<const unsigned short *> p)[0]
    if t == GGUF_TYPE_INT16:
        return (<const short *> p)[0]
    if t == GGUF_TYPE_UINT32:
        return (<const uint32_t *> p)[0]
    if t == GGUF_TYPE_INT32:
        return (<const int32_t *> p)[0]
    if t == GGUF_TYPE_UINT64:
        return (<const uint64_t *> p)[0]
    if t == GGUF_TYPE_INT64:
        return (<const int64_t *> p)[0]
    if t == GGUF_TYPE_FLOAT32:
        return (<const float *> p)[0]
    if t == GGUF_TYPE_FLOAT64:
        return (<const double *> p)[0]
    if t == GGUF_TYPE_BOOL:
        return (<const int8_t *> p)[0] != 0
    return None


_GGUF_NUMPY = {
    GGUF_TYPE_UINT8: np.uint8, GGUF_TYPE_INT8: np.int8, GGUF_TYPE_UINT16: np.uint16,
    GGUF_TYPE_INT16: np.int16, GGUF_TYPE_UINT32: np.uint32, GGUF_TYPE_INT32: np.int32,
    GGUF_TYPE_UINT64: np.uint64, GGUF_TYPE_INT64: np.int64, GGUF_TYPE_FLOAT32: np.float32,
    GGUF_TYPE_FLOAT64: np.float64, GGUF_TYPE_BOOL: np.bool_,
}

_GGUF_TYPE_NAMES = {
    GGUF_TYPE_UINT8: "uint8", GGUF_TYPE_INT8: "int8", GGUF_TYPE_UINT16: "uint16", GGUF_TYPE_INT16: "int16",
    GGUF_TYPE_UINT32: "uint32", GGUF_TYPE_INT32: "int32", GGUF_TYPE_FLOAT32: "float32", GGUF_TYPE_BOOL: "bool",
    GGUF_TYPE_STRING: "string", GGUF_TYPE_ARRAY: "array", GGUF_TYPE_UINT64: "uint64", GGUF_TYPE_INT64: "int64",
    GGUF_TYPE_FLOAT64: "float64",
}


cdef tuple _gguf_value(const gguf_context * g, int64_t i):
    """Key ``i``'s value (numeric arrays as read-only NumPy arrays, string arrays as tuples) and type name."""
    cdef gguf_type t = gguf_get_kv_type(g, i)
    cdef gguf_type at
    cdef int64_t j, n
    if t == GGUF_TYPE_STRING:
        return gguf_get_val_str(g, i).decode("utf-8", "replace"), "string"
    if t != GGUF_TYPE_ARRAY:
        return _gguf_scalar(g, i, t), _GGUF_TYPE_NAMES.get(t, "?")
    at = gguf_get_arr_type(g, i)
    n = <int64_t> gguf_get_arr_n(g, i)
    type_name = f"array[{_GGUF_TYPE_NAMES.get(at, '?')}]"
    if at == GGUF_TYPE_STRING:
        return tuple(gguf_get_arr_str(g, i, j).decode("utf-8", "replace") for j in range(n)), type_name
    if at not in _GGUF_NUMPY:
        return None, type_name
    dtype = np.dtype(_GGUF_NUMPY[at])
    if n == 0:
        arr = np.empty(0, dtype=dtype)
    else:
        arr = np.frombuffer((<const char *> gguf_get_arr_data(g, i))[:n * dtype.itemsize], dtype=dtype).copy()
    arr.flags.writeable = False
    return arr, type_name


TensorInfo = namedtuple("TensorInfo", "shape type offset nbytes")


def read_gguf(path):
    """Read a GGUF file's header: ``(metadata, types, tensors)``.

    ``metadata`` maps keys to Python values (numeric arrays as read-only NumPy
    arrays, string arrays as tuples); ``types`` maps keys to GGUF type names
    (``"array[int32]"`` for arrays); ``tensors`` maps tensor names to
    :class:`TensorInfo` ``(shape, type, offset, nbytes)``: the shape in ggml
    order (ne0 first), the ggml type name, and where its data lies in the file.
    Raises :class:`ModelLoadError` if the file is not a readable GGUF file.
    """
    cdef bytes bpath = _fs_path(path)
    cdef gguf_init_params params
    params.no_alloc = True
    params.ctx = NULL
    cdef const char * cpath = bpath
    cdef gguf_context * g
    with nogil:
        g = gguf_init_from_file(cpath, params)
    if g == NULL:
        raise ModelLoadError(f"{path!s}: not a readable GGUF file (missing, truncated or corrupt)")
    cdef int64_t i, j
    cdef const int64_t * ne
    metadata = {}
    types = {}
    tensors = {}
    try:
        for i in range(gguf_get_n_kv(g)):
            key = gguf_get_key(g, i).decode("utf-8", "replace")
            metadata[key], types[key] = _gguf_value(g, i)
        for i in range(gguf_get_n_tensors(g)):
            name = gguf_get_tensor_name(g, i).decode("utf-8", "replace")
            ne = gguf_get_tensor_ne(g, i)
            shape = [ne[j] for j in range(GGML_MAX_DIMS)]
            while len(shape) > 1 and shape[len(shape) - 1] == 1:
                shape.pop()
            tensors[name] = TensorInfo(tuple(shape), ggml_type_name(gguf_get_tensor_type(g, i)).decode(),
                                       gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i),
                                       gguf_get_tensor_size(g, i))
    finally:
        gguf_free(g)
    return metadata, types, tensors


def quantize_file(src, dst, int ftype, int nthread, bint pure, bint allow_requantize, str type_name):
    """llama.cpp's own quantizer (``llama_model_quantize``) without the GIL;
    raises :class:`ModelLoadError` with llama.cpp's reason when it fails."""
    cdef bytes bsrc = _fs_path(src)
    cdef bytes bdst = _fs_path(dst)
    cdef const char * csrc = bsrc
    cdef const char * cdst = bdst
    cdef llama_model_quantize_params params = llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = nthread
    params.pure = pure
    params.allow_requantize = allow_requantize
    cdef uint32_t rc
    _log_reset()
    with nogil:
        rc = llama_model_quantize(csrc, cdst, &params)
    if rc != 0:
        raise ModelLoadError(_with_log(f"{src!s}: llama.cpp could not quantize it to {type_name}"))


cdef bytes _fs_path(path):
    return os.fsencode(os.fspath(path))


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------

cdef str _shim_string(char * out, const e3_error * err):
    """The text of a string the shim allocated (freed here); NULL raises the shim's error."""
    if out == NULL:
        _raise_shim(err)
    try:
        return out.decode("utf-8", "replace")
    finally:
        e3_free_string(out)


def json_schema_to_grammar(str schema_json):
    """A GBNF grammar for a JSON schema (given as JSON text), by common/json-schema-to-grammar."""
    cdef e3_error err
    data = schema_json.encode("utf-8")
    _log_reset()
    return _shim_string(e3_json_schema_to_grammar(data, &err), &err)


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
    cdef e3_error err
    cdef int rc
    with nogil:
        rc = e3_rpc_serve(cep, ccache, n_threads, &err)
    _check(rc, &err)


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
                  tensor_split=None):
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
        if use_mmap is None:  # llama.cpp's choice (mapping the file, on a CPU)
            params.load_mode = LLAMA_LOAD_MODE_MLOCK if use_mlock else LLAMA_LOAD_MODE_AUTO
        elif use_mmap:
            params.load_mode = LLAMA_LOAD_MODE_MMAP_MLOCK if use_mlock else LLAMA_LOAD_MODE_MMAP
        else:
            params.load_mode = LLAMA_LOAD_MODE_MLOCK if use_mlock else LLAMA_LOAD_MODE_NONE
        cdef const char * cpath = bpath
        cdef llama_model * m
        _log_reset()
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
        cdef e3_error err
        cdef int rc
        with nogil:
            rc = e3_tokenize(self.vocab, text, n_bytes, &out[0], <int32_t> out.shape[0], add_special, parse_special,
                             &n, &err)
        _check(rc, &err)
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
        cdef e3_error err
        _log_reset()
        cdef char * out = e3_chat_apply(self.ptr, <const char *> tmpl if tmpl is not None else NULL, role_ptrs,
                                        content_ptrs, <int32_t> n, add_generation_prompt, &err)
        free(role_ptrs)
        free(content_ptrs)
        return _shim_string(out, &err)

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
        cdef e3_error err
        cdef int rc
        with nogil:
            rc = e3_detokenize(self.vocab, &tokens[0], n, p, cap, remove_special, unparse_special, &got, &err)
        _check(rc, &err)
        if got < 0:
            cap = -got + 1
            buf = bytearray(cap)
            p = buf
            with nogil:
                rc = e3_detokenize(self.vocab, &tokens[0], n, p, cap, remove_special, unparse_special, &got, &err)
            _check(rc, &err)
            if got < 0:
                raise Eagle3Error("detokenization failed")
        return bytes(buf[:got]).decode("utf-8", "replace")


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
        arr = _as_int32_array(tokens, "tokens")
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
        arr = _as_int32_array(tokens, "tokens")
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
        tok = _as_int32_array(tokens, "tokens")
        pos = _as_int32_array(positions, "positions")
        k = tok.shape[0]
        seq = np.broadcast_to(_as_int32_array(seq_ids, "seq_ids"), (k,)) if k else np.empty(0, np.int32)
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
    cdef public int n_views                   # live logits views into that buffer
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
        _log_reset()
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
        cdef e3_error err
        cdef int status
        _log_reset()
        e3_cancel_set(self.cancel, 0)  # a cancel is for what runs: not this decode
        cdef _SigintWatch watch = _SigintWatch().start(self.cancel)
        with nogil:
            status = e3_decode(self.ptr, self.bext, &rc, &err)
        watch.stop()
        if status != 0:
            rc = -3  # (llama.cpp threw: its message says why)
        if n_out > self.out_capacity:
            self.out_capacity = n_out
        try:
            _check_remote(self)
        except RemoteError:
            self.outputs_lost(False)
            raise
        if rc != 0:
            self.outputs_lost(False)
            PyErr_CheckSignals()  # Ctrl-C stopped it: KeyboardInterrupt, not a DecodeError
            reason = {1: "no KV cache slot for the batch (the context is full; clear or seq_rm first)",
                      2: "aborted", -1: "invalid batch"}.get(rc, "computation failed")
            if status != 0:
                reason = err.message.decode("utf-8", "replace")
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
        cdef e3_error err
        _check(e3_state_get(self.ptr, seq_id, NULL, 0, &n, &err), &err)
        out = bytearray(n)
        cdef unsigned char * p = out
        with nogil:
            rc = e3_state_get(self.ptr, seq_id, <uint8_t *> p, n, &n, &err)
        _check(rc, &err)
        return bytes(out[:n])

    def state_set(self, const unsigned char[::1] data, int32_t seq_id):
        """Restore what :meth:`state_get` wrote (the caller has checked it is this context's)."""
        if seq_id >= 0:
            self._check_seq(seq_id)
        if self.n_views > 0:
            raise SessionStateError("logits views of this context are alive; loading a state would overwrite "
                                    "them. Delete them (or copy them) first")
        cdef e3_error err
        cdef int rc
        cdef size_t n = data.shape[0]
        cdef const uint8_t * p = <const uint8_t *> &data[0] if n else NULL
        _log_reset()
        with nogil:
            rc = e3_state_set(self.ptr, seq_id, p, n, &err)
        self.kv_epoch += 1
        self.outputs_lost(True)
        _check(rc, &err)


# ---------------------------------------------------------------------------
# Errors from the shim: one table, and the C message always kept
# ---------------------------------------------------------------------------

_STATUS_ERRORS = {
    E3_ERR_INIT: SessionInitError,
    E3_ERR_PROCESS: ProcessError,
    E3_ERR_ARG: InvalidArgumentError,
    E3_ERR_STATE: SessionStateError,
    E3_ERR_DECODE: DecodeError,
    E3_ERR_CONFIG: InvalidConfigError,
    E3_ERR_EXCEPTION: Eagle3Error,
}


cdef object _raise_shim(const e3_error * err):
    if err.status == E3_ERR_SEQ:
        raise BadSeqIdError(err.seq_id, err.n_seq)
    raise _STATUS_ERRORS.get(err.status, Eagle3Error)(_with_log(err.message.decode("utf-8", "replace")))


cdef inline int _check(int rc, const e3_error * err) except -1:
    if rc < 0:
        _raise_shim(err)
    return rc


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
    cdef e3_error err
    _check(e3_spec_check_config(&c.cfg, &err), &err)


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
# Speculative session, generation engine, and the pair that drives them
# ---------------------------------------------------------------------------

cdef class SessionHandle:
    """Owns an ``e3_spec`` (a ``common_speculative`` and its bookkeeping)."""

    cdef e3_spec * ptr
    cdef readonly ContextHandle target_ctx, draft_ctx
    cdef e3_spec_info info

    def __cinit__(self, str kind, ContextHandle target, ContextHandle draft, tuple config, dict ngram=None):
        cdef _SpecConfig c = _SpecConfig(kind, *config, ngram)
        cdef e3_error err
        cdef llama_context * dptr = draft.ptr if draft is not None else NULL
        _log_reset()
        with nogil:
            self.ptr = e3_spec_create(target.ptr, dptr, &c.cfg, &err)
        if self.ptr == NULL and err.status == E3_ERR_INIT:
            raise SessionInitError(_with_log(err.message.decode("utf-8", "replace")), kind=kind)
        if self.ptr == NULL:
            _raise_shim(&err)
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
        cdef e3_error err
        self.ptr = e3_engine_create(target.ptr, session.ptr if session is not None else NULL, target.cancel, &err)
        if self.ptr == NULL:
            _raise_shim(&err)
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
        sids = _as_int32_array(seq_ids, "seq_ids")
        if sids.shape[0] != n or n == 0:
            raise InvalidArgumentError("one sequence id per prompt, and at least one prompt")
        arrays = [_as_int32_array(p, "prompt") for p in prompts]
        stops = _as_int32_array(list(s.stop_tokens), "stop_tokens") if s.stop_tokens else np.zeros(1, np.int32)
        encoded = [x.encode("utf-8") for x in s.stop_strings]
        bias = np.zeros(max(len(s.logit_bias), 1), dtype=_LOGIT_BIAS_DTYPE)
        for i, (token, value) in enumerate(s.logit_bias):
            bias[i] = (token, value)
        grammar = s.grammar.encode("utf-8") if s.grammar else None
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
        self.req.sampling.temperature = s.temperature
        self.req.sampling.top_k = s.top_k
        self.req.sampling.top_p = s.top_p
        self.req.sampling.min_p = s.min_p
        self.req.sampling.typical_p = s.typical_p
        self.req.sampling.penalty_last_n = s.penalty_last_n
        self.req.sampling.repeat_penalty = s.repeat_penalty
        self.req.sampling.frequency_penalty = s.frequency_penalty
        self.req.sampling.presence_penalty = s.presence_penalty
        cdef e3_logit_bias[::1] bv = bias
        self.req.sampling.logit_bias = &bv[0]
        self.req.sampling.n_logit_bias = <int32_t> len(s.logit_bias)
        self.req.sampling.grammar = <const char *> grammar if grammar is not None else NULL
        self.req.sampling.verify = E3_VERIFY_REJECTION if s.verify == "rejection" else E3_VERIFY_MATCH
        self.req.sampling.seed = s.seed
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

    cdef int _check_remote(self) except -1:
        _check_remote(self.target_ctx)
        if self.draft_ctx is not None:
            _check_remote(self.draft_ctx)
        return 0

    cdef int _spec_done(self, int rc, const e3_error * err) except -1:
        # every session call may decode on the draft context: its logits are gone, and the
        # engine no longer knows what the draft side holds
        self.engine_known = False
        if self.draft_ctx is not None:
            self.draft_ctx.outputs_lost(False)
        self.has_draft_logits = False
        self._check_remote()  # (a dead server explains a failure best, and may have caused none)
        return _check(rc, err)

    cdef int _ready_for_draft_side(self) except -1:
        if self.draft_ctx is not None and self.draft_ctx.n_views > 0:
            raise SessionStateError(
                "logits views of the draft context are alive; the session would overwrite them. Delete them first")
        return 0

    def begin(self, int32_t seq_id, prompt):
        arr = _as_int32_array(prompt, "prompt")
        cdef const int32_t[::1] view = arr
        cdef e3_error err
        _log_reset()
        cdef int rc = e3_spec_begin(self.session.ptr, seq_id, &view[0] if view.shape[0] else NULL,
                                    <int32_t> view.shape[0], &err)
        self._spec_done(rc, &err)

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
        cdef e3_error err
        cdef int rc
        _log_reset()
        with nogil:
            rc = e3_spec_process(self.session.ptr, n, &t[0], &p[0], &s[0], &err)
        self._spec_done(rc, &err)
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
        cdef e3_error err
        cdef int rc
        _log_reset()
        with nogil:
            rc = e3_spec_draft(self.session.ptr, nk, &a[0], &b[0], &c[0], &d[0], &out[0], stride, &L[0], &err)
        self._spec_done(rc, &err)
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
        sid = _as_int32_array(seq_ids, "seq_ids")
        npast = _as_int32_array(n_past, "n_past")
        last = _as_int32_array(id_last, "id_last")
        k = sid.shape[0]
        if npast.shape[0] != k or last.shape[0] != k:
            raise InvalidArgumentError("seq_ids, n_past and id_last must have the same length")
        caps = np.zeros(k, np.int32) if n_max is None else _as_int32_array(n_max, "n_max")
        if caps.shape[0] != k:
            raise InvalidArgumentError("n_max must have one entry per sequence")
        out = np.zeros((k, self.n_draft_max), dtype=np.int32)
        lengths = self._draft(sid, npast, last, caps, out.reshape(-1) if k else np.zeros(1, np.int32),
                              self.n_draft_max)
        return out, lengths

    def accept(self, int32_t seq_id, int32_t n_accepted):
        cdef e3_error err
        _log_reset()
        cdef int rc = e3_spec_accept(self.session.ptr, seq_id, n_accepted, &err)
        self._spec_done(rc, &err)

    def counters(self, int32_t seq_id=-1):
        """The session's counters of one sequence (or all, -1) as a dict of e3_counters' fields."""
        cdef e3_counters c
        cdef _Histograms h = _Histograms(self.n_draft_max)
        cdef e3_error err
        _check(e3_spec_counters(self.session.ptr, seq_id, &c, &h.view, &err), &err)
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
        cdef e3_error err
        cdef int rc
        _log_reset()
        for ctx in (self.target_ctx, self.draft_ctx):  # a cancel is for what runs: not this generation
            if ctx is not None:
                e3_cancel_set((<ContextHandle> ctx).cancel, 0)
        cdef uint64_t setups = e3_engine_setups(self.engine.ptr)
        cdef _SigintWatch watch = _SigintWatch().start(self.target_ctx.cancel)
        with nogil:
            rc = e3_engine_start(self.engine.ptr, &request.req, &err)
        watch.stop()
        if rc < 0 and e3_engine_setups(self.engine.ptr) == setups:
            _raise_shim(&err)  # refused: nothing changed, a generation in progress goes on
        # from here the contexts have changed: a generation in progress is over
        self.engine.outputs = outputs  # C writes into them from now on
        self.engine.logprobs = logprobs
        self.n_generations += 1
        self._engine_used()
        PyErr_CheckSignals()
        self._check_remote()
        _check(rc, &err)
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
        cdef e3_error err
        cdef int rc = 1
        _log_reset()
        cdef _SigintWatch watch = _SigintWatch().start(self.target_ctx.cancel)
        try:
            while rc > 0:
                with nogil:
                    rc = e3_engine_step(self.engine.ptr, &err)
                PyErr_CheckSignals()
                self._check_remote()
                if not until_done:
                    break
        finally:
            watch.stop()
            self._engine_used()
        return _check(rc, &err)

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
        cdef e3_error err
        cdef size_t n = 0
        cdef int rc
        tgt = self.target_ctx.state_get(seq_id)
        dft = self.draft_ctx.state_get(seq_id) if self.draft_ctx is not None else None
        _check(e3_spec_state_get(self.session.ptr, seq_id, NULL, 0, &n, &err), &err)
        spec = bytearray(n)
        cdef unsigned char * sp = spec
        _check(e3_spec_state_get(self.session.ptr, seq_id, <uint8_t *> sp, n, &n, &err), &err)
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
        cdef e3_error err
        cdef int rc
        engine = self._engine()
        self.target_ctx.state_set(tgt, seq_id)
        if self.draft_ctx is not None:
            self.draft_ctx.state_set(dft, seq_id)
        cdef const unsigned char[::1] sv = spec
        rc = e3_spec_state_set(self.session.ptr, seq_id, <const uint8_t *> &sv[0] if sv.shape[0] else NULL,
                               sv.shape[0], &err)
        self._spec_done(rc, &err)
        cdef const int32_t[::1] hv
        if held is None:
            _check(e3_engine_set_held(self.engine.ptr, seq_id, NULL, -1, 0, &err), &err)
        else:
            hv = _as_int32_array(held, "held")
            _check(e3_engine_set_held(self.engine.ptr, seq_id, &hv[0] if hv.shape[0] else NULL,
                                      <int32_t> hv.shape[0], in_step, &err), &err)

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
