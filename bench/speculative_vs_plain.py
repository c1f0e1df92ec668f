"""Speculative (EAGLE-3) vs plain greedy decoding of the same target, side by side.

    python bench/speculative_vs_plain.py [-n 256]

Both run inside the extension (session.generate and context.generate); the
output is identical, only the time differs.
"""

from __future__ import annotations

import argparse

import eagle3
from common import PROMPT, pair, side_by_side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=256, help="tokens to generate")
    args = parser.parse_args()
    target_path, draft_path = pair()
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
            eagle3.Context(tm, n_ctx=1024) as target, eagle3.Context(dm, other=target) as draft, \
            eagle3.Context(tm, n_ctx=1024) as plain_ctx:  # no session: no hidden-state extraction to pay for
        plain = plain_ctx.generate(PROMPT, args.n)
        for n_draft in (2, 4, 8):
            with eagle3.Eagle3Session(target, draft, n_draft_max=n_draft) as session:
                g = session.generate(PROMPT, args.n)
                assert g.tokens.tolist() == plain.tokens.tolist()
                t_plain, t_spec = side_by_side(lambda: plain_ctx.generate(PROMPT, args.n),
                                               lambda: session.generate(PROMPT, args.n))
                print(f"n_draft_max={n_draft}: plain greedy {args.n / t_plain:7.1f} tokens/s | EAGLE-3 "
                      f"{args.n / t_spec:7.1f} tokens/s | speedup {t_plain / t_spec:5.2f}x | "
                      f"tau {g.stats.mean_accepted_length:.2f}, acceptance {g.stats.acceptance_rate:.1%}")


if __name__ == "__main__":
    main()
