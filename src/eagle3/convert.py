"""Hugging Face checkpoints to GGUF: a target and its EAGLE-3 draft.

Drives the pinned llama.cpp's own ``convert_hf_to_gguf.py`` (shipped with
eagle3), so the files match the llama.cpp eagle3 runs: the target first,
then the draft with ``--target-model-dir`` (the draft takes the target's
tokenizer and its layer count). Before the converter sees a draft, its
checkpoint is read the way the tool that trained it meant it
(:mod:`eagle3.draft_formats`): the target layer ids in llama.cpp's convention,
the graph variant, and a one-line refusal of what llama.cpp cannot run. The
converter then reads a copy of ``config.json`` that spells this out in the keys
it knows (the weights are linked, not copied). docs/formats.md lists the
formats. The converter needs PyTorch (``pip install "eagle3[train]"``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from eagle3 import _pinned, draft_formats
from eagle3._logging import logger
from eagle3._validate import as_int
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


def _draft_format(config: dict, directory: Path, target_config: dict,
                  target_layers: list[int] | None) -> draft_formats.DraftFormat:
    layer = config.get("transformer_layer_config", {})
    layers = config.get("num_hidden_layers", layer.get("num_hidden_layers"))
    arch = (config.get("architectures") or ["?"])[0]
    if "draft_vocab_size" not in config or layers is None:
        raise ConversionError(
            f"{directory} ({arch}) is not an EAGLE-3 draft checkpoint: llama.cpp's converter recognizes one by "
            "'draft_vocab_size' and 'num_hidden_layers' in config.json")
    target_config = {**target_config, **target_config.get("text_config", {})}
    n_layer = target_config.get("num_hidden_layers")
    if not isinstance(n_layer, int) or n_layer <= 0:
        raise ConversionError("the target's config.json has no num_hidden_layers")
    fmt = draft_formats.read_draft_format(config, n_layer, draft_formats.tensor_names(directory))
    if fmt.unsupported:
        raise ConversionError(f"{directory} ({fmt.tool}, {arch}): llama.cpp cannot run {fmt.unsupported[0]}")
    if target_layers is not None:
        layers = [as_int(i, "target_layers[]") for i in target_layers]
        fmt.target_layers, fmt.layers_from, fmt.defaulted = layers, "the caller", False
    bad = [i for i in fmt.target_layers if not 0 <= i <= n_layer]
    if len(fmt.target_layers) != 3 or bad:
        raise ConversionError(f"target layers {fmt.target_layers} (from {fmt.layers_from}): three layer inputs "
                              f"of the target's 0..{n_layer} are needed ({n_layer}: its last layer's output)")
    return fmt


def _converter_view(directory: Path, config: dict, fmt: draft_formats.DraftFormat, into: Path) -> Path:
    """A folder that is the draft checkpoint with the config the converter should read."""
    view = into / "draft"
    view.mkdir()
    for item in directory.iterdir():
        if item.name != "config.json":
            (view / item.name).symlink_to(item.resolve())
    (view / "config.json").write_text(json.dumps(draft_formats.converter_config(config, fmt), indent=2))
    return view


def _run(args: list[str], what: str, progress: bool) -> None:
    script = _pinned.root() / "convert_hf_to_gguf.py"
    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)  # use the pinned gguf-py next to the script
    if progress:
        print(f"eagle3 convert: {what} ...", file=sys.stderr, flush=True)
    result = subprocess.run([sys.executable, str(script), *args], env=env, text=True, capture_output=True)
    output = (result.stderr or "") + (result.stdout or "")
    logger.debug("llama.cpp's converter on the %s:\n%s", what, output)
    if result.returncode != 0:
        # the converter's own last word (its exception), not its traceback
        last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "")
        raise ConversionError(f"llama.cpp's converter failed on the {what} (exit code {result.returncode})"
                              + (f": {last}" if last else "") + " (its whole output: the eagle3 logger at DEBUG)")


def convert(target: str | os.PathLike, draft: str | os.PathLike | None = None,
            out_dir: str | os.PathLike = ".", *, outtype: str = "f16", name: str | None = None,
            target_layers: list[int] | None = None,
            progress: bool = True) -> tuple[Path, Path | None, PairReport | None]:
    """Convert a Hugging Face target (and its EAGLE-3 draft) to GGUF in ``out_dir``.

    Returns ``(target_gguf, draft_gguf, report)``: the report is
    :func:`check_pair` of the two results (``None`` without a draft), with the
    draft's format among its facts. ``outtype`` is the weight type (``f16``,
    ``bf16``, ``f32``, ``q8_0``). ``target_layers`` (three layer inputs of the
    target) overrides what the checkpoint says, for a draft that does not say.
    """
    if outtype not in OUTTYPES:
        raise ConversionError(f"outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    target_dir = Path(target)
    target_config = _config(target_dir, "target")
    draft_dir = Path(draft) if draft is not None else None
    fmt = None
    if draft_dir is not None:
        draft_config = _config(draft_dir, "draft")
        fmt = _draft_format(draft_config, draft_dir, target_config, target_layers)
    if importlib.util.find_spec("torch") is None:
        raise ConversionError("llama.cpp's converter needs PyTorch: pip install \"eagle3[train]\"")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = name or target_dir.resolve().name
    target_gguf = out / f"{stem}-{outtype}.gguf"
    _run([str(target_dir), "--outfile", str(target_gguf), "--outtype", outtype], "target", progress)
    if draft_dir is None:
        return target_gguf, None, None
    if progress:
        print(f"eagle3 convert: {fmt.describe()}", file=sys.stderr, flush=True)
    if fmt.defaulted:
        logger.warning("%s names no target layers: using %s, %s. A draft trained on other layers drafts "
                       "almost nothing right; give them with target_layers (--target-layers)",
                       draft_dir, fmt.layers_from, fmt.target_layers)
        if progress:
            print(f"eagle3 convert: warning: the draft names no target layers; using {fmt.layers_from}, "
                  f"{fmt.target_layers} (--target-layers to give them)", file=sys.stderr, flush=True)
    draft_gguf = out / f"{stem}-eagle3-{outtype}.gguf"
    with tempfile.TemporaryDirectory(prefix="eagle3-convert-") as tmp:
        view = _converter_view(draft_dir, draft_config, fmt, Path(tmp))
        _run([str(view), "--outfile", str(draft_gguf), "--outtype", outtype, "--target-model-dir", str(target_dir)],
             "EAGLE-3 draft", progress)
    report = check_pair(target_gguf, draft_gguf)
    report.facts["draft format"] = fmt.describe()
    return target_gguf, draft_gguf, report
