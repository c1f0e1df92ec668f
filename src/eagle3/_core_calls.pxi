# Included by _core.pyx: native calls (the log bridge, Ctrl-C, _Call, statuses to exceptions) and input conversions.

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


cdef class _Call:
    """The steps around one native call that can fail, written once.

    ``_Call.begin(contexts, cancellable)`` before it: older llama.cpp log lines are
    forgotten (they do not explain this call) and, for a call that runs graphs
    (``cancellable``), Ctrl-C sets the first context's cancel flag. The call fills
    ``err``. ``end(rc)`` after it (and after the caller's own bookkeeping): Ctrl-C's
    KeyboardInterrupt, then a failed remote server of the contexts' models (it explains a
    failure best, and may have caused none), then a negative ``rc`` as the exception its
    e3_status maps to (``_STATUS_ERRORS``)."""
    cdef e3_error err
    cdef tuple contexts
    cdef _SigintWatch watch

    @staticmethod
    cdef _Call begin(tuple contexts=(), bint cancellable=False):
        cdef _Call call = _Call.__new__(_Call)
        call.contexts = tuple(c for c in contexts if c is not None)
        _log_reset()
        if cancellable:
            call.watch = _SigintWatch().start((<ContextHandle> call.contexts[0]).cancel)
        return call

    cdef void returned(self):
        """The native code returned: Ctrl-C no longer reaches it."""
        if self.watch is not None:
            self.watch.stop()

    cdef int check_remote(self) except -1:
        for ctx in self.contexts:
            _check_remote(<ContextHandle> ctx)
        return 0

    cdef int end(self, int rc) except -1:
        self.returned()
        if self.watch is not None:
            PyErr_CheckSignals()
        self.check_remote()
        if rc < 0:
            _raise_shim(&self.err)
        return rc


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

cdef bytes _fs_path(path):
    return os.fsencode(os.fspath(path))


cdef str _shim_string(char * out, const e3_error * err):
    """The text of a string the shim allocated (freed here); NULL raises the shim's error."""
    if out == NULL:
        _raise_shim(err)
    try:
        return out.decode("utf-8", "replace")
    finally:
        e3_free_string(out)


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
