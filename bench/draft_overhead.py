"""What session.draft() costs over the bare C call, in nanoseconds per call.

    python bench/draft_overhead.py [--calls 2000]

Both make the same draft from the same state: the C side calls the shim in a
loop without the GIL; the Python side calls session.draft(). The difference
is the binding's own cost (argument checks, locks, the NumPy result).
"""

from __future__ import annotations

import argparse
import statistics
import time

import eagle3
from common import pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    target_path, draft_path = pair("tiny")  # a cheap draft, so the overhead is not lost in noise
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
            eagle3.Context(tm) as target, eagle3.Context(dm, other=target) as draft, \
            eagle3.Eagle3Session(target, draft, n_draft_max=1) as session:
        batch = eagle3.Batch.from_tokens([5, 6, 7])
        target.decode(batch)
        session.process(batch)
        handle = session._live()
        last = target.argmax(-1)
        bare, api = [], []
        for _ in range(args.rounds):  # in turn, so that both see the same machine
            bare.append(handle.time_bare_draft(0, 3, last, args.calls) / args.calls)
            t0 = time.perf_counter()
            for _ in range(args.calls):
                session.draft(0, 3, last)
            api.append((time.perf_counter() - t0) / args.calls)
        b, a = statistics.median(bare), statistics.median(api)
        print(f"bare C draft:      {b * 1e9:10.0f} ns per call")
        print(f"session.draft():   {a * 1e9:10.0f} ns per call  ({a / b:.3f}x)")
        print(f"binding overhead:  {(a - b) * 1e9:10.0f} ns per call")


if __name__ == "__main__":
    main()
