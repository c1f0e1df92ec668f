"""The Python tools of the llama.cpp tree eagle3 was built from.

A wheel carries gguf-py and the Hugging Face converter in ``_llama_cpp/``
next to this file; a development (editable) install reads them from the tree
the build used.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from eagle3 import _build_config


def root() -> Path:
    """Folder holding ``gguf-py/``, ``conversion/`` and ``convert_hf_to_gguf.py``."""
    bundled = Path(__file__).resolve().parent / "_llama_cpp"
    if (bundled / "gguf-py").is_dir():
        return bundled
    return Path(_build_config.LLAMA_CPP_SOURCE)


def import_gguf() -> ModuleType:
    """The pinned tree's gguf-py (``gguf``), which matches the llama.cpp eagle3 runs."""
    path = str(root() / "gguf-py")
    if path not in sys.path:
        sys.path.insert(0, path)
    module = importlib.import_module("gguf")
    return module
