"""Is an EAGLE-3 draft compatible with a target? Checked from the GGUF headers.

:func:`check_pair` reads both files' metadata and tensor table through
ggml's gguf C API (no weights are loaded; only a ``d2t`` map is read) and
reports every incompatibility that would make llama.cpp abort, fail or
silently draft garbage. ``Context(draft_model, other=target_ctx)`` and
:class:`~eagle3.Eagle3Session` run it before llama.cpp sees the pair.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Union

import numpy as np

from eagle3 import _core
from eagle3.errors import IncompatiblePairError
from eagle3.model import Model

__all__ = ["Problem", "PairReport", "check_pair"]

_MAX_LAYERS = 512  # LLAMA_MAX_LAYERS

PathOrModel = Union[str, "os.PathLike[str]", Model]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One incompatibility: a short stable ``code`` and a message saying what to do."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


@dataclasses.dataclass
class PairReport:
    """The result of :func:`check_pair`."""

    target: str
    draft: str
    facts: dict[str, Any]
    problems: list[Problem]

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


def check_pair(target: PathOrModel, draft: PathOrModel) -> PairReport:
    """Check an EAGLE-3 draft against its target; paths or loaded :class:`Model` objects.

    Raises :class:`ModelLoadError` if a file is not readable GGUF.
    """
    t, d = _header(target), _header(draft)
    problems: list[Problem] = []

    def problem(code: str, message: str) -> None:
        problems.append(Problem(code, message))

    t_layers = _int(t.key("block_count"))
    t_nextn = _int(t.key("nextn_predict_layers")) or 0
    t_n_layer = t_layers - t_nextn if t_layers is not None else None
    t_embd = _int(t.key("embedding_length"))
    t_vocab = t.n_vocab()
    d_embd = _int(d.key("embedding_length"))
    d_vocab = d.n_vocab()
    layers = d.key("target_layers")
    hidden = _int(d.key("target_hidden_size"))
    support = _core.eagle3_target_support(t.arch)
    facts: dict[str, Any] = {
        "target architecture": t.arch or "?",
        "target layers": t_n_layer,
        "target hidden size": t_embd,
        "target vocabulary": t_vocab,
        "draft architecture": d.arch or "?",
        "draft target_layers": [int(x) for x in layers] if isinstance(layers, np.ndarray) else layers,
        "draft target_hidden_size": hidden,
        "draft hidden size": d_embd,
        "draft vocabulary": d_vocab,
        "draft d2t": d.tensors["d2t"].shape[0] if "d2t" in d.tensors else None,
    }

    # -- the target ---------------------------------------------------------
    if support == 0:
        problem("target-architecture",
                f"target architecture '{t.arch}' cannot be an EAGLE-3 target: its graph does not expose the "
                "per-layer hidden states EAGLE-3 drafts from, or it has recurrent state that cannot roll back")
    if t_layers is None or not 0 < t_layers <= _MAX_LAYERS or not 0 <= t_nextn < t_layers:
        problem("target-block-count", f"target block_count {t_layers} (nextn {t_nextn}) is invalid")
    if t_embd is None or t_embd <= 0:
        problem("target-hidden-size", f"target embedding_length {t_embd} is invalid")

    # -- the draft ----------------------------------------------------------
    if d.arch != "eagle3":
        problem("draft-architecture",
                f"the draft's architecture is '{d.arch}', not 'eagle3': pass an EAGLE-3 draft model "
                "(3 extract layers) built for this target")
    else:
        if _int(d.key("block_count")) != 1:
            problem("draft-block-count", f"an EAGLE-3 draft has exactly 1 block, this one has "
                                         f"{d.key('block_count')}")
        if _int(d.key("nextn_predict_layers")):
            problem("draft-nextn", "an EAGLE-3 draft has no NextN layers (eagle3.nextn_predict_layers must be 0)")
        k_len, v_len = _int(d.key("attention.key_length")), _int(d.key("attention.value_length"))
        if k_len is not None and v_len is not None and k_len != v_len:
            problem("draft-head-dims", f"attention key_length {k_len} != value_length {v_len}")
        if _int(d.key("attention.head_count")) in (None, 0):
            problem("draft-heads", "the draft has no attention.head_count")

        # the target layers the draft reads
        ltype = d.types.get("eagle3.target_layers")
        if ltype not in ("array[int32]", "array[uint32]"):
            problem("target-layers-missing",
                    "eagle3.target_layers (3 int32 layer ids) is missing or has the wrong type"
                    if ltype is None else f"eagle3.target_layers has type {ltype}, expected array[int32]")
        elif len(layers) != 3:
            problem("target-layers-count", f"eagle3.target_layers has {len(layers)} entries, EAGLE-3 needs 3")
        elif t_n_layer is not None:
            top = t_n_layer if support == 2 else t_n_layer - 1
            bad = [int(x) for x in layers if not 0 <= int(x) <= top]
            if bad:
                problem("target-layers-range",
                        f"the draft reads target layers {bad}, but the target ('{t.arch}', {t_n_layer} layers) "
                        f"has layers 0..{top}: the draft was trained for a different target")

        if hidden is None:
            problem("target-hidden-size-missing", "eagle3.target_hidden_size (u32) is missing")
        elif t_embd is not None and hidden != t_embd:
            problem("hidden-size-mismatch",
                    f"the draft expects target hidden size {hidden}, the target has {t_embd}: the draft was "
                    "trained for a different target")
        fc = d.tensors.get("fc.weight")
        if fc is None:
            problem("draft-fc", "the draft has no fc.weight")
        elif hidden is not None and d_embd is not None and fc.shape[:2] != (3 * hidden, d_embd):
            problem("draft-fc", f"fc.weight has shape {fc.shape}, expected ({3 * hidden}, {d_embd})")

        # vocabulary and the borrowed embeddings / head
        if t_vocab is None or d_vocab is None:
            problem("vocab-missing", "both models need tokenizer.ggml.tokens")
        elif t_vocab != d_vocab:
            problem("vocab-mismatch",
                    f"vocabulary sizes differ: target {t_vocab}, draft {d_vocab}; the draft must carry the "
                    "target's tokenizer")
        own_embd = "token_embd.weight" in d.tensors
        output = d.tensors.get("output.weight")
        if d_embd is not None and t_embd is not None and d_embd != t_embd and not (own_embd and output):
            problem("borrowed-width",
                    f"the draft borrows the target's {'token embeddings' if not own_embd else 'output head'} "
                    f"but its hidden size {d_embd} differs from the target's {t_embd}")
        if own_embd and d_embd is not None and d.tensors["token_embd.weight"].shape[0] != d_embd:
            problem("draft-embeddings", "the draft's token_embd width differs from its embedding_length")

        d2t = d.tensors.get("d2t")
        if d2t is not None:
            if d2t.type != "i64" or len(d2t.shape) != 1:
                problem("d2t-type", f"d2t must be a 1-D int64 tensor, it is {d2t.type} {d2t.shape}")
            elif output is None:
                problem("d2t-without-output",
                        "the draft has a d2t map but no output head of its own; d2t maps the rows of the "
                        "draft's own output.weight")
            elif output.shape[1] != d2t.shape[0]:
                problem("d2t-rows", f"d2t has {d2t.shape[0]} entries but output.weight has {output.shape[1]} rows")
            elif t_vocab is not None:
                values = _read_tensor(d, "d2t", np.int64)
                if values.size and (values.min() < 0 or values.max() >= t_vocab):
                    problem("d2t-range", f"d2t maps to token ids outside [0, {t_vocab})")
        elif output is not None and t_vocab is not None and output.shape[1] != t_vocab:
            problem("output-rows", f"the draft's output.weight has {output.shape[1]} rows but no d2t map; "
                                   f"expected {t_vocab}")

    return PairReport(t.path, d.path, facts, problems)
