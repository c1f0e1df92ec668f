"""An EAGLE-3 draft head in PyTorch, trained the way the EAGLE-3 paper does.

The head has one decoder layer. At position p it reads the embedding of the
next token x[p+1] and g[p] = fc([h_low, h_mid, h_high][p]), the fusion of
three of the target's hidden states (layer inputs), and predicts the
target's next token after x[p+1]. Drafting further, it feeds back its own
pre-norm output in place of g ("training-time test": the later steps are
trained on the head's own hidden states, as they will be used).

The layer computes what llama.cpp's ``eagle3`` graph computes (rope in the
Hugging Face layout of rotated halves: :mod:`eagle3.train.export` reorders q
and k for llama.cpp). :func:`save` writes the Hugging Face EAGLE-3 layout
(``midlayer.*``, ``fc``, ``d2t``) that llama.cpp's converter accepts, for the
toy pair's recipe in tools/train/.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DraftConfig:
    hidden_size: int
    target_hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int          # the target's
    draft_vocab_size: int
    aux_layers: tuple[int, int, int]  # target layer inputs read (Hugging Face hidden_states indices)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding in the Hugging Face layout (halves rotated); x: [B, heads, L, D]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    angles = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig, d2t: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        e, h, kv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.fc = nn.Linear(3 * cfg.target_hidden_size, e, bias=False)
        self.input_layernorm = RMSNorm(e, cfg.rms_norm_eps)   # on the token embedding
        self.hidden_norm = RMSNorm(e, cfg.rms_norm_eps)       # on g (or the previous step's output)
        self.q_proj = nn.Linear(2 * e, h * d, bias=False)
        self.k_proj = nn.Linear(2 * e, kv * d, bias=False)
        self.v_proj = nn.Linear(2 * e, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, e, bias=False)
        self.post_attention_layernorm = RMSNorm(e, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(e, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(e, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, e, bias=False)
        self.norm = RMSNorm(e, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(e, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", d2t.long())  # draft id -> target id

    def _qkv(self, emb, hidden, pos):
        b, n, _ = emb.shape
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], -1)
        h, kv, d = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim
        q = self.q_proj(x).view(b, n, h, d).transpose(1, 2)
        k = self.k_proj(x).view(b, n, kv, d).transpose(1, 2)
        v = self.v_proj(x).view(b, n, kv, d).transpose(1, 2)
        rep = h // kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        return rope(q, pos, self.cfg.rope_theta), rope(k, pos, self.cfg.rope_theta), v

    def _finish(self, attn, hidden):
        b, h, n, d = attn.shape
        x = self.o_proj(attn.transpose(1, 2).reshape(b, n, h * d)) + hidden  # the residual is g, raw
        y = self.post_attention_layernorm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        return x, self.lm_head(self.norm(x))  # (pre-norm output, draft logits)

    def forward_ttt(self, emb: torch.Tensor, features: torch.Tensor, steps: int):
        """Training-time test over ``steps`` draft steps, for every start position at once.

        ``emb[:, j]`` are the embeddings of the tokens fed at step j (the token
        after each position, shifted by j); ``features`` the concatenated target
        hidden states [B, L, 3 * target_hidden]. Step j of the chain started at p
        sits at position p + j and attends to the first step of positions <= p
        and to its own chain's earlier steps, as drafting does in llama.cpp.
        Returns the draft logits of every step: a list of [B, L, draft_vocab].
        """
        b, n, _ = features.shape
        pos = torch.arange(n, device=features.device)
        scale = self.cfg.head_dim ** -0.5
        causal = torch.ones(n, n, dtype=torch.bool, device=features.device).tril()
        hidden = self.fc(features)
        q, k1, v1 = self._qkv(emb[:, 0], hidden, pos)
        own_k, own_v = [], []
        logits = []
        for j in range(steps):
            if j > 0:
                q, k, v = self._qkv(emb[:, j], hidden, pos + j)
                own_k.append(k)
                own_v.append(v)
            scores = (q @ k1.transpose(-1, -2)) * scale                       # [B, H, L, L]
            scores = scores.masked_fill(~causal, float("-inf"))
            diag = [(q * k).sum(-1, keepdim=True) * scale for k in own_k]   # [B, H, L, 1] each
            weights = torch.softmax(torch.cat([scores, *diag], -1), -1)
            attn = weights[..., :n] @ v1
            for i, v in enumerate(own_v):
                attn = attn + weights[..., n + i: n + i + 1] * v
            hidden, step_logits = self._finish(attn, hidden)
            logits.append(step_logits)
        return logits


def save(model: Eagle3Draft, directory: Path) -> None:
    """Write the Hugging Face EAGLE-3 layout (yuhuili's ``LlamaForCausalLMEagle3``)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    sd = model.state_dict()
    tensors = {"fc.weight": sd["fc.weight"], "norm.weight": sd["norm.weight"], "lm_head.weight": sd["lm_head.weight"]}
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        tensors[f"midlayer.{name}.weight"] = sd[f"{name}.weight"]
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        tensors[f"midlayer.self_attn.{name}.weight"] = sd[f"{name}.weight"]
    for name in ("gate_proj", "up_proj", "down_proj"):
        tensors[f"midlayer.mlp.{name}.weight"] = sd[f"{name}.weight"]
    d2t = model.d2t.cpu()
    tensors["d2t"] = d2t - torch.arange(len(d2t))  # stored as offsets, as EAGLE-3 checkpoints do
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[d2t] = True
    tensors["t2d"] = t2d
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "num_hidden_layers": 1,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layers),
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "draft_config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
