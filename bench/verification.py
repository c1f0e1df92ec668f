"""Match vs rejection verification at temperature > 0, side by side, on the shipped pair.

    python bench/verification.py [-n 128] [--prompts 8] [--seeds 3] [--n-draft-max 4]

For each temperature both verifications generate from the same held-out prompts and
seeds, interleaved (match, rejection, match, ...) so that both see the same machine;
plain sampling of the target is timed alongside. Prints tau (tokens per target pass),
the acceptance rate and tokens/s of each, and the ratio of tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import eagle3
from eagle3 import shipped
from eagle3.stats import GenerationStats


def run(generate, prompts, seeds, n, temperature, **kwargs):
    stats, seconds = GenerationStats(), 0.0
    for prompt in prompts:
        for seed in seeds:
            t0 = time.perf_counter()
            g = generate(prompt, n, temperature=temperature, seed=seed, **kwargs)
            seconds += time.perf_counter() - t0
            stats = stats + g.stats
    return stats, stats.n_generated / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=128, help="tokens per generation")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per prompt")
    parser.add_argument("--n-draft-max", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (medians of tokens/s)")
    args = parser.parse_args()
    target_path, draft_path = shipped.toy_pair()
    prompts = shipped.toy_prompts()[:args.prompts]
    seeds = range(args.seeds)
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, eagle3.Context(tm) as target, \
            eagle3.Context(dm, other=target) as draft, eagle3.Context(tm) as plain_ctx, \
            eagle3.Eagle3Session(target, draft, n_draft_max=args.n_draft_max) as session:
        session.generate(prompts[0], 16)  # warm-up
        print(f"shipped pair, {len(prompts)} held-out prompts x {args.seeds} seeds, {args.n} tokens, "
              f"n_draft_max {args.n_draft_max}; tokens/s: medians of {args.repeats} interleaved runs")
        print("| T | verify | tau | acceptance | tokens/s | vs plain sampling | vs match |")
        print("|---|---|---|---|---|---|---|")
        for temperature in (0.6, 1.0):
            rates: dict[str, list[float]] = {"plain": [], "match": [], "rejection": []}
            stats: dict[str, GenerationStats] = {}
            for _ in range(args.repeats):
                rates["plain"].append(run(plain_ctx.generate, prompts, seeds, args.n, temperature)[1])
                for verify in ("match", "rejection"):
                    stats[verify], rate = run(session.generate, prompts, seeds, args.n, temperature, verify=verify)
                    rates[verify].append(rate)
            plain = statistics.median(rates["plain"])
            match = statistics.median(rates["match"])
            for verify in ("match", "rejection"):
                st, rate = stats[verify], statistics.median(rates[verify])
                print(f"| {temperature} | {verify} | {st.mean_accepted_length:.2f} | {st.acceptance_rate:.1%} | "
                      f"{rate:.1f} | {rate / plain:.2f}x | {rate / match:.2f}x |")
            print(f"| {temperature} | (plain sampling) | 1.00 | | {plain:.1f} | 1.00x | |")


if __name__ == "__main__":
    main()
