"""Write a trained head as an ``eagle3`` GGUF for its target, and read the
target's weights the head borrows.

The head borrows the target's token embeddings (``token_embd``) through
``ctx_other``, so it stores only its own layer, its fusion ``fc``, its output
head over the draft vocabulary and ``d2t``; the tokenizer is copied from the
target, which llama.cpp's loader requires of every model file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from eagle3 import _pinned


def _reader(path: str | os.PathLike):
    gguf = _pinned.import_gguf()
    return gguf, gguf.GGUFReader(str(path))


def target_matrix(path: str | os.PathLike, names: tuple[str, ...]) -> np.ndarray:
    """The first of ``names`` the target GGUF holds, dequantized to float32 [rows, n_embd]."""
    gguf, reader = _reader(path)
    tensors = {t.name: t for t in reader.tensors}
    for name in names:
        t = tensors.get(name)
        if t is not None:
            rows = gguf.quants.dequantize(t.data, t.tensor_type)
            return np.array(rows.reshape(int(t.shape[1]), int(t.shape[0])), dtype=np.float32)  # a writable copy
    raise KeyError(f"{path} has none of {names}")


def target_vector(path: str | os.PathLike, name: str) -> np.ndarray | None:
    """A one-dimensional tensor of the target GGUF as float32, or None when it has none."""
    gguf, reader = _reader(path)
    for t in reader.tensors:
        if t.name == name:
            return np.array(gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1), dtype=np.float32)
    return None


def _copy_tokenizer(gguf, reader, writer) -> None:
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), vtype)


def _rope_rows(w: np.ndarray, n_head: int, inverse: bool = False) -> np.ndarray:
    """Reorder q/k rows from rotated halves (how the head computes rope) to
    llama.cpp's adjacent pairs (its NORM rope), as its converter does for llama;
    ``inverse``: back."""
    half = w.shape[0] // n_head // 2
    split = (n_head, half, 2) if inverse else (n_head, 2, half)
    return w.reshape(*split, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


OUTTYPES = ("f16", "q8_0")


def write_head(path: str | os.PathLike, target_path: str | os.PathLike, model, context_length: int,
               outtype: str = "f16") -> Path:
    """Write ``model`` (an :class:`eagle3.train.head.Eagle3Draft`) as an ``eagle3`` GGUF whose
    matrices are ``outtype`` (f16, or q8_0 where rows are whole blocks); norms stay f32."""
    gguf, reader = _reader(target_path)
    cfg = model.cfg
    sd = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    w = gguf.GGUFWriter(str(tmp), "eagle3")
    w.add_name("EAGLE-3 head trained by eagle3")
    w.add_context_length(context_length)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(1)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_target_layers(list(cfg.aux_layers))
    w.add_target_hidden_size(cfg.target_hidden_size)
    w.add_norm_before_residual(False)
    w.add_norm_before_fc(False)
    w.add_vocab_size(cfg.vocab_size)
    q8 = outtype == "q8_0"
    w.add_file_type(7 if q8 else 1)  # llama.cpp's MOSTLY_Q8_0 / MOSTLY_F16
    _copy_tokenizer(gguf, reader, w)
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]

    def f16(a):
        if q8 and a.shape[-1] % block == 0:
            return gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
        return np.ascontiguousarray(a, dtype=np.float16)

    def f32(a):
        return np.ascontiguousarray(a, dtype=np.float32)

    tensors = {
        "fc.weight": f16(sd["fc.weight"]),
        "output_norm.weight": f32(sd["norm.weight"]),
        "output.weight": f16(sd["lm_head.weight"]),
        "d2t": np.ascontiguousarray(sd["d2t"].astype(np.int64)),
        "blk.0.attn_norm.weight": f32(sd["input_layernorm.weight"]),
        "blk.0.attn_norm_2.weight": f32(sd["hidden_norm.weight"]),
        "blk.0.attn_q.weight": f16(_rope_rows(sd["q_proj.weight"], cfg.num_attention_heads)),
        "blk.0.attn_k.weight": f16(_rope_rows(sd["k_proj.weight"], cfg.num_key_value_heads)),
        "blk.0.attn_v.weight": f16(sd["v_proj.weight"]),
        "blk.0.attn_output.weight": f16(sd["o_proj.weight"]),
        "blk.0.ffn_norm.weight": f32(sd["post_attention_layernorm.weight"]),
        "blk.0.ffn_gate.weight": f16(sd["gate_proj.weight"]),
        "blk.0.ffn_up.weight": f16(sd["up_proj.weight"]),
        "blk.0.ffn_down.weight": f16(sd["down_proj.weight"]),
    }
    for name, value in tensors.items():
        if value.dtype == np.uint8:  # q8_0 blocks
            w.add_tensor(name, value, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return path


# the head's parameters and the GGUF tensors they are written to
_NAMES = {"fc.weight": "fc.weight", "norm.weight": "output_norm.weight", "lm_head.weight": "output.weight",
          "input_layernorm.weight": "blk.0.attn_norm.weight", "hidden_norm.weight": "blk.0.attn_norm_2.weight",
          "q_proj.weight": "blk.0.attn_q.weight", "k_proj.weight": "blk.0.attn_k.weight",
          "v_proj.weight": "blk.0.attn_v.weight", "o_proj.weight": "blk.0.attn_output.weight",
          "post_attention_layernorm.weight": "blk.0.ffn_norm.weight", "gate_proj.weight": "blk.0.ffn_gate.weight",
          "up_proj.weight": "blk.0.ffn_up.weight", "down_proj.weight": "blk.0.ffn_down.weight"}


def read_head(path: str | os.PathLike, gguf=None):
    """A head written by :func:`write_head`, back as an :class:`eagle3.train.head.Eagle3Draft`
    (to train it further); ``gguf``: the gguf-py module (default: the pinned tree's)."""
    import torch

    from eagle3.train.head import DraftConfig, Eagle3Draft

    if gguf is None:
        gguf = _pinned.import_gguf()
    reader = gguf.GGUFReader(str(path))

    def field(key, default=None):
        f = reader.fields.get(f"eagle3.{key}")
        if f is None:
            return default
        v = f.contents()
        return v[0] if isinstance(v, list) and len(v) == 1 else v

    tensors = {}
    for t in reader.tensors:
        a = np.asarray(t.data if t.name == "d2t" else gguf.quants.dequantize(t.data, t.tensor_type))
        tensors[t.name] = a.reshape([int(x) for x in reversed(t.shape)])
    d2t = torch.from_numpy(tensors["d2t"].astype(np.int64))
    cfg = DraftConfig(hidden_size=int(field("embedding_length")), target_hidden_size=int(field("target_hidden_size")),
                      num_attention_heads=int(field("attention.head_count")),
                      num_key_value_heads=int(field("attention.head_count_kv")),
                      intermediate_size=int(field("feed_forward_length")), vocab_size=int(field("vocab_size")),
                      draft_vocab_size=len(d2t), aux_layers=tuple(int(x) for x in field("target_layers")),
                      rms_norm_eps=float(field("attention.layer_norm_rms_epsilon")),
                      rope_theta=float(field("rope.freq_base")),
                      max_position_embeddings=int(field("context_length")))
    head = Eagle3Draft(cfg, d2t)
    state = {}
    for param, name in _NAMES.items():
        w = tensors[name].astype(np.float32)
        if param in ("q_proj.weight", "k_proj.weight"):
            heads = cfg.num_attention_heads if param == "q_proj.weight" else cfg.num_key_value_heads
            w = _rope_rows(w, heads, inverse=True)
        state[param] = torch.from_numpy(np.ascontiguousarray(w))
    state["d2t"] = d2t
    head.load_state_dict(state)
    return head
