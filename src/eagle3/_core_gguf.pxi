# Included by _core.pyx: GGUF metadata without loading weights, and quantization.

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
    _Call.begin()
    with nogil:
        rc = llama_model_quantize(csrc, cdst, &params)
    if rc != 0:
        raise ModelLoadError(_with_log(f"{src!s}: llama.cpp could not quantize it to {type_name}"))
