"""Plain greedy decoding and the step-by-step speculative loop (examples/eagle3_loop.py), and prompts."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from eagle3_loop import greedy_generate as greedy, speculative_generate as speculative  # noqa: E402

__all__ = ["greedy", "speculative", "prompts"]


def prompts(n_vocab: int, count: int = 20, seed: int = 0) -> list[np.ndarray]:
    """``count`` prompts of varied lengths (1 to 40 tokens)."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(1, 40, count).astype(int)
    return [rng.integers(0, n_vocab, int(k)).astype(np.int32) for k in lengths]
