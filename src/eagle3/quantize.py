"""Quantize a GGUF model with llama.cpp's own quantizer (what ``llama-quantize`` runs)."""

from __future__ import annotations

import os
import secrets

from eagle3 import _core
from eagle3._validate import as_int
from eagle3.errors import ArgumentTypeError, InvalidArgumentError
from eagle3.model import Model

# llama-quantize's names for the file types that need no importance matrix,
# with their enum llama_ftype values (include/llama.h).
FILE_TYPES = {
    "F32": 0, "F16": 1, "BF16": 32, "Q8_0": 7,
    "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9,
    "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13,
    "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18,
    "IQ4_NL": 25, "IQ4_XS": 30,
}


def quantize(src: str | os.PathLike, dst: str | os.PathLike, file_type: str, *, pure: bool = False,
             threads: int = 0, allow_requantize: bool = False) -> None:
    """Write ``src`` quantized to ``file_type`` (a name of :data:`FILE_TYPES`,
    such as ``"Q4_K_M"``) as ``dst``.

    Mixed types (``Q4_K_M`` and the like) keep some tensors at a higher
    precision as ``llama-quantize`` does; ``pure=True`` gives every matrix
    ``file_type``'s base type (tensors whose rows do not fit its blocks fall
    back to another type either way). ``threads=0`` uses every CPU.
    A source that is already quantized is refused unless
    ``allow_requantize=True`` (requantizing loses more than quantizing from
    f16 or f32 does).
    The source must load as a model; a failure raises :class:`ModelLoadError`
    and leaves ``dst`` as it was: the quantizer writes a temporary file beside
    it, renamed to ``dst`` only once complete.
    """
    if not isinstance(file_type, str):
        raise ArgumentTypeError(f"file_type must be a str, got {type(file_type).__name__}")
    ftype = FILE_TYPES.get(file_type.upper())
    if ftype is None:
        raise InvalidArgumentError(f"file_type {file_type!r} is not one of {', '.join(FILE_TYPES)}")
    threads = as_int(threads, "threads", 0, 1024)
    try:
        src, dst = os.fspath(src), os.fspath(dst)
    except TypeError:
        raise ArgumentTypeError("src and dst must be str or os.PathLike") from None
    if os.path.abspath(src) == os.path.abspath(dst):
        raise InvalidArgumentError("dst must differ from src (the source stays mapped while it is read)")
    if not os.path.isdir(os.path.dirname(os.path.abspath(dst))):
        raise InvalidArgumentError(f"{dst}: its folder does not exist")
    with Model(src, vocab_only=True):  # every check a model load makes, before llama.cpp reads tensors
        pass
    # created by the quantizer itself, so that it gets the permissions any new file gets
    partial = f"{os.path.abspath(dst)}.{os.getpid()}-{secrets.token_hex(4)}.partial"
    try:
        _core.quantize_file(src, partial, ftype, threads, bool(pure), bool(allow_requantize), file_type)
        os.replace(partial, dst)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
