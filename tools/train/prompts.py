"""Prompts from the held-out standard-library files, for measuring the shipped pair
(ship.py writes them next to it).

Each prompt is the code before a function body: up to 12 lines of context
ending with a ``def ...:`` line. The files are the ones the training recipe
holds out, so no prompt was trained on.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

DEF = re.compile(r"^\s*def \w+\(.*\).*:\s*$")


def held_out_prompts(count: int) -> list[str]:
    _, held = corpus.split()
    candidates = []
    for path in held:
        lines = corpus.read(path).splitlines()
        for i, line in enumerate(lines):
            if DEF.match(line) and i >= 3:
                candidates.append("\n".join(lines[max(0, i - 11): i + 1]) + "\n")
    step = max(1, len(candidates) // count)
    return candidates[::step][:count]

