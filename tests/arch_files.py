"""Tiny models of the architectures eagle3 can draft for (and gemma4, gpt-oss, minimax-m2,
qwen3moe), written from a few shape parameters, to build files that should load or be refused."""

from __future__ import annotations

import numpy as np

from eagle3 import testing
from gguf_edit import T, gguf

rng = np.random.default_rng(0)


def W(*ne):  # shapes in ggml order (row length first); numpy reverses them
    return (rng.standard_normal(tuple(reversed(ne))) * 0.05).astype(np.float32)


def ones(*ne):
    return np.ones(tuple(reversed(ne)), np.float32)


def write(path, arch, p):
    """Write a tiny ``arch`` model. ``p``: E (width), L (layers), H, HKV (int or per layer), DK, DV
    (head sizes), DKS (gemma4's sliding head size), ROT, FF, V (vocabulary), NEXP, NUSED, FFEXP
    (experts), SINKS (gpt-oss's, one per head; default ones), extra_kv {key suffix: (value,
    type[, sub type])}, drop_kv [key suffix], tensor_type {tensor name: numpy dtype}."""
    E, L, H, V = p.get("E", 64), p.get("L", 2), p.get("H", 4), p.get("V", 64)
    HKV = p.get("HKV", 2)
    hkv0 = HKV[0] if isinstance(HKV, list) else HKV
    DK, DV = p.get("DK", E // H), p.get("DV", E // H)
    ROT, FF = p.get("ROT", DK), p.get("FF", 64)
    NEXP, NUSED, FFEXP = p.get("NEXP", 0), p.get("NUSED", 0), p.get("FFEXP", 32)
    w = gguf.GGUFWriter(str(path), arch)
    kv = {
        "context_length": (256, T.UINT32), "embedding_length": (E, T.UINT32), "block_count": (L, T.UINT32),
        "feed_forward_length": (FF, T.UINT32), "attention.head_count": (H, T.UINT32),
        "attention.head_count_kv": ((HKV, T.ARRAY, T.UINT32) if isinstance(HKV, list) else (HKV, T.UINT32)),
        "attention.layer_norm_rms_epsilon": (1e-5, T.FLOAT32), "rope.freq_base": (10000.0, T.FLOAT32),
        "attention.key_length": (DK, T.UINT32), "attention.value_length": (DV, T.UINT32),
        "rope.dimension_count": (ROT, T.UINT32),
    }
    if NEXP:
        kv["expert_count"] = (NEXP, T.UINT32)
        kv["expert_used_count"] = (NUSED, T.UINT32)
        kv["expert_feed_forward_length"] = (FFEXP, T.UINT32)
    if arch == "minimax-m2":
        kv["expert_gating_func"] = (2, T.UINT32)
    if arch == "gpt-oss":
        kv["attention.sliding_window"] = (128, T.UINT32)
        kv["expert_feed_forward_length"] = (FFEXP, T.UINT32)
    if arch == "gemma4":
        kv["attention.sliding_window"] = (128, T.UINT32)
        kv["attention.sliding_window_pattern"] = ([True] * (L - 1) + [False], T.ARRAY, T.BOOL)
        kv["embedding_length_per_layer_input"] = (0, T.UINT32)
        kv["attention.key_length_swa"] = (p.get("DKS", DK), T.UINT32)
        kv["attention.value_length_swa"] = (p.get("DKS", DK), T.UINT32)
    kv.update(p.get("extra_kv", {}))
    for k in p.get("drop_kv", []):
        kv.pop(k, None)
    for k, spec in kv.items():
        w.add_key_value(f"{arch}.{k}", *spec)
    w.add_tokenizer_model("test")
    w.add_token_list([f"tok_{i}" for i in range(V)])
    w.add_token_scores([0.0] * V)

    t = {"token_embd.weight": W(E, V), "output_norm.weight": ones(E), "output.weight": W(E, V)}
    for i in range(L):
        hkv = HKV[i] if isinstance(HKV, list) else HKV
        b = f"blk.{i}."
        dk = DK
        if arch == "gemma4":
            dk = p.get("DKS", DK) if i < L - 1 else DK
        if arch == "gpt-oss":
            t |= {b + "attn_norm.weight": ones(E), b + "post_attention_norm.weight": ones(E),
                  b + "attn_q.weight": W(E, H * ROT), b + "attn_k.weight": W(E, hkv0 * ROT),
                  b + "attn_v.weight": W(E, hkv0 * ROT), b + "attn_output.weight": W(H * ROT, E),
                  b + "attn_sinks.weight": np.asarray(p.get("SINKS", ones(H)), np.float32),
                  b + "attn_output.bias": ones(E)}
        else:
            nkv = hkv0 if arch != "gemma4" else hkv
            t |= {b + "attn_norm.weight": ones(E), b + "attn_q.weight": W(E, dk * H),
                  b + "attn_k.weight": W(E, (DV if arch in ("qwen3", "qwen3moe", "minimax-m2") else dk) * nkv),
                  b + "attn_v.weight": W(E, (dk if arch == "gemma4" else DV) * nkv), b + "attn_output.weight": W(dk * H, E),
                  b + "ffn_norm.weight": ones(E)}
        if arch in ("qwen3", "qwen3moe"):
            t |= {b + "attn_q_norm.weight": ones(DK), b + "attn_k_norm.weight": ones(DK)}
        if arch == "minimax-m2":
            t |= {b + "attn_q_norm.weight": ones(DK * H), b + "attn_k_norm.weight": ones(DK * hkv0)}
        if arch == "gemma4":
            t |= {b + "attn_q_norm.weight": ones(dk), b + "attn_k_norm.weight": ones(dk),
                  b + "post_attention_norm.weight": ones(E), b + "post_ffw_norm.weight": ones(E)}
            if i == L - 1:
                t["rope_freqs.weight"] = ones(dk // 2)
        if arch in ("llama", "qwen3", "gemma4") and not NEXP:
            t |= {b + "ffn_gate.weight": W(E, FF), b + "ffn_up.weight": W(E, FF), b + "ffn_down.weight": W(FF, E)}
        if NEXP:
            ff = FF if arch == "minimax-m2" else FFEXP
            t |= {b + "ffn_gate_inp.weight": W(E, NEXP), b + "ffn_gate_exps.weight": W(E, ff, NEXP),
                  b + "ffn_up_exps.weight": W(E, ff, NEXP), b + "ffn_down_exps.weight": W(ff, E, NEXP)}
            if arch == "minimax-m2":
                t[b + "exp_probs_b.bias"] = ones(NEXP)
            if arch == "gpt-oss":
                t |= {b + "ffn_gate_inp.bias": ones(NEXP), b + "ffn_gate_exps.bias": ones(ff, NEXP),
                      b + "ffn_up_exps.bias": ones(ff, NEXP), b + "ffn_down_exps.bias": ones(E, NEXP)}
    for name, dt in p.get("tensor_type", {}).items():
        t[name] = t[name].astype(dt)
    testing._write(w, t)
