"""Facts about the pinned llama.cpp that eagle3 states as lists, derived again from its source.

When the pin moves, these say which list to update.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eagle3 import _build_config, compat

SRC = Path(_build_config.LLAMA_CPP_SOURCE) / "src"
pytestmark = pytest.mark.skipif(not (SRC / "models").is_dir(), reason="the pinned llama.cpp source is not here")


def _architectures_whose_graph(asserts: str) -> set[str]:
    """Architecture names whose model class is defined in a ``src/models`` file with a line
    ``GGML_ASSERT(<asserts>)`` (matched as a regular expression), not commented out."""
    names = dict(re.findall(r'\{\s*(LLM_ARCH_\w+),\s*"([^"]+)"\s*\}', (SRC / "llama-arch.cpp").read_text()))
    class_of, pending = {}, []
    for line in (SRC / "llama-model.cpp").read_text().splitlines():
        if m := re.search(r"case (LLM_ARCH_\w+):", line):
            pending.append(m.group(1))
        elif m := re.search(r"return new (llama_model_\w+)\(", line):
            class_of.update(dict.fromkeys(pending, m.group(1)))
            pending = []
    classes = set()
    for path in (SRC / "models").glob("*.cpp"):
        text = path.read_text()
        if re.search(rf"^\s*GGML_ASSERT\({asserts}\)", text, re.M):
            classes |= set(re.findall(r"(llama_model_\w+)::", text))
    return {names[arch] for arch, cls in class_of.items() if cls in classes and arch in names}


def test_the_architectures_whose_rope_must_rotate_whole_heads():
    found = _architectures_whose_graph(r"n_embd_head(_k)? == (hparams\.)?n_rot")
    assert found == compat.ROPE_IS_WHOLE_HEAD
