"""What an EAGLE-3 draft checkpoint means, read the way the tool that trained it meant it.

Five tools write EAGLE-3 drafts, with the same tensors and different conventions. The one
that matters most is which target layers the draft reads: llama.cpp's
``eagle3.target_layers`` count layer *inputs* (id k: the hidden state entering layer k),
as the EAGLE trainer, vLLM and speculators do, while SpecForge, ModelOpt and AngelSlim
store layer *outputs* (id k: the state leaving layer k, the input of layer k + 1). A draft
given the wrong layers loads, runs and accepts almost nothing. :func:`read_draft_format`
reads a ``config.json`` (and the checkpoint's tensor names) into a :class:`DraftFormat`:
the layer ids llama.cpp needs, where they came from, the graph variant, and what llama.cpp
cannot run. docs/formats.md has the table.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from pathlib import Path
from typing import Any

__all__ = ["DraftFormat", "read_draft_format", "default_target_layers"]


def default_target_layers(n_layer: int) -> list[int]:
    """The layers the EAGLE trainer reads (inputs of 2, n/2 and n-3), llama.cpp's default."""
    return [2, n_layer // 2, n_layer - 3]


@dataclasses.dataclass
class DraftFormat:
    tool: str                     # the tool whose conventions the config follows (a best guess)
    target_layers: list[int]      # in llama.cpp's convention (layer inputs)
    layers_from: str              # where they came from and how they were counted
    defaulted: bool               # no ids in the checkpoint: llama.cpp's default was taken
    variant: dict[str, bool]      # the graph options: norm_before_residual, norm_before_fc, fc_norm, ...
    unsupported: list[str]        # one line per feature llama.cpp cannot run, naming its key

    def describe(self) -> str:
        options = [name for name, on in self.variant.items() if on]
        return (f"{self.tool} draft; target layers {self.target_layers} (layer inputs) from {self.layers_from}"
                + (f"; {', '.join(options)}" if options else ""))


# The tensors llama.cpp's eagle3 graph has a place for, after the converter's renames
# (midlayer.* and layers.0.* are the one decoder layer; "model." may prefix any of them).
_LAYER_TENSORS = ("input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj",
                  "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_KNOWN_TENSOR = re.compile(
    r"^(model\.)?("
    r"(midlayer|layers\.0)\.(" + "|".join(re.escape(t) for t in _LAYER_TENSORS) + r")\.weight"
    r"|fc\.weight|norm\.weight|lm_head\.weight|embed_tokens\.weight|input_norm\.weight|fc_norm\.[0-2]\.weight"
    r"|d2t|t2d)$")


def _flag(config: dict, nested: dict, key: str) -> bool:
    return bool(config.get(key, nested.get(key, False)))


def tensor_names(directory: Path) -> list[str]:
    """The tensor names of the checkpoint's safetensors files (read from their headers only)."""
    names: list[str] = []
    for path in sorted(directory.glob("*.safetensors")):
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        names += [name for name in header if name != "__metadata__"]
    return names


def _layer_ids(config: dict, eagle_config: dict, n_layer: int) -> tuple[list[int], str, bool]:
    top = config.get("eagle_aux_hidden_state_layer_ids")
    nested = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    angelslim = config.get("aux_hidden_states_layer_ids")
    if top:
        return [int(i) for i in top], "eagle_aux_hidden_state_layer_ids (layer inputs, as vLLM counts)", False
    if nested:
        return ([int(i) + 1 for i in nested],
                f"eagle_config.eagle_aux_hidden_state_layer_ids = {list(nested)} (layer outputs: + 1)", False)
    if angelslim:
        return ([int(i) + 1 for i in angelslim],
                f"aux_hidden_states_layer_ids = {list(angelslim)} (layer outputs: + 1)", False)
    return default_target_layers(n_layer), f"llama.cpp's default for {n_layer} target layers", True


def _tool(config: dict, eagle_config: dict) -> str:
    if "speculators_model_type" in config or "transformer_layer_config" in config:
        return "speculators"
    if eagle_config and any(k in eagle_config for k in ("use_aux_hidden_state", "use_input_layernorm_in_first_layer",
                                                        "use_last_layernorm", "parallel_draft_step")):
        return "ModelOpt"
    if eagle_config:
        return "SpecForge"
    if "aux_hidden_states_layer_ids" in config or "Eagle3LlamaForCausalLM" in (config.get("architectures") or []):
        return "AngelSlim"
    return "EAGLE"


def read_draft_format(config: dict, n_target_layers: int, names: list[str] = ()) -> DraftFormat:
    """Read a draft's ``config.json`` (and its tensor ``names``) for a target of
    ``n_target_layers`` layers."""
    eagle_config = config.get("eagle_config") or {}
    layer = config.get("transformer_layer_config") or {}
    hp: dict[str, Any] = {**config, **layer}
    layers, layers_from, defaulted = _layer_ids(config, eagle_config, n_target_layers)
    variant = {
        "norm_before_residual": bool(config.get("norm_before_residual", False)),
        "norm_before_fc": _flag(config, eagle_config, "norm_before_fc"),
        "fc_norm": _flag(config, eagle_config, "fc_norm") or any(re.search(r"fc_norm\.\d\.weight$", n) for n in names),
        "norm_output": _flag(config, eagle_config, "norm_output"),
        "q_norm/k_norm": hp.get("model_type") == "qwen3" or any(n.endswith("self_attn.q_norm.weight") for n in names),
    }
    unsupported = []
    if len(layers) != 3:
        unsupported.append(f"{len(layers)} target layers ({layers_from}): llama.cpp's EAGLE-3 reads exactly 3")
    if hp.get("num_hidden_layers", 1) != 1:
        unsupported.append(f"{hp.get('num_hidden_layers')} draft layers (num_hidden_layers): llama.cpp runs one")
    for key in ("attention_bias", "mlp_bias", "bias"):
        if hp.get(key):
            unsupported.append(f"biases ({key}: true): llama.cpp's eagle3 graph has none")
    if variant["fc_norm"] and variant["norm_before_fc"]:
        unsupported.append("both fc_norm and norm_before_fc: llama.cpp runs one norm before fc or the other")
    if eagle_config.get("use_aux_hidden_state") is False:
        unsupported.append("no target features (eagle_config.use_aux_hidden_state: false): an EAGLE-1 style draft")
    if int(eagle_config.get("parallel_draft_step", 1) or 1) > 1:
        unsupported.append("parallel drafting heads (eagle_config.parallel_draft_step > 1)")
    if any("Deepseek" in a for a in config.get("architectures") or []):
        unsupported.append(f"an MLA draft layer (architectures: {config['architectures'][0]})")
    unknown = [n for n in names if not _KNOWN_TENSOR.match(n)]
    if unknown:
        unsupported.append(f"tensor {unknown[0]}" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                           + ": llama.cpp's eagle3 graph has no place for it")
    return DraftFormat(_tool(config, eagle_config), layers, layers_from, defaulted, variant, unsupported)


def converter_config(config: dict, fmt: DraftFormat) -> dict:
    """``config`` with the draft's meaning spelled in the top-level keys the pinned
    converter reads: the layer ids in its convention and the graph options."""
    out = dict(config)
    out["eagle_aux_hidden_state_layer_ids"] = list(fmt.target_layers)
    for key in ("norm_before_fc", "fc_norm", "norm_output"):
        if fmt.variant[key]:
            out[key] = True
    return out
