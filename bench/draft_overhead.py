"""What session.draft() costs over a draft made in C, in microseconds per call.

    python bench/draft_overhead.py [--tokens 200]

All three run the same greedy generation with one-token drafts of a tiny draft
model, so they draft from the same states: the engine (generate) times its
drafts around the shim call, without the GIL; a Python loop times each call
of the extension's own draft (the session's handle) and, in another run, of
session.draft(). The first gap is what drafting between Python calls costs
(the extension's checks and result array, and the CPU's state after Python
ran); the second is the Python layer's (argument types, locks). They run in
turn, several times.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import eagle3
from common import pair

PROMPT = [5, 6, 7]


def python_loop(session: eagle3.Eagle3Session, target: eagle3.Context, n_new: int, draft_fn) -> float:
    """Greedy speculative decoding step by step; returns the seconds per ``draft_fn`` call."""
    batch = eagle3.Batch(len(PROMPT) + 2)
    batch.add_sequence(PROMPT)
    target.clear()
    session.draft_ctx.clear()
    target.decode(batch)
    session.process(batch)
    n_past, last, n_out, t_draft, n_drafts = len(PROMPT), target.argmax(-1), 1, 0.0, 0
    out = np.zeros(1, np.int32)  # the draft is written here
    while n_out < n_new:
        t0 = time.perf_counter()
        draft = draft_fn(0, n_past, last, out)
        t_draft += time.perf_counter() - t0
        n_drafts += 1
        batch.clear()
        batch.add(last, n_past, 0, True)
        batch.add_arrays(draft, [n_past + 1 + i for i in range(len(draft))], 0, True)
        target.decode(batch)
        session.process(batch)
        accepted = [target.argmax(0)]
        if len(draft) and accepted[0] == draft[0]:
            accepted.append(target.argmax(1))
        session.accept(0, len(accepted) - 1)
        n_past += len(accepted)
        n_out += len(accepted)
        last = accepted[-1]
        target.seq_rm(0, n_past)
    return t_draft / n_drafts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    target_path, draft_path = pair("tiny")  # a cheap draft, so the overhead is not lost in noise
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
            eagle3.Context(tm) as target, eagle3.Context(dm, other=target) as draft, \
            eagle3.Eagle3Session(target, draft, n_draft_max=1) as session:
        handle = session._live()  # the extension's object behind the session
        in_c, ext, api = [], [], []
        for _ in range(args.rounds):  # in turn, so that all see the same machine
            stats = session.generate(PROMPT, args.tokens).stats
            in_c.append(stats.t_draft_s / stats.n_draft_calls)
            ext.append(python_loop(session, target, args.tokens, handle.draft))
            api.append(python_loop(session, target, args.tokens,
                                   lambda seq, n_past, last, out: session.draft(seq, n_past, last, out=out)))
        c, e, a = (statistics.median(x) * 1e6 for x in (in_c, ext, api))
        print(f"draft in C (engine):          {c:8.1f} us per call")
        print(f"the extension's draft call:   {e:8.1f} us per call  (+{e - c:.1f})")
        print(f"session.draft():              {a:8.1f} us per call  (+{a - e:.1f} over the extension's)")


if __name__ == "__main__":
    main()
