"""Counters of drafting and generation, and the figures derived from them.

The counters are llama.cpp-side facts counted in one C struct
(``e3_counters`` in ``shim/eagle3_shim.h``): a session keeps one per
sequence, a generation one per request and one for the whole call. Here they
become one dataclass, :class:`GenerationStats`, and each derived figure has
exactly one definition:

- **acceptance rate**: accepted / drafted tokens.
- **mean accepted length** (tau): tokens a sequence gains per target pass,
  ``1 + n_accepted / n_seq_rounds`` (the accepted drafts plus the target's
  own token). A session's ``n_seq_rounds`` counts its ``accept()`` calls.
- **acceptance per position**: for each draft position k, the share of the
  sequence-rounds whose draft reached position k (had more than k tokens)
  that accepted it: ``accepted_per_position[k] / sum(draft_lengths[k+1:])``.
- **tokens per second**: generated tokens / the call's whole time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


def acceptance_rate(n_accepted: int, n_drafted: int) -> float:
    return n_accepted / n_drafted if n_drafted else 0.0


def mean_accepted_length(n_accepted: int, n_seq_rounds: int) -> float:
    return 1.0 + n_accepted / n_seq_rounds if n_seq_rounds else 0.0


def acceptance_per_position(accepted_per_position: np.ndarray, draft_lengths: np.ndarray) -> np.ndarray:
    n = len(accepted_per_position)
    lengths = np.zeros(n + 1, np.int64)
    lengths[:min(len(draft_lengths), n + 1)] = draft_lengths[:n + 1]
    reached = np.cumsum(lengths[::-1])[::-1][1:]  # rounds whose draft had more than k tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(reached > 0, accepted_per_position / np.maximum(reached, 1), 0.0)


def _histogram() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclasses.dataclass
class GenerationStats:
    """Counters and timings of one generation (or a sum of them).

    A generation's per-request counters count the passes the request took
    part in and their whole times; the whole call's count each pass once.
    """

    # e3_counters' fields, in its order (E3_COUNTER_FIELDS), then its histograms
    n_prompt: int = 0
    """Prompt tokens, :attr:`n_reused` of them kept from what the contexts held."""
    n_reused: int = 0
    """Prompt tokens not decoded: the prefix the contexts already held (prefix reuse)."""
    n_generated: int = 0
    n_rounds: int = 0
    """Target passes over a verify batch."""
    n_seq_rounds: int = 0
    """Sequences verified, summed over the rounds."""
    n_plain_rounds: int = 0
    """Rounds decoded without a draft because speculation did not pay (``n_draft_max="auto"``)."""
    n_draft_calls: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_process_calls: int = 0
    t_prefill_s: float = 0.0
    t_draft_s: float = 0.0
    t_verify_s: float = 0.0
    t_process_s: float = 0.0
    t_accept_s: float = 0.0
    t_sample_s: float = 0.0
    t_total_s: float = 0.0
    accepted_per_position: np.ndarray = dataclasses.field(default_factory=_histogram)
    """Sequence-rounds that accepted more than k drafted tokens, for each draft position k (int64)."""
    draft_lengths: np.ndarray = dataclasses.field(default_factory=_histogram)
    """Sequence-rounds by the length k of the draft they verified, k = 0 .. n_draft_max
    (int64; 0: no draft): the lengths ``n_draft_max="auto"`` chose."""

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens."""
        return acceptance_rate(self.n_accepted, self.n_drafted)

    @property
    def mean_accepted_length(self) -> float:
        """Tau: tokens gained per sequence per target pass (accepted drafts + the target's own token)."""
        return mean_accepted_length(self.n_accepted, self.n_seq_rounds)

    @property
    def acceptance_per_position(self) -> np.ndarray:
        """For each draft position, the share of the drafts reaching it that were accepted there."""
        return acceptance_per_position(self.accepted_per_position, self.draft_lengths)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of the whole call, prefill included."""
        return self.n_generated / self.t_total_s if self.t_total_s > 0 else 0.0

    def __add__(self, other: GenerationStats) -> GenerationStats:
        out = GenerationStats()
        for field in dataclasses.fields(self):
            a, b = getattr(self, field.name), getattr(other, field.name)
            if isinstance(a, np.ndarray):
                total = np.zeros(max(len(a), len(b)), np.int64)
                total[:len(a)] += a
                total[:len(b)] += b
                setattr(out, field.name, total)
            else:
                setattr(out, field.name, a + b)
        return out

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                 acceptance_per_position=self.acceptance_per_position, tokens_per_s=self.tokens_per_s)
        return d


# what a session counts itself (its draft(), process() and accept() calls)
SESSION_FIELDS = ("n_draft_calls", "n_drafted", "n_seq_rounds", "n_accepted", "n_process_calls",
                  "accepted_per_position", "draft_lengths", "t_draft_s", "t_process_s", "t_accept_s",
                  "acceptance_rate", "mean_accepted_length", "acceptance_per_position")


def session_dict(stats: GenerationStats) -> dict[str, Any]:
    """A session's counters as :meth:`Eagle3Session.stats` returns them."""
    full = stats.as_dict()
    d = {key: full[key] for key in SESSION_FIELDS}
    d["n_accept_calls"] = stats.n_seq_rounds  # each accept() call verifies one sequence-round
    return d


def format_line(kind: str, stats: GenerationStats) -> str:
    """One log line of a session's counters."""
    rates = ", ".join(f"{p:.3f}" for p in stats.acceptance_per_position)
    return (f"{kind} session: draft calls {stats.n_draft_calls}, drafted {stats.n_drafted}, accepted "
            f"{stats.n_accepted} ({100 * stats.acceptance_rate:.1f}%), mean accepted length "
            f"{stats.mean_accepted_length:.3f}, acceptance per position ({rates}), time draft/process/accept "
            f"{1e3 * stats.t_draft_s:.3f}/{1e3 * stats.t_process_s:.3f}/{1e3 * stats.t_accept_s:.3f} ms")
