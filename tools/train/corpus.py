"""The training text: the Python standard library's own source, present on every machine.

Files are split into training and held-out sets by a hash of their path, so
the split is the same everywhere and held-out text never reaches training.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

EXCLUDED_PARTS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__",
                  "turtledemo", "ensurepip"}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.rglob("*.py")) if not EXCLUDED_PARTS & set(p.relative_to(root).parts)]
    return [p for p in files if 200 <= p.stat().st_size <= 400_000]


def is_held_out(path: Path, fraction: float = 0.05) -> bool:
    digest = hashlib.sha256(path.name.encode() + str(path.parent.name).encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < fraction


def split(fraction: float = 0.05) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files)."""
    files = stdlib_files()
    held = [p for p in files if is_held_out(p, fraction)]
    return [p for p in files if not is_held_out(p, fraction)], held


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")
