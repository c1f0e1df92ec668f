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

from eagle3._validate import int32_array
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
# The rest, one file per concern (textual includes: one module, one namespace)
# ---------------------------------------------------------------------------

include "_core_calls.pxi"
include "_core_gguf.pxi"
include "_core_model.pxi"
include "_core_context.pxi"
include "_core_session.pxi"
include "_core_pair.pxi"
