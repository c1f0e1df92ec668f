"""The target's forward pass in PyTorch, read from its GGUF: a head's training data at GPU speed.

eagle3's engine makes a head's training data on the CPU (:mod:`eagle3.train.data`).
On a GPU, :class:`TorchTarget` makes the same three things from the same GGUF
weights (dequantized to float32 by gguf-py): the target's answers
(:meth:`~TorchTarget.generate`, many prompts at a time with a key/value cache),
the inputs of the layers a head reads and the target's top-k next-token logits
(:meth:`~TorchTarget.features`). Architectures: llama, qwen2 and qwen3, with
llama.cpp's rope layout for each. Activations stay in float where llama.cpp
rounds them to 8 bits for quantized products, so features differ from the
engine's by about that rounding (``tests/test_torch_target.py`` bounds it).

Needs PyTorch and gguf-py only, not eagle3's extension.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# llama.cpp's rope per architecture: llama rotates adjacent pairs (its converter
# permuted q and k for that), qwen2 and qwen3 rotate halves (NEOX)
ROPE_NEOX = {"llama": False, "qwen2": True, "qwen3": True}


@dataclass
class Shape:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_vocab: int
    rope_theta: float
    eps: float


def _field(reader, name: str, default=None):
    f = reader.fields.get(name)
    if f is None:
        return default
    v = f.contents()
    return v[0] if isinstance(v, list) and len(v) == 1 else v


class TorchTarget:
    """A llama-family GGUF target in PyTorch (inference only)."""

    def __init__(self, shape: Shape, weights: dict[str, torch.Tensor]) -> None:
        self.shape, self.w = shape, weights
        d = shape.n_rot
        inv = 1.0 / (shape.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        if "rope_freqs.weight" in weights:  # (llama 3's long-context factors divide the frequencies)
            inv = inv / weights["rope_freqs.weight"].double().cpu()
        self.inv_freq = inv.float().to(self.device)
        self.out = weights.get("output.weight", weights["token_embd.weight"])  # tied when absent

    @property
    def device(self) -> torch.device:
        return self.w["token_embd.weight"].device

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, device: str | torch.device = "cpu", gguf=None) -> TorchTarget:
        """Read and dequantize ``path``; ``gguf``: the gguf-py module (default: the pinned tree's)."""
        if gguf is None:
            from eagle3 import _pinned
            gguf = _pinned.import_gguf()
        reader = gguf.GGUFReader(str(path))
        arch = _field(reader, "general.architecture")
        if arch not in ROPE_NEOX:
            raise ValueError(f"{path}: a '{arch}' target has no PyTorch forward here "
                             f"(supported: {', '.join(sorted(ROPE_NEOX))})")
        n_embd = int(_field(reader, f"{arch}.embedding_length"))
        n_head = int(_field(reader, f"{arch}.attention.head_count"))
        head_dim = int(_field(reader, f"{arch}.attention.key_length", n_embd // n_head))
        weights = {}
        for t in reader.tensors:
            a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
            shape = [int(x) for x in reversed(t.shape)]  # (ggml's ne reversed: rows last)
            weights[t.name] = torch.from_numpy(a.reshape(shape).copy()).to(device)
        n_vocab = weights["token_embd.weight"].shape[0]
        shape = Shape(arch, int(_field(reader, f"{arch}.block_count")), n_embd, n_head,
                      int(_field(reader, f"{arch}.attention.head_count_kv", n_head)), head_dim,
                      int(_field(reader, f"{arch}.rope.dimension_count", head_dim)), n_vocab,
                      float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
                      float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)))
        return cls(shape, weights)

    # -- the layers -----------------------------------------------------------------------

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.shape.eps) * self.w[name]

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        y = x @ self.w[name + ".weight"].T
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x: [B, heads, T, head_dim]; pos: [B, T]. Rotates the first n_rot dims."""
        d = self.shape.n_rot
        angles = pos.float()[:, None, :, None] * self.inv_freq      # [B, 1, T, d/2]
        cos, sin = angles.cos(), angles.sin()
        r, rest = x[..., :d], x[..., d:]
        if ROPE_NEOX[self.shape.arch]:
            a, b = r[..., :d // 2], r[..., d // 2:]
            r = torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
        else:
            a, b = r[..., 0::2], r[..., 1::2]
            r = torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
        return torch.cat([r, rest], -1)

    def _hidden(self, tokens: torch.Tensor, pos: torch.Tensor, allowed: torch.Tensor, cache=None, at: int = 0,
                capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The final norm's output for ``tokens`` [B, T] at ``pos`` [B, T], and the inputs of
        the ``capture`` layers. ``allowed`` [B, T, at + T]: which keys each query sees.
        With ``cache`` (k, v: [n_layer, B, kv, T_max, head_dim]) the keys and values land at
        ``at`` and the queries see the cache before them."""
        s = self.shape
        B, T = tokens.shape
        x = self.w["token_embd.weight"][tokens]
        captured = {}
        rep = s.n_head // s.n_head_kv
        mask = allowed[:, None].repeat(1, 1, rep, 1)  # [B, 1, rep * T, keys]
        for il in range(s.n_layer):
            if il in capture:
                captured[il] = x
            p = f"blk.{il}."
            h = self._norm(x, p + "attn_norm.weight")
            q = self._linear(h, p + "attn_q").view(B, T, s.n_head, s.head_dim).transpose(1, 2)
            k = self._linear(h, p + "attn_k").view(B, T, s.n_head_kv, s.head_dim).transpose(1, 2)
            v = self._linear(h, p + "attn_v").view(B, T, s.n_head_kv, s.head_dim).transpose(1, 2)
            if p + "attn_q_norm.weight" in self.w:  # qwen3: a norm over each head
                q, k = self._norm(q, p + "attn_q_norm.weight"), self._norm(k, p + "attn_k_norm.weight")
            q, k = self._rope(q, pos), self._rope(k, pos)
            if cache is not None:
                cache[0][il, :, :, at:at + T] = k
                cache[1][il, :, :, at:at + T] = v
                k, v = cache[0][il, :, :, :at + T], cache[1][il, :, :, :at + T]
            # the query heads that share a key head ride along its rows, so keys and values are read
            # in place (the cache is never copied per query head)
            q = q.reshape(B, s.n_head_kv, rep * T, s.head_dim)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).reshape(B, s.n_head, T, s.head_dim)
            x = x + self._linear(a.transpose(1, 2).reshape(B, T, -1), p + "attn_output")
            h = self._norm(x, p + "ffn_norm.weight")
            x = x + self._linear(F.silu(self._linear(h, p + "ffn_gate")) * self._linear(h, p + "ffn_up"),
                                 p + "ffn_down")
        return self._norm(x, "output_norm.weight"), captured

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.out.T

    # -- what a head is trained on ----------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: list[np.ndarray], max_new_tokens: int, stop: list[int], *, batch: int = 256,
                 temperature: float = 0.0, seed: int = 0) -> list[np.ndarray]:
        """Each prompt's continuation (up to and with its first ``stop`` token, or
        ``max_new_tokens`` tokens): greedy, or sampled at ``temperature``."""
        dev = self.device
        gen = torch.Generator(device=dev).manual_seed(seed)
        stop_t = torch.tensor(sorted(set(stop)), device=dev)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[np.ndarray] = [np.zeros(0, np.int32)] * len(prompts)
        s = self.shape
        for lo in range(0, len(order), batch):
            rows = order[lo:lo + batch]
            B, P = len(rows), max(len(prompts[i]) for i in rows)
            T_max = P + max_new_tokens
            # prompts left-padded: pad keys are never seen (each pad sees itself, to stay finite)
            tokens = torch.zeros(B, P, dtype=torch.long, device=dev)
            seen = torch.zeros(B, T_max, dtype=torch.bool, device=dev)
            for b, i in enumerate(rows):
                n = len(prompts[i])
                tokens[b, P - n:] = torch.as_tensor(np.asarray(prompts[i], np.int64), device=dev)
                seen[b, P - n:] = True
            lengths = seen[:, :P].sum(1)
            pos = (torch.arange(P, device=dev)[None] - (P - lengths)[:, None]).clamp(min=0)
            cache = [torch.zeros(s.n_layer, B, s.n_head_kv, T_max, s.head_dim, device=dev) for _ in range(2)]
            causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
            eye = torch.eye(P, dtype=torch.bool, device=dev)
            allowed = (causal[None] & seen[:, None, :P]) | eye[None]
            hidden, _ = self._hidden(tokens, pos, allowed, cache, 0)
            last = hidden[:, -1]
            new = torch.zeros(B, max_new_tokens, dtype=torch.long, device=dev)
            done = torch.zeros(B, dtype=torch.bool, device=dev)
            n_new = torch.full((B,), max_new_tokens, dtype=torch.long, device=dev)
            for t in range(max_new_tokens):
                logits = self.logits(last)
                if temperature > 0:
                    nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0]
                else:
                    nxt = logits.argmax(-1)
                new[:, t] = nxt
                ended = ~done & torch.isin(nxt, stop_t)
                n_new = torch.where(ended, t + 1, n_new)
                done |= ended
                if t + 1 == max_new_tokens or bool(done.all()):
                    break
                seen[:, P + t] = True
                hidden, _ = self._hidden(nxt[:, None], (lengths + t)[:, None], seen[:, None, :P + t + 1],
                                         cache, P + t)
                last = hidden[:, -1]
            new_np, n_np = new.cpu().numpy().astype(np.int32), n_new.cpu().numpy()
            for b, i in enumerate(rows):
                out[i] = new_np[b, :n_np[b]].copy()
        return out

    @torch.no_grad()
    def features(self, sequences: list[np.ndarray], layers: tuple[int, ...], top_k: int, *,
                 batch_tokens: int = 16384) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For every token of every sequence, concatenated in order: the inputs of
        ``layers`` (float16 [N, len(layers) * n_embd]) and the target's ``top_k``
        largest next-token logits (int32 ids and float32 values, [N, top_k])."""
        dev = self.device
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        parts: dict[int, tuple] = {}
        lo = 0
        while lo < len(order):
            first = len(sequences[order[lo]])  # (sorted: the shortest; one longer than the budget goes alone)
            hi = lo + 1
            while hi < len(order) and (hi - lo + 1) * len(sequences[order[hi]]) <= max(batch_tokens, first):
                hi += 1
            rows = order[lo:hi]
            B, T = len(rows), max(len(sequences[i]) for i in rows)
            tokens = torch.zeros(B, T, dtype=torch.long, device=dev)
            for b, i in enumerate(rows):
                tokens[b, :len(sequences[i])] = torch.as_tensor(np.asarray(sequences[i], np.int64), device=dev)
            pos = torch.arange(T, device=dev)[None].expand(B, T)
            allowed = torch.ones(T, T, dtype=torch.bool, device=dev).tril()[None].expand(B, T, T)
            hidden, caps = self._hidden(tokens, pos, allowed, capture=tuple(layers))
            for b, i in enumerate(rows):
                n = len(sequences[i])
                top, ids = torch.topk(self.logits(hidden[b, :n]), top_k, dim=-1)
                parts[i] = (torch.cat([caps[il][b, :n] for il in layers], -1).half(), ids.int(), top.float())
            lo = hi
        return tuple(torch.cat([parts[i][j] for i in range(len(sequences))]) for j in range(3))
