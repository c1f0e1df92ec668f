"""The model pair that ships with eagle3: a small Llama trained on the Python
standard library and its EAGLE-3 draft (see tools/train/ for the recipe).
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle3.errors import ModelLoadError

MODELS = Path(__file__).resolve().parent / "models"
TARGET = MODELS / "pystdlib-target-q8_0.gguf"
DRAFT = MODELS / "pystdlib-eagle3-q8_0.gguf"
PROMPTS = MODELS / "held_out_prompts.json"


def default_pair() -> tuple[Path, Path]:
    """Paths of the shipped target and EAGLE-3 draft GGUF files."""
    if not (TARGET.is_file() and DRAFT.is_file()):
        raise ModelLoadError(f"the default model pair is missing from {MODELS}; pass a target and a draft")
    return TARGET, DRAFT


def held_out_prompts() -> list[str]:
    """Code snippets from standard-library files the shipped pair never saw in training."""
    return json.loads(PROMPTS.read_text(encoding="utf-8"))
