"""Tiny EAGLE-3 draft checkpoints in the layouts of the tools that train them, and the
draft's forward pass in PyTorch as those tools define it.

One module, :class:`ReferenceDraft`, computes the EAGLE-3 draft step with every variant in
use: the residual from the raw or the normed fused state (``norm_before_residual``,
speculators), one RMSNorm over the three target layers before ``fc`` (``norm_before_fc``)
or one per layer (``fc_norm``, Eagle 3.1), per-head q/k norms (a Qwen3 layer) and the
post-norm state fed to the next step (``norm_output``, Eagle 3.1). :func:`save` writes it
as one tool writes its checkpoints: the architectures value, the config keys (with that
tool's layer-id convention), the tensor names and the ``d2t`` offsets.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn


@dataclasses.dataclass(frozen=True)
class Shape:
    hidden: int = 64           # the draft's width; the target's too (the tools' fc reads 3 x this)
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 96
    vocab: int = 320           # the target's
    draft_vocab: int | None = 160  # None: a full-vocabulary head, no d2t
    eps: float = 1e-5
    rope_theta: float = 10000.0


@dataclasses.dataclass(frozen=True)
class Variant:
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    qk_norm: bool = False
    norm_output: bool = False
    own_embeddings: bool = False


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face's rotary embedding (halves rotated); x: [heads, L, D]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).float(), torch.cat([ang.sin()] * 2, -1).float()
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


class ReferenceDraft(nn.Module):
    def __init__(self, shape: Shape, variant: Variant, seed: int = 0):
        super().__init__()
        self.shape, self.variant = shape, variant
        g = torch.Generator().manual_seed(seed)
        s = shape
        h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
        n_out = s.draft_vocab or s.vocab

        def w(*size, scale=0.08):
            return nn.Parameter(torch.randn(*size, generator=g) * scale)

        def norm(n):  # norms away from 1, so that a norm applied to the wrong tensor shows
            return nn.Parameter(1.0 + 0.3 * torch.randn(n, generator=g))

        self.fc = w(h, 3 * h)
        self.input_norm = norm(3 * h)
        self.fc_norms = nn.ParameterList([norm(h) for _ in range(3)])
        self.input_layernorm, self.hidden_norm, self.post_attention_layernorm = norm(h), norm(h), norm(h)
        self.q_proj, self.k_proj, self.v_proj = w(q, 2 * h), w(kv, 2 * h), w(kv, 2 * h)
        self.o_proj = w(h, q)
        self.q_norm, self.k_norm = norm(s.head_dim), norm(s.head_dim)
        self.gate_proj, self.up_proj, self.down_proj = w(s.ffn, h), w(s.ffn, h), w(h, s.ffn)
        self.norm = norm(h)
        self.lm_head = w(n_out, h, scale=0.3)
        self.embed_tokens = w(s.vocab, h, scale=0.5)
        # draft id -> target id: an increasing subset of the target's vocabulary
        self.d2t = (torch.randperm(s.vocab, generator=g)[:s.draft_vocab].sort().values
                    if s.draft_vocab else None)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """g = fc(features): features [L, 3 * hidden], the three target layers side by side."""
        v, eps = self.variant, self.shape.eps
        if v.norm_before_fc:
            features = rms(features, self.input_norm, eps)
        if v.fc_norm:
            parts = features.chunk(3, -1)
            features = torch.cat([rms(p, n, eps) for p, n in zip(parts, self.fc_norms)], -1)
        return features @ self.fc.T

    def step(self, emb, g, pos, cache=None):
        """One decoder pass over new positions ``pos`` (embeddings ``emb``, fused or fed-back
        states ``g``), attending to ``cache`` (keys, values) and causally among themselves.
        Returns (logits over the target vocabulary, -inf outside d2t; the state for the next
        step; the keys and values including these positions)."""
        s, v = self.shape, self.variant
        n = emb.shape[0]
        gn = rms(g, self.hidden_norm, s.eps)
        x = torch.cat([rms(emb, self.input_layernorm, s.eps), gn], -1)
        q = (x @ self.q_proj.T).view(n, s.heads, s.head_dim).transpose(0, 1)
        k = (x @ self.k_proj.T).view(n, s.kv_heads, s.head_dim).transpose(0, 1)
        val = (x @ self.v_proj.T).view(n, s.kv_heads, s.head_dim).transpose(0, 1)
        if v.qk_norm:
            q, k = rms(q, self.q_norm, s.eps), rms(k, self.k_norm, s.eps)
        q, k = rope(q, pos, s.rope_theta), rope(k, pos, s.rope_theta)
        if cache is not None:
            k, val = torch.cat([cache[0], k], 1), torch.cat([cache[1], val], 1)
        rep = s.heads // s.kv_heads
        kk, vv = k.repeat_interleave(rep, 0), val.repeat_interleave(rep, 0)
        scores = (q @ kk.transpose(-1, -2)) / s.head_dim ** 0.5
        past = kk.shape[1] - n
        mask = torch.ones(n, kk.shape[1], dtype=torch.bool).tril(past)
        attn = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ vv
        a = attn.transpose(0, 1).reshape(n, -1) @ self.o_proj.T + (gn if v.norm_before_residual else g)
        y2 = rms(a, self.post_attention_layernorm, s.eps)
        y = a + (F.silu(y2 @ self.gate_proj.T) * (y2 @ self.up_proj.T)) @ self.down_proj.T
        yn = rms(y, self.norm, s.eps)
        head = yn @ self.lm_head.T
        if self.d2t is not None:
            full = torch.full((n, s.vocab), float("-inf"))
            full[:, self.d2t] = head
            head = full
        return head, (yn if v.norm_output else y), (k, val)

    def embed(self, tokens, target_embeddings):
        return (self.embed_tokens if self.variant.own_embeddings else target_embeddings)[tokens]


# -- the tools' layouts ----------------------------------------------------------

TOOLS = ("eagle", "specforge", "speculators", "modelopt", "angelslim")


def _layer_tensors(d: ReferenceDraft, prefix: str) -> dict[str, torch.Tensor]:
    t = {f"{prefix}.input_layernorm.weight": d.input_layernorm, f"{prefix}.hidden_norm.weight": d.hidden_norm,
         f"{prefix}.post_attention_layernorm.weight": d.post_attention_layernorm}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        t[f"{prefix}.self_attn.{name}.weight"] = getattr(d, name)
    for name in ("gate_proj", "up_proj", "down_proj"):
        t[f"{prefix}.mlp.{name}.weight"] = getattr(d, name)
    if d.variant.qk_norm:
        t[f"{prefix}.self_attn.q_norm.weight"], t[f"{prefix}.self_attn.k_norm.weight"] = d.q_norm, d.k_norm
    return t


def save(d: ReferenceDraft, directory: Path, tool: str, target_layers: list[int] | None,
         n_target_layers: int) -> None:
    """Write ``d`` as ``tool`` writes a draft that reads ``target_layers`` (llama.cpp's
    convention: layer inputs; None: the tool's config names none)."""
    s, v = d.shape, d.variant
    directory.mkdir(parents=True, exist_ok=True)
    outputs = None if target_layers is None else [i - 1 for i in target_layers]  # layer-output ids
    layer_config = {
        "hidden_size": s.hidden, "intermediate_size": s.ffn, "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "num_hidden_layers": 1,
        "vocab_size": s.vocab, "rms_norm_eps": s.eps, "rope_theta": s.rope_theta, "hidden_act": "silu",
        "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "model_type": "qwen3" if v.qk_norm else "llama",
    }
    config: dict = {"draft_vocab_size": s.draft_vocab or s.vocab, "target_hidden_size": s.hidden,
                    "torch_dtype": "float32"}
    prefix = "midlayer"
    if tool == "eagle":
        assert target_layers in (None, [2, n_target_layers // 2, n_target_layers - 3]), "EAGLE reads fixed layers"
        config |= {"architectures": ["LlamaForCausalLMEagle3"], **layer_config}
    elif tool == "specforge":
        config |= {"architectures": ["LlamaForCausalLMEagle3"], **layer_config}
        if outputs is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": outputs}
    elif tool == "modelopt":
        config |= {"architectures": ["LlamaForCausalLMEagle3"], **layer_config, "attention_bias": False,
                   "mlp_bias": False,
                   "eagle_config": {"use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True,
                                    "use_last_layernorm": True, "parallel_draft_step": 1}}
        if outputs is not None:
            config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = outputs
        prefix = "layers.0"
    elif tool == "angelslim":
        config |= {"architectures": ["Eagle3LlamaForCausalLM"], **layer_config}
        if outputs is not None:
            config["aux_hidden_states_layer_ids"] = outputs
    elif tool == "speculators":
        config |= {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                   "norm_before_residual": v.norm_before_residual, "transformer_layer_config": layer_config,
                   "speculators_config": {"algorithm": "eagle3", "proposal_methods": [
                       {"proposal_type": "greedy", "speculative_tokens": 3}]}}
        if target_layers is not None:
            config["eagle_aux_hidden_state_layer_ids"] = list(target_layers)
        prefix = "layers.0"
    else:
        raise ValueError(tool)
    for key in ("norm_before_fc", "fc_norm", "norm_output"):
        if getattr(v, key):
            config[key] = True
    if v.norm_before_residual and tool != "speculators":
        config["norm_before_residual"] = True

    tensors = {"fc.weight": d.fc, "norm.weight": d.norm, "lm_head.weight": d.lm_head, **_layer_tensors(d, prefix)}
    if v.norm_before_fc:
        tensors["input_norm.weight"] = d.input_norm
    if v.fc_norm:
        tensors |= {f"fc_norm.{i}.weight": n for i, n in enumerate(d.fc_norms)}
    if v.own_embeddings:
        tensors["embed_tokens.weight"] = d.embed_tokens
    if d.d2t is not None:
        tensors["d2t"] = d.d2t - torch.arange(len(d.d2t))  # offsets, as every tool stores them
        if tool != "modelopt":
            t2d = torch.zeros(s.vocab, dtype=torch.bool)
            t2d[d.d2t] = True
            tensors["t2d"] = t2d
    save_file({k: t.detach().contiguous() for k, t in tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_hf_target(root: Path, n_layer: int, vocab: int = 320, hidden: int = 64, seed: int = 0):
    """A tiny Hugging Face Llama target with a SentencePiece tokenizer, in ``root / "target"``;
    returns the model (eval mode)."""
    import sentencepiece as spm
    import transformers
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "train"))
    from train_pair import write_tokenizer_files

    text = root / "text.txt"
    text.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(400)))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(root / "tok"), vocab_size=vocab,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0, minloglevel=2)
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=n_layer, num_attention_heads=4, num_key_value_heads=2,
                                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    target = transformers.LlamaForCausalLM(config).eval()
    target.save_pretrained(root / "target", safe_serialization=True)
    write_tokenizer_files(root / "target", root / "tok.model")
    return target
