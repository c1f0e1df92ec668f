"""A one-line progress bar on stderr (rewritten in place on a terminal, a line per tenth otherwise)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, what: str, total: int, enabled: bool = True) -> None:
        self.what, self.total, self.enabled = what, max(1, total), enabled
        self.n, self.note = 0, ""
        self.start = time.monotonic()
        self.tty = enabled and sys.stderr.isatty()
        self.shown_tenth = -1

    def advance(self, k: int = 1, note: str = "") -> None:
        self.n += k
        self.note = note or self.note
        if not self.enabled:
            return
        tenth = 10 * self.n // self.total
        if self.tty or tenth != self.shown_tenth:
            self.shown_tenth = tenth
            self._show()

    def _show(self, end: str = "") -> None:
        elapsed = time.monotonic() - self.start
        frac = min(1.0, self.n / self.total)
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        bar = "#" * int(24 * frac) + "-" * (24 - int(24 * frac))
        line = (f"{self.what:>9} [{bar}] {self.n}/{self.total} {elapsed:5.0f}s elapsed, {eta:5.0f}s left"
                f"{'  ' + self.note if self.note else ''}")
        sys.stderr.write(("\r" + line + end) if self.tty else (line + "\n"))
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.tty:
            self._show("\n")
