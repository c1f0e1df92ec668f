"""Copy a GGUF file with changes, to build broken models for tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eagle3 import _pinned, testing

gguf = _pinned.import_gguf()
T = gguf.GGUFValueType


def rewrite(src: Path, dst: Path, *, set_kv: dict | None = None, drop_kv=(), drop_tensors=(),
            set_tensors: dict | None = None) -> Path:
    """Write ``dst``: ``src`` with metadata ``set_kv`` (key -> (value, type[, sub_type])),
    keys ``drop_kv`` and tensors ``drop_tensors`` removed, tensors ``set_tensors`` replaced or added."""
    set_kv, set_tensors = set_kv or {}, set_tensors or {}
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    arch = set_kv.get("general.architecture", (arch,))[0]
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_kv or name in set_kv:
            continue
        sub_type = field.types[-1] if field.types[0] == T.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type)
    for name, spec in set_kv.items():
        if name != "general.architecture":
            writer.add_key_value(name, *spec)
    tensors = {t.name: np.array(t.data) for t in reader.tensors
               if t.name not in drop_tensors and t.name not in set_tensors}
    testing._write(writer, {**tensors, **set_tensors})
    return Path(dst)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def as_chat_model(src: Path, dst: Path, eos: int) -> Path:
    """Write ``dst``: ``src`` with the ChatML template and ``eos`` as its end-of-generation token."""
    return rewrite(src, dst, set_kv={"tokenizer.chat_template": (CHATML, T.STRING),
                                     "tokenizer.ggml.eos_token_id": (eos, T.UINT32)})


def _renamed_keys(reader, arch: str) -> tuple[dict, list]:
    """The ``llama.*`` keys of a llama target as ``{arch}.*`` keys (set, drop)."""
    set_kv, drop = {"general.architecture": (arch, T.STRING)}, []
    for field in reader.fields.values():
        if field.name.startswith("llama."):
            sub_type = (field.types[-1],) if field.types[0] == T.ARRAY else ()
            set_kv[arch + "." + field.name[len("llama."):]] = (field.contents(), field.types[0], *sub_type)
            drop.append(field.name)
    return set_kv, drop


def as_qwen2(src: Path, dst: Path) -> Path:
    """Write ``dst``: the ``llama`` target ``src`` as a ``qwen2`` model (the same weights; its
    optional q/k/v biases left out), so the qwen2 loader and graph run."""
    set_kv, drop = _renamed_keys(gguf.GGUFReader(str(src)), "qwen2")
    return rewrite(src, dst, set_kv=set_kv, drop_kv=drop)


def as_qwen3(src: Path, dst: Path) -> Path:
    """Write ``dst``: the ``llama`` target ``src`` as a ``qwen3`` model, the same weights plus
    unit per-head norms of q and k (what qwen3 adds), so the qwen3 loader and graph run."""
    reader = gguf.GGUFReader(str(src))
    set_kv, drop = _renamed_keys(reader, "qwen3")
    meta = {f.name: f.contents() for f in reader.fields.values()}
    head_dim = meta["llama.embedding_length"] // meta["llama.attention.head_count"]
    norms = {f"blk.{i}.attn_{w}_norm.weight": np.ones(head_dim, np.float32)
             for i in range(meta["llama.block_count"]) for w in "qk"}
    return rewrite(src, dst, set_kv=set_kv, drop_kv=drop, set_tensors=norms)
