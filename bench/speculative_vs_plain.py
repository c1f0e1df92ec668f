"""Speculative (EAGLE-3) vs plain greedy decoding of the same target, side by side.

    python bench/speculative_vs_plain.py [-n 256] [--pair bench|bench-random|shipped]

Both run inside the extension (session.generate and context.generate); the
output is identical, only the time differs. ``auto`` is the adaptive draft
length (a session of n_draft_max 8); with ``--pair bench-random`` (a draft
that knows nothing) it should fall back to plain decoding.
"""

from __future__ import annotations

import argparse

import eagle3
from common import PROMPT, pair, side_by_side
from eagle3 import shipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=256, help="tokens to generate")
    parser.add_argument("--pair", default="bench", choices=("bench", "bench-random", "shipped"))
    args = parser.parse_args()
    target_path, draft_path = shipped.toy_pair() if args.pair == "shipped" else pair(args.pair)
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
            eagle3.Context(tm, n_ctx=1024) as target, eagle3.Context(dm, other=target) as draft, \
            eagle3.Context(tm, n_ctx=1024) as plain_ctx:  # no session: no hidden-state extraction to pay for
        prompt = tm.tokenize(shipped.toy_prompts()[0]) if args.pair == "shipped" else PROMPT
        plain = plain_ctx.generate(prompt, args.n)
        for n_draft in (2, 4, 8, "auto"):
            with eagle3.Eagle3Session(target, draft, n_draft_max=8 if n_draft == "auto" else n_draft) as session:
                g = session.generate(prompt, args.n, n_draft_max=n_draft)
                assert g.tokens.tolist() == plain.tokens.tolist()
                t_plain, t_spec = side_by_side(lambda: plain_ctx.generate(prompt, args.n),
                                               lambda: session.generate(prompt, args.n, n_draft_max=n_draft))
                print(f"n_draft_max={n_draft}: plain greedy {args.n / t_plain:7.1f} tokens/s | EAGLE-3 "
                      f"{args.n / t_spec:7.1f} tokens/s | speedup {t_plain / t_spec:5.2f}x | "
                      f"tau {g.stats.mean_accepted_length:.2f}, acceptance {g.stats.acceptance_rate:.1%}, "
                      f"plain rounds {g.stats.n_plain_rounds}/{g.stats.n_rounds}")


if __name__ == "__main__":
    main()
