"""Tiny synthesized models for tests, examples and experiments.

Writes GGUF files with the gguf-py of the llama.cpp tree eagle3 was built
from: a ``llama`` target and an ``eagle3`` draft for it, of any shape.

Two kinds of weights:

* ``"random"``: every weight random. Acceptance is near zero, but the
  pair exercises every code path with real shapes.
* ``"chain"``: the target's greedy next token is a fixed permutation ``f``
  of the current token (its blocks add only ``noise``), and an ``"aligned"``
  draft predicts ``f`` for a fraction ``agreement`` of the vocabulary through
  its attention. Acceptance is then high and partial, so drafts of every
  length get accepted, partly accepted and rolled back.

:func:`write_dequantized` copies any GGUF with its weights dequantized to f32
by gguf-py's own numpy code: a reference for a quantized model's logits that
owes nothing to ggml's kernels.

For MTP, :func:`write_mtp_target` writes an ``hy_v3`` model (attention-only,
dense, normal RoPE) with NextN blocks; with ``weights="chain"`` its NextN
head predicts the same successor ``f`` as the trunk, up to ``noise``.

The vocabulary is llama.cpp's ``"test"`` tokenizer: ``n_vocab`` tokens,
text hashed in 5-byte chunks, tokens rendered as hexadecimal ids.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from eagle3 import _pinned

__all__ = ["TargetSpec", "DraftSpec", "MtpSpec", "write_target", "write_eagle3_draft", "write_pair",
           "write_mtp_target", "write_dequantized"]


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """Shape and weights of a synthesized ``llama`` target."""

    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_vocab: int = 256
    n_ctx_train: int = 4096
    weights: str = "random"  # "random" or "chain"
    noise: float = 0.02      # chain: scale of what the blocks add to the residual
    output_scale: float = 1.0  # scales the output head: lower makes the next-token distribution flatter
    tied: bool = False       # no output.weight: the output head is token_embd, as in many small models
    seed: int = 0

    def __post_init__(self) -> None:
        if self.weights not in ("random", "chain"):
            raise ValueError(f"weights must be 'random' or 'chain', got {self.weights!r}")
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError("n_embd must divide by n_head and n_head by n_head_kv")
        if self.tied and self.weights == "chain":
            raise ValueError("a chain target needs its own output head (tied=False)")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclasses.dataclass(frozen=True)
class DraftSpec:
    """Shape and weights of a synthesized EAGLE-3 draft for a :class:`TargetSpec`.

    ``target_layers`` defaults to ``(1, n_layer // 2, n_layer - 1)``;
    ``d2t`` gives the draft its own smaller vocabulary of that many tokens
    with a draft-to-target map; ``own_embeddings`` gives it its own
    ``token_embd`` and ``output`` (required when ``n_embd`` differs from the
    target's). ``weights="aligned"`` (for a ``"chain"`` target) predicts the
    target's next token for a fraction ``agreement`` of the vocabulary.
    """

    n_embd: int | None = None
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 128
    target_layers: tuple[int, int, int] | None = None
    d2t: int | None = None
    own_embeddings: bool = False
    own_output: bool | None = None
    norm_before_fc: bool = False
    weights: str = "random"  # "random" or "aligned"
    agreement: float = 0.7
    output_scale: float = 1.0  # scales the draft's logits: lower makes its distribution flatter
    seed: int = 1

    def __post_init__(self) -> None:
        if self.weights not in ("random", "aligned"):
            raise ValueError(f"weights must be 'random' or 'aligned', got {self.weights!r}")
        if not 0.0 <= self.agreement <= 1.0:
            raise ValueError("agreement must be in [0, 1]")


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _dense(rng: np.random.Generator, n_out: int, n_in: int, scale: float = 1.0) -> np.ndarray:
    # numpy shape (n_out, n_in) is ggml ne = {n_in, n_out}
    return (rng.standard_normal((n_out, n_in)) * (scale / np.sqrt(n_in))).astype(np.float32)


def _embeddings(spec: TargetSpec) -> np.ndarray:
    return _rng(spec.seed).standard_normal((spec.n_vocab, spec.n_embd)).astype(np.float32)


def chain_map(spec: TargetSpec) -> np.ndarray:
    """For a ``"chain"`` target: ``next[t]``, the target's greedy successor of token ``t``."""
    return _rng(spec.seed + 7919).permutation(spec.n_vocab).astype(np.int64)


def _add_tokenizer(writer, n_vocab: int) -> None:
    writer.add_tokenizer_model("test")
    writer.add_token_list([f"tok_{i}" for i in range(n_vocab)])
    writer.add_token_scores([0.0] * n_vocab)


def _write(writer, tensors: dict[str, np.ndarray]) -> None:
    for name, value in tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_target(path: str | os.PathLike, spec: TargetSpec = TargetSpec()) -> Path:
    """Write a ``llama`` target GGUF with the shape of ``spec``."""
    gguf = _pinned.import_gguf()
    path = Path(path)
    rng = _rng(spec.seed + 1)
    E, F, V = spec.n_embd, spec.n_ff, spec.n_vocab
    D = spec.head_dim
    kv = spec.n_head_kv * D

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(E)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(F)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    w.add_file_type(0)
    _add_tokenizer(w, V)

    emb = _embeddings(spec)
    if spec.weights == "chain":
        # logits = output @ norm(h), h ~ emb[t]: the row of f(t) is emb[t]
        nxt = chain_map(spec)
        output = np.empty_like(emb)
        output[nxt] = emb
        block_scale = spec.noise
    else:
        output = _dense(rng, V, E, 4.0)
        block_scale = 1.0
    output = (output * spec.output_scale).astype(np.float32)
    tensors = {"token_embd.weight": emb, "output_norm.weight": np.ones(E, np.float32)}
    if not spec.tied:
        tensors["output.weight"] = output
    for i in range(spec.n_layer):
        tensors.update({
            f"blk.{i}.attn_norm.weight": np.ones(E, np.float32),
            f"blk.{i}.attn_q.weight": _dense(rng, E, E),
            f"blk.{i}.attn_k.weight": _dense(rng, kv, E),
            f"blk.{i}.attn_v.weight": _dense(rng, kv, E),
            f"blk.{i}.attn_output.weight": _dense(rng, E, E, block_scale),
            f"blk.{i}.ffn_norm.weight": np.ones(E, np.float32),
            f"blk.{i}.ffn_gate.weight": _dense(rng, F, E),
            f"blk.{i}.ffn_up.weight": _dense(rng, F, E),
            f"blk.{i}.ffn_down.weight": _dense(rng, E, F, block_scale),
        })
    _write(w, tensors)
    return path


def default_target_layers(n_layer: int) -> tuple[int, int, int]:
    """Low, middle and high target layers for a draft of a target with ``n_layer`` layers."""
    return (min(1, n_layer - 1), n_layer // 2, n_layer - 1)


def _draft_layer(target: TargetSpec, spec: DraftSpec, rng: np.random.Generator,
                 draft_ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The draft's output head rows and its one decoder layer: random, or aligned with a chain target."""
    E = spec.n_embd if spec.n_embd is not None else target.n_embd
    V, F, D = target.n_vocab, spec.n_ff, E // spec.n_head
    kv = spec.n_head_kv * D
    if spec.weights == "aligned":
        emb = _embeddings(target)
        nxt = chain_map(target).copy()
        wrong = _rng(spec.seed + 11).random(V) >= spec.agreement
        nxt[wrong] = (nxt[wrong] + 1 + _rng(spec.seed + 13).integers(0, V - 1, wrong.sum())) % V
        # logits row of token j is emb[t] for the t whose draft successor is j
        full = np.zeros((V, E), np.float32)
        full[nxt] = emb
        eye = np.eye(E, dtype=np.float32)
        zero = np.zeros((E, E), np.float32)
        scale = 4.0  # sharp attention: each position reads its own token
        return full[draft_ids], {
            "attn_norm.weight": np.ones(E, np.float32),
            "attn_norm_2.weight": np.zeros(E, np.float32),
            "attn_q.weight": np.concatenate([scale * eye, zero], axis=1),
            "attn_k.weight": np.concatenate([scale * eye, zero], axis=1),
            "attn_v.weight": np.concatenate([eye, zero], axis=1),
            "attn_output.weight": eye,
            "ffn_norm.weight": np.ones(E, np.float32),
            "ffn_gate.weight": _dense(rng, F, E),
            "ffn_up.weight": _dense(rng, F, E),
            "ffn_down.weight": np.zeros((E, F), np.float32),
        }
    output = _dense(rng, len(draft_ids), E, 4.0)
    return output, {
        "attn_norm.weight": np.ones(E, np.float32),
        "attn_norm_2.weight": np.ones(E, np.float32),
        "attn_q.weight": _dense(rng, spec.n_head * D, 2 * E),
        "attn_k.weight": _dense(rng, kv, 2 * E),
        "attn_v.weight": _dense(rng, kv, 2 * E),
        "attn_output.weight": _dense(rng, E, spec.n_head * D),
        "ffn_norm.weight": np.ones(E, np.float32),
        "ffn_gate.weight": _dense(rng, F, E),
        "ffn_up.weight": _dense(rng, F, E),
        "ffn_down.weight": _dense(rng, E, F),
    }


def write_eagle3_draft(path: str | os.PathLike, target: TargetSpec = TargetSpec(),
                       spec: DraftSpec = DraftSpec()) -> Path:
    """Write an ``eagle3`` draft GGUF for a target of shape ``target``."""
    gguf = _pinned.import_gguf()
    path = Path(path)
    rng = _rng(spec.seed + 101)
    E = spec.n_embd if spec.n_embd is not None else target.n_embd
    Et, V, F = target.n_embd, target.n_vocab, spec.n_ff
    own_output = spec.own_output
    if own_output is None:
        own_output = spec.own_embeddings or spec.d2t is not None or spec.weights == "aligned"
    if spec.d2t is not None and not own_output:
        raise ValueError("a draft with d2t needs its own output head")
    if E != Et and not (spec.own_embeddings and own_output):
        raise ValueError("a draft whose n_embd differs from the target's needs own embeddings and output")
    if spec.weights == "aligned" and (target.weights != "chain" or E != Et or spec.n_head != spec.n_head_kv):
        raise ValueError("an aligned draft needs a 'chain' target, the target's n_embd and n_head_kv == n_head")
    layers = spec.target_layers if spec.target_layers is not None else default_target_layers(target.n_layer)

    w = gguf.GGUFWriter(str(path), "eagle3")
    w.add_context_length(target.n_ctx_train)
    w.add_embedding_length(E)
    w.add_block_count(1)
    w.add_feed_forward_length(F)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_target_layers(list(layers))
    w.add_target_hidden_size(Et)
    w.add_norm_before_residual(spec.weights == "aligned")
    w.add_norm_before_fc(spec.norm_before_fc)
    w.add_vocab_size(V)
    w.add_file_type(0)
    _add_tokenizer(w, V)

    draft_ids = np.arange(V, dtype=np.int64)
    if spec.d2t is not None:
        if not 0 < spec.d2t <= V:
            raise ValueError(f"d2t must be in [1, {V}]")
        draft_ids = np.sort(_rng(spec.seed + 5).choice(V, spec.d2t, replace=False)).astype(np.int64)

    tensors: dict[str, np.ndarray] = {"fc.weight": _dense(rng, E, 3 * Et)}
    if spec.norm_before_fc:
        tensors["enc.output_norm.weight"] = np.ones(3 * Et, np.float32)
    tensors["output_norm.weight"] = np.full(E, spec.output_scale, np.float32)
    output, blk = _draft_layer(target, spec, rng, draft_ids)
    if own_output:
        tensors["output.weight"] = output
    if spec.d2t is not None:
        tensors["d2t"] = draft_ids
    if spec.own_embeddings:
        tensors["token_embd.weight"] = _rng(spec.seed + 17).standard_normal((V, E)).astype(np.float32)
    tensors.update({f"blk.0.{name}": value for name, value in blk.items()})
    _write(w, tensors)
    return path


def write_pair(directory: str | os.PathLike, target: TargetSpec = TargetSpec(),
               draft: DraftSpec = DraftSpec(), name: str = "tiny") -> tuple[Path, Path]:
    """Write ``{name}-target.gguf`` and ``{name}-draft.gguf`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return (write_target(directory / f"{name}-target.gguf", target),
            write_eagle3_draft(directory / f"{name}-draft.gguf", target, draft))


@dataclasses.dataclass(frozen=True)
class MtpSpec(TargetSpec):
    """Shape and weights of a synthesized ``hy_v3`` model with ``nextn`` NextN (MTP)
    blocks after its ``n_layer`` trunk blocks.

    ``hy_v3`` is the attention-only architecture of the pinned llama.cpp
    whose MTP graph runs with dense layers (no experts, MLA or sliding window).
    With ``weights="chain"``, ``noise`` scales every weight but the embeddings,
    the head and the NextN input projection.
    """

    n_layer: int = 2
    nextn: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nextn < 1:
            raise ValueError("nextn must be >= 1")


def write_mtp_target(path: str | os.PathLike, spec: MtpSpec = MtpSpec()) -> Path:
    """Write an ``hy_v3`` GGUF with ``spec.nextn`` NextN blocks after ``spec.n_layer`` trunk blocks."""
    gguf = _pinned.import_gguf()
    path = Path(path)
    arch = "hy_v3"
    rng = _rng(spec.seed + 1)
    E, F, V = spec.n_embd, spec.n_ff, spec.n_vocab
    D = E // spec.n_head
    chain = spec.weights == "chain"
    scale = spec.noise if chain else 0.2

    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.context_length", spec.n_ctx_train)
    w.add_uint32(f"{arch}.embedding_length", E)
    w.add_uint32(f"{arch}.block_count", spec.n_layer + spec.nextn)
    w.add_uint32(f"{arch}.feed_forward_length", F)
    w.add_uint32(f"{arch}.expert_feed_forward_length", F)  # required by the loader, unused when dense
    w.add_uint32(f"{arch}.attention.head_count", spec.n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", spec.n_head_kv)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{arch}.nextn_predict_layers", spec.nextn)
    w.add_uint32(f"{arch}.rope.dimension_count", D)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    _add_tokenizer(w, V)

    def noisy(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + (0.0 if chain else 0.1) * rng.standard_normal(n)).astype(np.float32)

    emb = _rng(spec.seed).standard_normal((V, E)).astype(np.float32)
    if chain:
        output = np.empty_like(emb)
        output[chain_map(spec)] = emb
    else:
        output = noisy(V, E)
    tensors = {"token_embd.weight": emb, "output_norm.weight": norm(E), "output.weight": output}
    for i in range(spec.n_layer + spec.nextn):
        b = f"blk.{i}"
        tensors.update({
            f"{b}.attn_norm.weight": norm(E),
            f"{b}.attn_q.weight": noisy(spec.n_head * D, E),
            f"{b}.attn_k.weight": noisy(spec.n_head_kv * D, E),
            f"{b}.attn_v.weight": noisy(spec.n_head_kv * D, E),
            f"{b}.attn_output.weight": noisy(E, spec.n_head * D),
            f"{b}.attn_q_norm.weight": norm(D),
            f"{b}.attn_k_norm.weight": norm(D),
            f"{b}.ffn_norm.weight": norm(E),
            f"{b}.ffn_gate.weight": noisy(F, E),
            f"{b}.ffn_up.weight": noisy(F, E),
            f"{b}.ffn_down.weight": noisy(E, F),
        })
        if i >= spec.n_layer:
            # eh_proj mixes [norm(embedding of the token), norm(hidden)]: in a
            # chain model it keeps the token's embedding, so the head predicts f(token)
            eh = noisy(E, 2 * E)
            if chain:
                eh[:, :E] += np.eye(E, dtype=np.float32)
            tensors.update({
                f"{b}.nextn.eh_proj.weight": eh,
                f"{b}.nextn.enorm.weight": norm(E),
                f"{b}.nextn.hnorm.weight": norm(E),
                f"{b}.nextn.shared_head_norm.weight": norm(E),
            })
    _write(w, tensors)
    return path


def write_dequantized(path: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write to ``out`` the GGUF at ``path`` with every tensor dequantized to f32
    by the pinned gguf-py (numpy, not ggml), its metadata as it is."""
    gguf = _pinned.import_gguf()
    reader = gguf.GGUFReader(str(path))
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the writer's own
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    _write(writer, {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
                    for t in reader.tensors})
    return Path(out)
