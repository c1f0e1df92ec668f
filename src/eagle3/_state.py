"""The byte format of saved states (``Context.save_state``, ``session.save_state``).

A state is a fixed header, a JSON description and a payload::

    magic (8) | format version (u32) | description length (u32) | payload length (u64)
    | SHA-256 of description + payload (32) | description (UTF-8 JSON) | payload

The description says what was saved (a context or a session kind), from which
models (a digest of each model's metadata, tensor table and a sample of its
bytes) and with which context sizes, and how the payload splits into parts.
Every check runs before any part reaches llama.cpp, whose state readers assert
on some malformed input: a state that is truncated, corrupted, empty or of
another model or pair raises :class:`~eagle3.StateError` and changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any

import numpy as np

from eagle3.errors import ArgumentTypeError, StateError

MAGIC = b"EAGLE3\x00S"
VERSION = 1
_FIXED = struct.Struct("<8sIIQ32s")
_SAMPLES = 64          # file samples in a model's digest
_SAMPLE_BYTES = 4096


def _feed(h, value: Any) -> None:
    """Hash a metadata value without the abbreviations of repr()."""
    if isinstance(value, np.ndarray):
        h.update(f"a{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (list, tuple)):
        h.update(f"l{len(value)}".encode())
        for v in value:
            _feed(h, v)
    elif isinstance(value, bytes):
        h.update(b"b%d" % len(value) + value)
    else:
        text = repr(value).encode("utf-8", "surrogatepass")
        h.update(b"s%d:" % len(text) + text)


def model_digest(model) -> str:
    """A digest of what a model's states depend on: its metadata, its tensor table and 64
    samples of its file's bytes (weights of the same shapes differ there). Cached on the model."""
    cached = getattr(model, "_state_digest", None)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    for key in sorted(model._metadata):
        h.update(key.encode())
        _feed(h, model._metadata[key])
    for name in sorted(model._tensors):
        info = model._tensors[name]
        h.update(f"{name}:{tuple(info.shape)}:{info.type}:{info.nbytes}".encode())
    h.update(f"mtp={bool(model.load_mtp)}".encode())
    size = os.path.getsize(model.path)
    h.update(f"size={size}".encode())
    with open(model.path, "rb") as f:
        for k in range(_SAMPLES):
            f.seek(size * k // _SAMPLES)
            h.update(f.read(_SAMPLE_BYTES))
    model._state_digest = digest = h.hexdigest()
    return digest


def context_identity(ctx) -> dict[str, Any]:
    """What a state of this context's KV cache must match to load into it."""
    return {"model": model_digest(ctx.model), "n_ctx": ctx.n_ctx, "n_seq_max": ctx.n_seq_max,
            "ctx_type": ctx.ctx_type, "other": model_digest(ctx.other.model) if ctx.other is not None else None}


def pack(description: dict[str, Any], parts: list[bytes]) -> bytes:
    description = dict(description, sizes=[len(p) for p in parts])
    head = json.dumps(description, sort_keys=True, separators=(",", ":")).encode()
    payload = b"".join(parts)
    digest = hashlib.sha256(head + payload).digest()
    return _FIXED.pack(MAGIC, VERSION, len(head), len(payload), digest) + head + payload


def unpack(data: Any, what: str) -> tuple[dict[str, Any], list[memoryview]]:
    """Check a state's header and checksum; returns its description and its parts (views)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ArgumentTypeError(f"a state is bytes (what save_state returned), got {type(data).__name__}")
    view = memoryview(data).cast("B")
    if len(view) == 0:
        raise StateError(f"the state is empty: load the bytes {what}.save_state() returned")
    if len(view) < _FIXED.size:
        raise StateError(f"the state is truncated ({len(view)} bytes; its header alone has {_FIXED.size})")
    magic, version, n_head, n_payload, digest = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise StateError("these bytes are not an eagle3 state (no eagle3 state header)")
    if version != VERSION:
        raise StateError(f"the state has format version {version}; this eagle3 reads version {VERSION}")
    expect = _FIXED.size + n_head + n_payload
    if len(view) < expect:
        raise StateError(f"the state is truncated ({len(view)} of its {expect} bytes)")
    if len(view) > expect:
        raise StateError(f"the state has {len(view) - expect} bytes after its end")
    body = view[_FIXED.size:]
    if hashlib.sha256(body).digest() != digest:
        raise StateError("the state is corrupted (its checksum does not match its contents)")
    try:
        description = json.loads(bytes(body[:n_head]).decode("utf-8"))
        sizes = [int(n) for n in description["sizes"]]
    except (ValueError, KeyError, TypeError) as e:
        raise StateError(f"the state's description cannot be read ({e})") from None
    if not isinstance(description, dict) or any(n < 0 for n in sizes) or sum(sizes) != n_payload:
        raise StateError("the state's description does not fit its payload")
    parts, at = [], n_head
    for n in sizes:
        parts.append(body[at:at + n])
        at += n
    return description, parts


def expect(description: dict[str, Any], key: str, value: Any, what: str) -> None:
    """Raise StateError when a described value differs from this object's, naming the first
    field that differs (``target.n_ctx``, ``draft.model``, ...)."""
    got = description.get(key)
    while isinstance(got, dict) and isinstance(value, dict) and got != value:
        field = next(k for k in sorted(set(got) | set(value)) if got.get(k) != value.get(k))
        key, got, value = f"{key}.{field}", got.get(field), value.get(field)
    if got != value:
        kind = "another model" if key.endswith("model") or key.endswith("other") else f"another {key}"
        raise StateError(f"the state is not one of this {what} ({kind}): its {key} is {_short(got)}, this "
                         f"{what}'s {_short(value)}")


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."


def spec_state_ok(part: memoryview, n_vocab: int) -> bool:
    """Whether a drafter's part is well formed (the shim's layout: magic, history, carry-over)."""
    if len(part) < 12 or bytes(part[:4]) != struct.pack("<I", 0x45335331):
        return False
    (n_hist,) = struct.unpack_from("<I", part, 4)
    if len(part) < 12 + 4 * n_hist:
        return False
    (n_carry,) = struct.unpack_from("<I", part, 8 + 4 * n_hist)
    if len(part) != 12 + 4 * n_hist + n_carry:
        return False
    history = np.frombuffer(part, np.int32, n_hist, 8)
    return bool(n_hist == 0 or (history.min() >= 0 and history.max() < n_vocab))
