"""Prefill time saved by prefix reuse, measured side by side.

    python bench/prefix_reuse.py [--prompt 512] [-n 32] [--rounds 5] [--threads 1]

Three cases, each with reuse and with ``reuse=False``, interleaved round by round:

- continuation: ``generate(prompt + output, n)`` after ``generate(prompt, n)`` (the
  session is put back at that point with ``load_state`` before each run; the load is
  timed apart);
- a new question after a long shared context: the prompt leaves the held tokens 16
  tokens before their end;
- ``generate_batch`` of 4 prompts that share all but their last 8 tokens.

One thread by default: on a shared machine a second thread spinning at llama.cpp's
barriers behind another process's work makes single runs vary tenfold. It prints the
median prefill time (``stats.t_prefill_s``) and whole-call time of each,
and their ratios. Every pair of runs gives the same tokens (checked).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import eagle3
from common import pair


def timed(fn):
    t0 = time.perf_counter()
    g = fn()
    return g, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("-n", type=int, default=32, help="tokens to generate")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n-draft", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    target_path, draft_path = pair()
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
            eagle3.Context(tm, n_ctx=4096, n_seq_max=4, n_threads=args.threads) as target, \
            eagle3.Context(dm, other=target) as draft, \
            eagle3.Eagle3Session(target, draft, n_seq=4, n_draft_max=args.n_draft) as session:
        rng = np.random.default_rng(0)
        prompt = rng.integers(100, tm.n_vocab, args.prompt).astype(np.int32)
        first = session.generate(prompt, args.n)
        full = np.concatenate([prompt, first.tokens])
        state = session.save_state()
        question = np.concatenate([full[:-16], rng.integers(100, tm.n_vocab, 24)]).astype(np.int32)
        shared = rng.integers(100, tm.n_vocab, args.prompt).astype(np.int32)
        prompts = [np.concatenate([shared, rng.integers(100, tm.n_vocab, 8)]).astype(np.int32) for _ in range(4)]

        def load():
            session.load_state(state)

        def forget():
            target.clear()  # the caches hold nothing of these prompts: only the shared prefix is reused

        # name: (prepare, run); each case with reuse, then without
        cases = {
            "continuation": (load, lambda reuse: session.generate(full, args.n, reuse=reuse)),
            "new question": (load, lambda reuse: session.generate(question, args.n, reuse=reuse)),
            "batch of 4, shared prefix": (forget, lambda reuse: session.generate_batch(prompts, args.n, reuse=reuse)),
        }
        results = {name: {True: ([], [], []), False: ([], [], [])} for name in cases}
        loads = []
        for name, (prepare, run) in cases.items():  # warm-up, and the same tokens either way
            prepare()
            a = run(True)
            b = run(False)
            tokens = (lambda g: [list(x) for x in g.tokens]) if name.startswith("batch") else (lambda g: list(g.tokens))
            assert tokens(a) == tokens(b), name
        for _ in range(args.rounds):
            for name, (prepare, run) in cases.items():
                for reuse in (True, False):
                    t0 = time.perf_counter()
                    prepare()
                    if prepare is load:
                        loads.append(time.perf_counter() - t0)
                    g, t = timed(lambda: run(reuse))
                    r = results[name][reuse]
                    r[0].append(g.stats.t_prefill_s)
                    r[1].append(t)
                    r[2].append(g.stats.n_reused)
        print(f"pair: {target_path.name} / {draft_path.name}; prompt {args.prompt} tokens, {args.n} generated, "
              f"{args.threads} thread(s), medians of {args.rounds} interleaved rounds")
        print(f"load_state: {1e3 * statistics.median(loads):.2f} ms ({len(state) / 2**20:.1f} MiB state)")
        print(f"{'case':27s} {'reused':>7s} {'prefill: reuse':>15s} {'whole':>10s} {'saved':>7s} "
              f"{'call: reuse':>12s} {'whole':>10s} {'ratio':>6s}")
        for name, r in results.items():
            pr, tr, n = (statistics.median(x) for x in r[True])
            pw, tw, _ = (statistics.median(x) for x in r[False])
            print(f"{name:27s} {int(n):7d} {1e3 * pr:12.2f} ms {1e3 * pw:7.2f} ms {1 - pr / pw:6.0%} "
                  f"{1e3 * tr:9.2f} ms {1e3 * tw:7.2f} ms {tw / tr:5.2f}x")


if __name__ == "__main__":
    main()
