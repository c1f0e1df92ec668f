"""Hugging Face checkpoints to GGUF: a target and its EAGLE-3 draft.

Drives the pinned llama.cpp's own ``convert_hf_to_gguf.py`` (shipped with
eagle3), so the files match the llama.cpp eagle3 runs: the target first,
then the draft with ``--target-model-dir`` (the draft takes the target's
tokenizer and its layer count). Accepted drafts are those llama.cpp's
converter knows: yuhuili's ``LlamaForCausalLMEagle3``, RedHat's
``Eagle3Speculator``, ``Eagle3LlamaForCausalLM``, ``Eagle3DraftModel``.
The converter needs PyTorch (``pip install "eagle3[train]"``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from eagle3 import _pinned
from eagle3.compat import PairReport, check_pair
from eagle3.errors import Eagle3Error

__all__ = ["ConversionError", "convert"]

OUTTYPES = ("f32", "f16", "bf16", "q8_0", "auto")


class ConversionError(Eagle3Error):
    """A checkpoint could not be converted."""


def _config(directory: Path, what: str) -> dict:
    if not directory.is_dir():
        raise ConversionError(f"the {what} checkpoint {directory} is not a folder")
    path = directory / "config.json"
    if not path.is_file():
        raise ConversionError(f"{directory} has no config.json: not a Hugging Face checkpoint")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConversionError(f"{path} is not readable JSON: {e}") from None


def _check_draft_config(config: dict, directory: Path) -> None:
    layer = config.get("transformer_layer_config", {})
    layers = config.get("num_hidden_layers", layer.get("num_hidden_layers"))
    if "draft_vocab_size" not in config or layers != 1:
        arch = (config.get("architectures") or ["?"])[0]
        raise ConversionError(
            f"{directory} ({arch}) is not an EAGLE-3 draft checkpoint: llama.cpp's converter recognizes one by "
            "'draft_vocab_size' and 'num_hidden_layers': 1 in config.json (yuhuili EAGLE-3, RedHat speculators)")


def _run(args: list[str], what: str, progress: bool) -> None:
    script = _pinned.root() / "convert_hf_to_gguf.py"
    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)  # use the pinned gguf-py next to the script
    if progress:
        print(f"eagle3 convert: {what} ...", file=sys.stderr, flush=True)
    result = subprocess.run([sys.executable, str(script), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE)
    if result.returncode != 0:
        detail = (result.stderr or "")[-3000:] + (result.stdout or "")[-2000:]
        raise ConversionError(f"llama.cpp's converter failed on the {what} (exit code {result.returncode})"
                              + (f":\n{detail}" if detail.strip() else "; see its output above"))


def convert(target: str | os.PathLike, draft: str | os.PathLike | None = None,
            out_dir: str | os.PathLike = ".", *, outtype: str = "f16", name: str | None = None,
            progress: bool = True) -> tuple[Path, Path | None, PairReport | None]:
    """Convert a Hugging Face target (and its EAGLE-3 draft) to GGUF in ``out_dir``.

    Returns ``(target_gguf, draft_gguf, report)``: the report is
    :func:`check_pair` of the two results (``None`` without a draft).
    ``outtype`` is the weight type (``f16``, ``bf16``, ``f32``, ``q8_0``).
    """
    if outtype not in OUTTYPES:
        raise ConversionError(f"outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    if importlib.util.find_spec("torch") is None:
        raise ConversionError("llama.cpp's converter needs PyTorch: pip install \"eagle3[train]\"")
    target_dir = Path(target)
    _config(target_dir, "target")
    draft_dir = Path(draft) if draft is not None else None
    if draft_dir is not None:
        _check_draft_config(_config(draft_dir, "draft"), draft_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = name or target_dir.resolve().name
    target_gguf = out / f"{stem}-{outtype}.gguf"
    _run([str(target_dir), "--outfile", str(target_gguf), "--outtype", outtype], "target", progress)
    if draft_dir is None:
        return target_gguf, None, None
    draft_gguf = out / f"{stem}-eagle3-{outtype}.gguf"
    _run([str(draft_dir), "--outfile", str(draft_gguf), "--outtype", outtype, "--target-model-dir", str(target_dir)],
         "EAGLE-3 draft", progress)
    return target_gguf, draft_gguf, check_pair(target_gguf, draft_gguf)
