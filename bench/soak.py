"""Soak test: many sequences through one session, then many create/close cycles.

    python bench/soak.py [--sequences 10000] [--cycles 5000]

Prints the resident memory (RSS) after a warm-up and at the end of each
phase; flat is the target. Uses the synthesized chain pair, where drafts are
partly accepted, so every path (accept, rollback, KV trimming) runs.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import eagle3
from eagle3.testing import DraftSpec, TargetSpec, write_pair

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from eagle3_loop import speculative_generate  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def phase(name: str, total: int, step) -> None:
    warmup = max(1, total // 10)
    for i in range(warmup):
        step(i)
    gc.collect()
    start, t0 = rss_mb(), time.perf_counter()
    for i in range(warmup, total):
        step(i)
    gc.collect()
    end = rss_mb()
    print(f"{name}: {total} iterations in {time.perf_counter() - t0:.1f} s; RSS after warm-up {start:.1f} MB, "
          f"at the end {end:.1f} MB, growth {end - start:+.2f} MB "
          f"({(end - start) * 1024 / (total - warmup):+.3f} KB per iteration)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=5_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        target_path, draft_path = write_pair(tmp, TargetSpec(weights="chain"),
                                             DraftSpec(weights="aligned", agreement=0.7))
        rng = np.random.default_rng(0)

        with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
                eagle3.Context(tm, n_ctx=256) as target, eagle3.Context(dm, other=target) as draft, \
                eagle3.Eagle3Session(target, draft, n_draft_max=4) as session:
            def sequence(i: int) -> None:
                target.clear()
                draft.clear()
                speculative_generate(session, target, rng.integers(0, tm.n_vocab, 4).astype(np.int32), 12)

            phase("sequences through one session", args.sequences, sequence)
            stats = session.stats()
            print(f"  acceptance {stats['acceptance_rate']:.1%}, tau {stats['mean_accepted_length']:.2f}")

        def cycle(i: int) -> None:
            with eagle3.Model(target_path) as m, eagle3.Model(draft_path) as d, \
                    eagle3.Context(m, n_ctx=256) as t, eagle3.Context(d, other=t) as c, \
                    eagle3.Eagle3Session(t, c, n_draft_max=3) as s:
                batch = eagle3.Batch.from_tokens([1, 2, 3])
                t.decode(batch)
                s.process(batch)
                s.draft(0, 3, t.argmax(-1))

        phase("create/close cycles of models, contexts and sessions", args.cycles, cycle)


if __name__ == "__main__":
    main()
