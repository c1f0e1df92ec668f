"""generate_batch with 4 sequences vs 4 sequential generate calls, side by side.

    python bench/batch_vs_sequential.py [-n 128] [--n-draft 4]

A batched round verifies the drafts of every live sequence in one target
pass, so the target's weights are read once for all of them.
"""

from __future__ import annotations

import argparse

import eagle3
from common import PROMPT, pair, side_by_side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=128, help="tokens to generate per sequence")
    parser.add_argument("--n-draft", type=int, default=4)
    args = parser.parse_args()
    prompts = [PROMPT[i:] + PROMPT[:i] for i in range(0, 32, 8)]
    target_path, draft_path = pair()
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
            eagle3.Context(tm, n_ctx=2048, n_seq_max=4) as target, eagle3.Context(dm, other=target) as draft, \
            eagle3.Eagle3Session(target, draft, n_seq=4, n_draft_max=args.n_draft) as session:
        batch = session.generate_batch(prompts, args.n)
        singles = [session.generate(p, args.n) for p in prompts]
        assert [g.tokens.tolist() for g in batch] == [g.tokens.tolist() for g in singles]
        t_seq, t_batch = side_by_side(lambda: [session.generate(p, args.n) for p in prompts],
                                      lambda: session.generate_batch(prompts, args.n))
        total = 4 * args.n
        print(f"4 sequential generate calls: {total / t_seq:8.1f} tokens/s")
        print(f"generate_batch of 4:         {total / t_batch:8.1f} tokens/s  "
              f"({t_seq / t_batch:.2f}x the sequential throughput, tau {batch.stats.mean_accepted_length:.2f})")


if __name__ == "__main__":
    main()
