"""What the GGUF headers say: can llama.cpp load a file, does a draft fit its target?

Every fact about the model files is checked here, from their headers, before
llama.cpp sees them. :func:`load_problems` lists what would make llama.cpp's
loader abort (``Model`` refuses such a file).

:func:`check_pair` reads both files' metadata and tensor table through
ggml's gguf C API (no weights are loaded; only a ``d2t`` map is read) and
reports every incompatibility that would make llama.cpp abort, fail or
silently draft garbage. ``Context(draft_model, other=target_ctx)`` and
:class:`~eagle3.Eagle3Session` run it before llama.cpp sees the pair.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator, Union

import numpy as np

from eagle3 import _core
from eagle3.errors import IncompatiblePairError

if TYPE_CHECKING:
    from eagle3.model import Model

__all__ = ["Problem", "PairReport", "check_pair"]

PathOrModel = Union[str, "os.PathLike[str]", "Model"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One incompatibility: a short stable ``code`` and a message saying what to do."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


@dataclasses.dataclass
class PairReport:
    """The result of :func:`check_pair` (or :func:`check_draft_model`)."""

    target: str
    draft: str
    facts: dict[str, Any]
    problems: list[Problem]
    kind: str = "eagle3"
    """The session kind the draft was checked for."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def codes(self) -> list[str]:
        return [p.code for p in self.problems]

    def __str__(self) -> str:
        lines = [f"target: {self.target}", f"draft:  {self.draft}"]
        lines += [f"  {key}: {value}" for key, value in self.facts.items()]
        if self.ok:
            lines.append("compatible: yes")
        else:
            lines.append(f"compatible: no ({len(self.problems)} problem{'s' if len(self.problems) > 1 else ''})")
            lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)

    def raise_if_incompatible(self) -> None:
        if self.problems:
            raise IncompatiblePairError(self)


@dataclasses.dataclass
class _Header:
    path: str
    meta: dict[str, Any]
    types: dict[str, str]
    tensors: dict[str, Any]

    @property
    def arch(self) -> str:
        value = self.meta.get("general.architecture")
        return value if isinstance(value, str) else ""

    def key(self, name: str) -> Any:
        return self.meta.get(f"{self.arch}.{name}")

    def n_vocab(self) -> int | None:
        tokens = self.meta.get("tokenizer.ggml.tokens")
        return len(tokens) if isinstance(tokens, tuple) else None


def _header(x: PathOrModel) -> _Header:
    from eagle3.model import Model  # (model.py checks its headers with this module)

    if isinstance(x, Model):
        return _Header(x.path, x._metadata, x._metadata_types, x._tensors)
    path = os.fspath(x)
    meta, types, tensors = _core.read_gguf(path)
    return _Header(path, meta, types, tensors)


def _int(value: Any) -> int | None:
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return None


def _read_tensor(h: _Header, name: str, dtype) -> np.ndarray:
    info = h.tensors[name]
    count = info.nbytes // np.dtype(dtype).itemsize
    return np.fromfile(h.path, dtype=dtype, count=count, offset=info.offset)


# ---------------------------------------------------------------------------
# Can llama.cpp load the file at all (without aborting)?
# ---------------------------------------------------------------------------

# Architectures (of those eagle3 drafts for, and its own) whose graph gives every layer
# layer 0's head counts, needs key and value heads of one size, or always has experts, and
# those whose sliding-window layouts are checked; read from their src/models/*.cpp
# (tests/test_pinned_facts.py derives each again from the pinned source).
_LAYER0_SHAPED = frozenset({"llama", "qwen2", "qwen3", "qwen3moe", "minimax-m2", "gpt-oss", "hunyuan_vl", "nanbeige",
                            "muse-glimmer", "eagle3"})
_K_IS_V = frozenset({"llama", "qwen2", "qwen3", "qwen3moe", "minimax-m2", "gemma4", "hunyuan_vl", "nanbeige",
                     "muse-glimmer", "eagle3"})
_ALWAYS_EXPERTS = frozenset({"gpt-oss", "minimax-m2"})
_SWA_ARCHS = frozenset({"gpt-oss", "gemma4"})
# The loader reads an expert_count of 0 or 1 as a dense model for these (load_hparams).
_DENSE_WITH_ONE_EXPERT = frozenset({"hunyuan_vl", "hunyuan-dense"})
# llama_expert_gating_func_type's values other than NONE (src/llama-hparams.h).
_GATING_FUNCS = (1, 2, 3, 4)

# The architectures whose graph (src/models/*.cpp) asserts that rope rotates the whole head,
# n_rot == n_embd_head; the loader itself checks it only for llama, deci and falcon
# (tests/test_pinned_facts.py derives the list again from the pinned source).
ROPE_IS_WHOLE_HEAD = frozenset({
    "apertus", "arcee", "arctic", "baichuan", "chameleon", "codeshell", "cogvlm", "cohere2moe", "dbrx", "deci",
    "deepseek", "dots1", "dream", "ernie4_5", "ernie4_5-moe", "exaone", "exaone-moe", "exaone4", "falcon",
    "granite", "granite_swa", "graniteswitch", "grok", "grovemoe", "hunyuan-moe", "hunyuan_vl", "hy_v3",
    "internlm2", "jais2", "llada", "llada-moe", "llama", "llama4", "maincoder", "mellum", "mistral3", "olmo",
    "olmo2", "olmoe", "orion", "paddleocr", "pangu-embedded", "plamo", "pockettts", "qwen2", "qwen2moe", "qwen2vl",
    "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe", "rnd1", "seed_oss", "smallthinker", "smollm3", "starcoder2",
    "talkie", "xverse",
})
_ROPE_ARCHS = ROPE_IS_WHOLE_HEAD | {"minimax-m2", "gemma4", "gpt-oss", "mimo2", "nanbeige", "muse-glimmer", "eagle3"}


def _block_count(h: _Header) -> Iterator[str]:
    blocks = h.key("block_count")
    if h.arch and h.types.get(f"{h.arch}.block_count") == "uint32" and not 0 < blocks <= _core.MAX_LAYERS:
        yield f"{h.arch}.block_count = {blocks} is outside 1..{_core.MAX_LAYERS}"
    nextn = h.key("nextn_predict_layers")
    if isinstance(nextn, int) and isinstance(blocks, int) and nextn > blocks:
        yield f"nextn_predict_layers ({nextn}) exceeds block_count ({blocks})"


def _norm_epsilons(h: _Header) -> Iterator[str]:
    # a negative or NaN norm epsilon trips an assert inside ggml's kernels
    for key, value in h.meta.items():
        if key.endswith("_epsilon") and isinstance(value, float) and not value >= 0.0:
            yield f"{key} = {value} must be a number >= 0"


def _unique_tokens(h: _Header) -> Iterator[str]:
    tokens = h.meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, tuple) and len(set(tokens)) != len(tokens):
        yield "the vocabulary (tokenizer.ggml.tokens) has duplicate tokens"


def _experts(h: _Header) -> Iterator[str]:
    # llama.cpp asserts these (load_hparams) for every architecture
    if h.arch in _DENSE_WITH_ONE_EXPERT and (_int(h.key("expert_count")) or 0) <= 1:
        return  # it treats these as dense
    n_expert = _int(h.key("expert_count")) or 0
    per_layer = _per_layer(h, "expert_used_count")
    used = max(per_layer) if per_layer else 0
    groups = _int(h.key("expert_group_count")) or 0
    group_used = _int(h.key("expert_group_used_count")) or 0
    if n_expert > _core.MAX_EXPERTS:
        yield f"{h.arch}.expert_count = {n_expert} is more than llama.cpp's {_core.MAX_EXPERTS}"
    elif used > n_expert:
        yield f"{h.arch}.expert_used_count = {used} is more than expert_count = {n_expert}"
    elif n_expert > 0 and (used == 0 or 0 in per_layer):
        yield f"{h.arch}.expert_count = {n_expert} but expert_used_count is 0 (or missing) for some layer"
    elif n_expert == 0 and h.arch in _ALWAYS_EXPERTS:
        yield f"{h.arch} is a mixture of experts, but {h.arch}.expert_count is 0 (or missing)"
    elif n_expert > 0 and groups >= n_expert:
        yield f"{h.arch}.expert_group_count = {groups} must be less than expert_count = {n_expert}"
    elif n_expert > 0 and groups > 1 and (n_expert % groups or not 0 < group_used < groups):
        yield (f"{h.arch}: {n_expert} experts in {groups} groups, {group_used} used: the groups must divide the "
               "experts and 0 < expert_group_used_count < expert_group_count")
    elif n_expert == 0 and groups:
        yield f"{h.arch}.expert_group_count = {groups} without experts"


_ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # llama.cpp's LLAMA_ROPE_SCALING_TYPES


def _rope_scaling(h: _Header) -> Iterator[str]:
    value = h.key("rope.scaling.type")
    if isinstance(value, str) and value not in _ROPE_SCALING_TYPES:
        yield f"{h.arch}.rope.scaling.type = {value!r} is none of {', '.join(_ROPE_SCALING_TYPES)}"


def _per_layer(h: _Header, name: str) -> list[int]:
    """A key that is one number or one per layer, as the loader reads it (uint32), per entry;
    [] when missing or not numbers."""
    value = h.key(name)
    if isinstance(value, np.ndarray) and value.dtype.kind in "iub":
        return [int(v) & 0xFFFFFFFF for v in value.reshape(-1)]
    single = _int(value)
    return [single & 0xFFFFFFFF] if single is not None else []


def _heads(h: _Header) -> Iterator[str]:
    # ggml broadcasts the KV heads over the query heads (an abort unless they divide); the
    # graph of most architectures sizes every layer as layer 0, the KV cache each layer itself
    heads, kv = _per_layer(h, "attention.head_count"), _per_layer(h, "attention.head_count_kv")
    kv = kv or heads
    if len(heads) > 1 and len(kv) == 1:
        kv = kv * len(heads)
    elif len(kv) > 1 and len(heads) == 1:
        heads = heads * len(kv)
    for i, (n, k) in enumerate(zip(heads, kv)):
        if n and k and n % k:
            yield (f"{h.arch}: layer {i} has {n} attention heads and {k} KV heads; the KV heads must divide "
                   "the heads")
            return
    if h.arch in _LAYER0_SHAPED and (len(set(heads)) > 1 or len(set(kv)) > 1):
        yield f"{h.arch}: head counts that differ between layers; its graph gives every layer layer 0's"


def _head_sizes(h: _Header) -> Iterator[str]:
    n_embd, heads = _int(h.key("embedding_length")), _per_layer(h, "attention.head_count")
    if not n_embd or not heads or not heads[0]:
        return
    k_len = _int(h.key("attention.key_length")) or n_embd // heads[0]
    v_len = _int(h.key("attention.value_length")) or k_len
    n_rot = _int(h.key("rope.dimension_count"))
    n_rot = k_len if n_rot is None else n_rot
    if h.arch in _K_IS_V and k_len != v_len:
        yield f"{h.arch}.attention.key_length = {k_len} but value_length = {v_len}; its graph needs them equal"
    elif h.arch in ROPE_IS_WHOLE_HEAD and n_rot != k_len:
        yield (f"{h.arch}.rope.dimension_count = {n_rot}, but {h.arch}'s graph rotates whole heads of "
               f"{k_len} dimensions")
    elif h.arch in _ROPE_ARCHS and (n_rot > k_len or n_rot % 2):
        yield (f"{h.arch}.rope.dimension_count = {n_rot}: rope rotates pairs of dimensions of a head of "
               f"{k_len}, so it must be even and at most that")
    elif h.arch in _SWA_ARCHS:
        k_swa = _int(h.key("attention.key_length_swa")) or k_len
        v_swa = _int(h.key("attention.value_length_swa")) or v_len
        rot_swa = _int(h.key("rope.dimension_count_swa"))
        rot_swa = n_rot if rot_swa is None else rot_swa
        if h.arch == "gpt-oss" and len({n_rot, rot_swa, k_len, v_len, k_swa, v_swa}) > 1:
            yield (f"gpt-oss: rope dimensions ({n_rot}, sliding {rot_swa}) and head sizes (key {k_len}, value "
                   f"{v_len}, sliding {k_swa}/{v_swa}) must all be equal; its graph takes one for the other")
        elif k_swa != v_swa:
            yield f"{h.arch}.attention.key_length_swa = {k_swa} but value_length_swa = {v_swa}"
        elif rot_swa > k_swa or rot_swa % 2:
            yield (f"{h.arch}.rope.dimension_count_swa = {rot_swa} (it defaults to rope.dimension_count): it "
                   f"must be even and at most the sliding layers' head size {k_swa}")


def _sliding_layers(h: _Header) -> list[bool] | None:
    """Which layers use sliding-window attention (gpt-oss and gemma4), as their loaders decide."""
    n_layer = _int(h.key("block_count")) or 0
    pattern = h.key("attention.sliding_window_pattern")
    if isinstance(pattern, np.ndarray):
        flags = [bool(v) for v in pattern.reshape(-1)][:n_layer]
        return flags + [False] * (n_layer - len(flags))
    if h.arch == "gpt-oss":
        period = _int(pattern)
        period = 2 if period is None else period
        return [period == 0 or i % period < period - 1 for i in range(n_layer)]
    return None


def _sliding_window(h: _Header) -> Iterator[str]:
    if h.arch not in _SWA_ARCHS:
        return
    swa = _sliding_layers(h)
    if swa is not None and not any(swa):
        yield f"{h.arch}: no layer uses sliding-window attention (attention.sliding_window_pattern); its graph needs one"
        return
    shared = _int(h.key("attention.shared_kv_layers"))
    if h.arch != "gemma4" or swa is None or shared is None:
        return
    first = len(swa) - shared  # layers from here on reuse the cache of the last ones before it
    if first < 2:
        yield f"gemma4: block_count - attention.shared_kv_layers = {first}; at least 2 layers must have their own cache"
    elif first < len(swa) and ((any(swa[first:]) and not swa[first - 2]) or
                               (not all(swa[first:]) and swa[first - 1])):
        yield ("gemma4: the layers that share a cache (attention.shared_kv_layers) need a sliding layer at "
               f"{first - 2} and a full one at {first - 1} to share")


def _gating(h: _Header) -> Iterator[str]:
    if h.arch == "minimax-m2" and _int(h.key("expert_gating_func")) not in _GATING_FUNCS:
        yield (f"minimax-m2.expert_gating_func = {h.key('expert_gating_func')}: it must be 1 (softmax), "
               "2 (sigmoid), 3 or 4")


def _f32_tensors(h: _Header) -> Iterator[str]:
    # ggml's rope takes its frequency factors, and attention its sinks, only as f32
    for name, info in h.tensors.items():
        if (name.endswith("rope_freqs.weight") or name.endswith("attn_sinks.weight")) and info.type != "f32":
            yield f"{name} is {info.type}; llama.cpp uses it only as f32"
            return


def _d2t_type_fault(h: _Header) -> str | None:
    d2t = h.tensors.get("d2t")
    if d2t is not None and (d2t.type != "i64" or len(d2t.shape) != 1):
        return f"d2t must be a 1-D int64 tensor, it is {d2t.type} {d2t.shape}"
    return None


def _d2t_range_fault(h: _Header, n_vocab: int | None) -> str | None:
    """(For a d2t of the right type.) d2t's values outside the vocabulary: an out-of-bounds write."""
    if "d2t" not in h.tensors or n_vocab is None:
        return None
    values = _read_tensor(h, "d2t", np.int64)
    if values.size and (values.min() < 0 or values.max() >= n_vocab):
        return f"d2t maps to token ids outside [0, {n_vocab})"
    return None


def _eagle3_draft(h: _Header) -> Iterator[str]:
    # what the eagle3 graph asserts, even for a draft used alone (without a target context)
    if h.arch != "eagle3":
        return
    blocks, nextn = _int(h.key("block_count")), _int(h.key("nextn_predict_layers")) or 0
    if blocks is not None and blocks - nextn != 1:
        yield f"an EAGLE-3 draft has exactly 1 block, this one has {blocks - nextn}"
    fault = _d2t_type_fault(h) or _d2t_range_fault(h, h.n_vocab())
    if fault:
        yield fault
    embd = h.tensors.get("token_embd.weight")
    if embd is not None and len(embd.shape) == 2 and h.n_vocab() is not None and embd.shape[1] < h.n_vocab():
        yield f"token_embd.weight has {embd.shape[1]} rows, fewer than the {h.n_vocab()} tokens of the vocabulary"


_LOAD_RULES = (_block_count, _norm_epsilons, _unique_tokens, _experts, _rope_scaling, _heads, _head_sizes,
               _sliding_window, _gating, _f32_tensors, _eagle3_draft)


def load_problems(path: str, metadata: dict[str, Any], types: dict[str, str], tensors: dict[str, Any]) -> list[str]:
    """What in a GGUF header or tensor table would make llama.cpp abort (while loading,
    making a context or decoding) instead of failing."""
    h = _Header(path, metadata, types, tensors)
    return [message for rule in _LOAD_RULES for message in rule(h)]


# ---------------------------------------------------------------------------
# Does the draft fit the target? One rule per concern.
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class _Pair:
    t: _Header
    d: _Header

    def __post_init__(self) -> None:
        t, d = self.t, self.d
        self.t_layers = _int(t.key("block_count"))
        self.t_nextn = _int(t.key("nextn_predict_layers")) or 0
        self.t_n_layer = self.t_layers - self.t_nextn if self.t_layers is not None else None
        self.t_embd = _int(t.key("embedding_length"))
        self.t_vocab = t.n_vocab()
        self.d_embd = _int(d.key("embedding_length"))
        self.d_vocab = d.n_vocab()
        self.layers = d.key("target_layers")
        self.hidden = _int(d.key("target_hidden_size"))
        self.support = _core.eagle3_target_support(t.arch)
        self.output = d.tensors.get("output.weight")

    def facts(self) -> dict[str, Any]:
        d = self.d
        return {
            "target architecture": self.t.arch or "?",
            "target layers": self.t_n_layer,
            "target hidden size": self.t_embd,
            "target vocabulary": self.t_vocab,
            "draft architecture": d.arch or "?",
            "draft target_layers": ([int(x) for x in self.layers] if isinstance(self.layers, np.ndarray)
                                    else self.layers),
            "draft target_hidden_size": self.hidden,
            "draft hidden size": self.d_embd,
            "draft vocabulary": self.d_vocab,
            "draft d2t": d.tensors["d2t"].shape[0] if "d2t" in d.tensors else None,
        }


Rule = Callable[[_Pair], Iterator[Problem]]


def _target(p: _Pair) -> Iterator[Problem]:
    if p.support == 0:
        yield Problem("target-architecture",
                      f"target architecture '{p.t.arch}' cannot be an EAGLE-3 target: its graph does not expose "
                      "the per-layer hidden states EAGLE-3 drafts from, or it has recurrent state that cannot roll "
                      "back")
    if p.t_layers is None or not 0 < p.t_layers <= _core.MAX_LAYERS or not 0 <= p.t_nextn < p.t_layers:
        yield Problem("target-block-count", f"target block_count {p.t_layers} (nextn {p.t_nextn}) is invalid")
    if p.t_embd is None or p.t_embd <= 0:
        yield Problem("target-hidden-size", f"target embedding_length {p.t_embd} is invalid")


def not_causal_lm(h: _Header) -> str | None:
    """Why the model in ``h`` is not a causal language model (None if it is one)."""
    if h.key("attention.causal") is False:
        return f"{h.arch}.attention.causal is false: it attends to later tokens, so it cannot generate"
    pooling = _int(h.key("pooling_type"))
    if pooling:
        return f"{h.arch}.pooling_type = {pooling}: it is an embedding model, not a language model"
    return None


def unset_weights(h: _Header, sample_bytes: int = 4096) -> str | None:
    """Why the weights in ``h`` look unset (None if they do not): every weight matrix reads
    as zero bytes at its start, middle and end. Zero bytes are zero weights in every ggml
    type; a model that is all zeros loads and decodes, and predicts nothing."""
    matrices = [t for t in h.tensors.values() if len(t.shape) >= 2 and t.nbytes > 0]
    if not matrices:
        return None
    with open(h.path, "rb") as f:
        for t in matrices:
            n = min(sample_bytes, t.nbytes)
            for start in (0, (t.nbytes - n) // 2, t.nbytes - n):
                f.seek(t.offset + start)
                if any(f.read(n)):
                    return None
    return f"all {len(matrices)} weight matrices read as zeros: the weights look unset, and it predicts nothing"


def _target_causal(p: _Pair) -> Iterator[Problem]:
    reason = not_causal_lm(p.t)
    if reason:
        yield Problem("target-not-causal", f"the target cannot be speculated on: {reason}")


def _draft_shape(p: _Pair) -> Iterator[Problem]:
    d = p.d
    if _int(d.key("block_count")) != 1:
        yield Problem("draft-block-count", f"an EAGLE-3 draft has exactly 1 block, this one has "
                                           f"{d.key('block_count')}")
    if _int(d.key("nextn_predict_layers")):
        yield Problem("draft-nextn", "an EAGLE-3 draft has no NextN layers (eagle3.nextn_predict_layers must be 0)")
    k_len, v_len = _int(d.key("attention.key_length")), _int(d.key("attention.value_length"))
    if k_len is not None and v_len is not None and k_len != v_len:
        yield Problem("draft-head-dims", f"attention key_length {k_len} != value_length {v_len}")
    if _int(d.key("attention.head_count")) in (None, 0):
        yield Problem("draft-heads", "the draft has no attention.head_count")


def _target_layers(p: _Pair) -> Iterator[Problem]:
    ltype = p.d.types.get("eagle3.target_layers")
    if ltype not in ("array[int32]", "array[uint32]"):
        yield Problem("target-layers-missing",
                      "eagle3.target_layers (3 int32 layer ids) is missing or has the wrong type"
                      if ltype is None else f"eagle3.target_layers has type {ltype}, expected array[int32]")
    elif len(p.layers) != 3:
        yield Problem("target-layers-count", f"eagle3.target_layers has {len(p.layers)} entries, EAGLE-3 needs 3")
    elif p.t_n_layer is not None:
        top = p.t_n_layer if p.support == 2 else p.t_n_layer - 1
        bad = [int(x) for x in p.layers if not 0 <= int(x) <= top]
        if bad:
            yield Problem("target-layers-range",
                          f"the draft reads target layers {bad}, but the target ('{p.t.arch}', {p.t_n_layer} layers) "
                          f"has layers 0..{top}: the draft was trained for a different target")


def _hidden_size(p: _Pair) -> Iterator[Problem]:
    if p.hidden is None:
        yield Problem("target-hidden-size-missing", "eagle3.target_hidden_size (u32) is missing")
    elif p.t_embd is not None and p.hidden != p.t_embd:
        yield Problem("hidden-size-mismatch",
                      f"the draft expects target hidden size {p.hidden}, the target has {p.t_embd}: the draft was "
                      "trained for a different target")
    fc = p.d.tensors.get("fc.weight")
    if fc is None:
        yield Problem("draft-fc", "the draft has no fc.weight")
    elif p.hidden is not None and p.d_embd is not None and fc.shape[:2] != (3 * p.hidden, p.d_embd):
        yield Problem("draft-fc", f"fc.weight has shape {fc.shape}, expected ({3 * p.hidden}, {p.d_embd})")


def draft_tensor_shapes(d: _Header) -> dict[str, tuple[tuple[int, ...], bool]]:
    """name -> (shape, required) of every tensor llama.cpp's eagle3 loader creates, from the
    draft's keys (shapes in ggml's order: the row length first). Empty when a key it needs
    is missing or not a number."""
    e, f = _int(d.key("embedding_length")), _int(d.key("feed_forward_length"))
    heads, target = _int(d.key("attention.head_count")), _int(d.key("target_hidden_size"))
    if not (e and f and heads and target) or e % heads:
        return {}
    kv = _int(d.key("attention.head_count_kv")) or heads
    k_len = _int(d.key("attention.key_length")) or e // heads
    v_len = _int(d.key("attention.value_length")) or e // heads
    d2t = d.tensors.get("d2t")
    n_out = d2t.shape[0] if d2t is not None and d2t.shape else d.n_vocab()
    n_rot = _int(d.key("rope.dimension_count")) or k_len
    shapes = {
        "fc.weight": ((3 * target, e), True),
        "output_norm.weight": ((e,), True),
        "blk.0.attn_norm.weight": ((e,), True),
        "blk.0.attn_norm_2.weight": ((e,), True),
        "blk.0.attn_q.weight": ((2 * e, k_len * heads), True),
        "blk.0.attn_k.weight": ((2 * e, k_len * kv), True),
        "blk.0.attn_v.weight": ((2 * e, v_len * kv), True),
        "blk.0.attn_output.weight": ((k_len * heads, e), True),
        "blk.0.ffn_norm.weight": ((e,), True),
        "blk.0.ffn_gate.weight": ((e, f), True),
        "blk.0.ffn_up.weight": ((e, f), True),
        "blk.0.ffn_down.weight": ((f, e), True),
        "blk.0.attn_q_norm.weight": ((k_len,), False),  # (a Qwen3 layer's per-head norms)
        "blk.0.attn_k_norm.weight": ((k_len,), False),
        "rope_freqs.weight": ((n_rot // 2,), False),  # (one for all layers, as llama.cpp names it)
        "output.weight": ((e, n_out), False),
        "token_embd.weight": ((e, d.n_vocab()), False),
        "d2t": ((n_out,), False),
    }
    if d.key("norm_before_fc") or d.key("fc_norm"):
        shapes["enc.output_norm.weight"] = ((3 * target,), True)
    return shapes


def _draft_tensors(p: _Pair) -> Iterator[Problem]:
    expected = draft_tensor_shapes(p.d)
    if not expected:
        yield Problem("draft-keys", "the draft lacks embedding_length, feed_forward_length, attention.head_count or "
                                    "target_hidden_size (or the heads do not divide the width)")
        return
    for name, (shape, required) in expected.items():
        info = p.d.tensors.get(name)
        if info is None:
            if required:
                yield Problem("draft-tensor-missing", f"the draft has no {name}, which its keys require")
        elif tuple(info.shape) != shape and name != "fc.weight":  # (fc: rule _hidden_size)
            yield Problem("draft-tensor-shape", f"{name} has shape {tuple(info.shape)}, but the draft's keys imply "
                                                f"{shape}")
    extra = sorted(set(p.d.tensors) - set(expected))
    if extra:
        yield Problem("draft-tensor-unknown", f"llama.cpp's eagle3 graph has no use for {', '.join(extra)}: the "
                                              "draft is of a variant it does not implement")


def _vocabulary(p: _Pair) -> Iterator[Problem]:
    if p.t_vocab is None or p.d_vocab is None:
        yield Problem("vocab-missing", "both models need tokenizer.ggml.tokens")
    elif p.t_vocab != p.d_vocab:
        yield Problem("vocab-mismatch",
                      f"vocabulary sizes differ: target {p.t_vocab}, draft {p.d_vocab}; the draft must carry the "
                      "target's tokenizer")


def _borrowed(p: _Pair) -> Iterator[Problem]:
    own_embd = "token_embd.weight" in p.d.tensors
    if p.d_embd is not None and p.t_embd is not None and p.d_embd != p.t_embd and not (own_embd and p.output):
        yield Problem("borrowed-width",
                      f"the draft borrows the target's {'token embeddings' if not own_embd else 'output head'} "
                      f"but its hidden size {p.d_embd} differs from the target's {p.t_embd}")
    if own_embd and p.d_embd is not None and p.d.tensors["token_embd.weight"].shape[0] != p.d_embd:
        yield Problem("draft-embeddings", "the draft's token_embd width differs from its embedding_length")


def _d2t(p: _Pair) -> Iterator[Problem]:
    d2t = p.d.tensors.get("d2t")
    if d2t is None:
        if p.output is not None and p.t_vocab is not None and p.output.shape[1] != p.t_vocab:
            yield Problem("output-rows", f"the draft's output.weight has {p.output.shape[1]} rows but no d2t map; "
                                         f"expected {p.t_vocab}")
    elif _d2t_type_fault(p.d):
        yield Problem("d2t-type", _d2t_type_fault(p.d))
    elif p.output is None:
        yield Problem("d2t-without-output",
                      "the draft has a d2t map but no output head of its own; d2t maps the rows of the draft's own "
                      "output.weight")
    elif p.output.shape[1] != d2t.shape[0]:
        yield Problem("d2t-rows", f"d2t has {d2t.shape[0]} entries but output.weight has {p.output.shape[1]} rows")
    elif _d2t_range_fault(p.d, p.t_vocab):
        yield Problem("d2t-range", _d2t_range_fault(p.d, p.t_vocab))


def _draft_architecture(p: _Pair) -> Iterator[Problem]:
    if p.d.arch != "eagle3":
        yield Problem("draft-architecture",
                      f"the draft's architecture is '{p.d.arch}', not 'eagle3': pass an EAGLE-3 draft model "
                      "(3 extract layers) built for this target")


_TARGET_RULES: tuple[Rule, ...] = (_target, _target_causal)
_DRAFT_RULES: tuple[Rule, ...] = (_draft_shape, _target_layers, _hidden_size, _draft_tensors, _vocabulary, _borrowed,
                                  _d2t)


def check_pair(target: PathOrModel, draft: PathOrModel) -> PairReport:
    """Check an EAGLE-3 draft against its target; paths or loaded :class:`Model` objects.

    Raises :class:`ModelLoadError` if a file is not readable GGUF.
    """
    pair = _Pair(_header(target), _header(draft))
    rules = _TARGET_RULES + (_DRAFT_RULES if pair.d.arch == "eagle3" else (_draft_architecture,))
    problems = [problem for rule in rules for problem in rule(pair)]
    return PairReport(pair.t.path, pair.d.path, pair.facts(), problems)


def check_draft_model(target: Model, draft: Model) -> PairReport:
    """Check a draft model (for :class:`~eagle3.DraftSession`) against its target, both
    loaded: llama.cpp's rules for ``draft-simple`` (the same tokenizer type, the same
    BOS and EOS, vocabulary sizes within 128 tokens, the same text for every token
    from id 5), read from the loaded vocabularies."""
    problems = []
    if draft.architecture == "eagle3":
        problems.append(Problem("draft-architecture", "this is an EAGLE-3 draft, which drafts from the target's "
                                "hidden states: use an Eagle3Session"))
    else:
        why = _core.vocab_mismatch(target._live(), draft._live())
        if why is not None:
            problems.append(Problem("vocabulary", f"the draft's vocabulary does not fit the target's: {why}"))
    facts = {"target_vocab": target.n_vocab, "draft_vocab": draft.n_vocab}
    return PairReport(str(target.path), str(draft.path), facts, problems, kind="draft")
