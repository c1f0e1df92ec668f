"""Where one speculative round's time goes, against a plain decoding step.

    python bench/round_profile.py [--target T.gguf --draft D.gguf | --toy] [--n-draft 2 4 8] [--prompts 8]

For each draft length, generates greedily on held-out prompts (the default
pair and its held-out chat messages by default; the toy pair and its code
prompts with --toy; code prompts with --target) and splits the decode rounds
into the engine's own timers: drafting (the draft's one-token passes),
verification (the target's pass over the last token and the drafts), the
draft's ``process`` of the verified tokens, and sampling; the rest (batch
building, KV trimming, bookkeeping) is what the timers do not cover. Then the
single costs those are made of, measured alone: a target pass over 1 and k+1
tokens, a draft step. The budget column is the break-even: the round cost that
would match plain decoding at the measured tau.
"""

from __future__ import annotations

import argparse

import numpy as np

import eagle3
from eagle3 import shipped
from common import pass_costs


def decode_only(stats: eagle3.GenerationStats) -> float:
    return stats.t_total_s - stats.t_prefill_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--toy", action="store_true", help="the toy pair that ships inside eagle3")
    parser.add_argument("--n-draft", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("-n", type=int, default=128, help="tokens per prompt")
    args = parser.parse_args()
    chat = not (args.target or args.toy)
    if args.target:
        target_path, draft_path = args.target, args.draft
    else:
        target_path, draft_path = shipped.toy_pair() if args.toy else shipped.default_pair()
    texts = (shipped.held_out_chat_prompts() if chat else shipped.toy_prompts())[:args.prompts]
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
            eagle3.Context(tm, n_ctx=2048) as tctx, eagle3.Context(dm, other=tctx) as dctx, \
            eagle3.Context(tm, n_ctx=2048) as plain:
        prompts = [tm.chat_tokens([{"role": "user", "content": t}]) if chat else tm.tokenize(t) for t in texts]
        plain.generate(prompts[0], 8)
        plain_stats = sum((plain.generate(p, args.n).stats for p in prompts), eagle3.GenerationStats())
        t_plain = decode_only(plain_stats) / (plain_stats.n_generated - len(prompts))
        print(f"{target_path} + {draft_path}, {len(prompts)} prompts x {args.n} tokens, greedy, "
              f"{tctx.n_threads} threads")
        print(f"plain decoding: {t_plain * 1e3:.3f} ms a token")
        print(f"{'n_draft':>7} {'tau':>5} {'budget':>7} {'round':>7} {'draft':>7} {'verify':>7} {'process':>8} "
              f"{'sample':>7} {'other':>7} {'vs plain':>9}   (ms per round; budget: tau plain steps)")
        for n_draft in args.n_draft:
            with eagle3.Eagle3Session(tctx, dctx, n_draft_max=n_draft) as session:
                session.generate(prompts[0], 8)
                st = sum((session.generate(p, args.n).stats for p in prompts), eagle3.GenerationStats())
            ms = 1e3 / st.n_rounds
            parts = [st.t_draft_s, st.t_verify_s, st.t_process_s, st.t_sample_s]
            total = decode_only(st)
            other = total - sum(parts)
            budget = st.mean_accepted_length * t_plain
            cells = " ".join(f"{x * ms:>{w}.3f}" for x, w in zip(parts, (7, 7, 8, 7)))
            print(f"{n_draft:>7} {st.mean_accepted_length:>5.2f} {budget * 1e3:>7.3f} {total * ms:>7.3f} {cells} "
                  f"{other * ms:>7.3f} {budget * st.n_rounds / total:>8.2f}x")

        context = np.concatenate(prompts)[:256].astype(np.int32)
        sizes = sorted({1, *(k + 1 for k in args.n_draft)})
        costs = dict(zip(sizes, pass_costs(tctx, context, sizes)))
        print(f"\ntarget pass after {len(context)} cached tokens (the verify pass of n_draft is n_draft + 1 tokens):")
        for k in sizes:
            print(f"  {k:>2} tokens: {costs[k] * 1e3:7.3f} ms = {costs[k] / costs[1]:.2f} one-token passes")
        with eagle3.Eagle3Session(tctx, dctx, n_draft_max=1) as session:
            session.generate(prompts[0], 8)
            st = session.generate(prompts[0], args.n).stats
        print(f"one draft step: {st.t_draft_s / max(st.n_draft_calls, 1) * 1e3:.3f} ms; the draft's process of "
              f"a round: {st.t_process_s / max(st.n_rounds, 1) * 1e3:.3f} ms (n_draft_max=1)")

if __name__ == "__main__":
    main()
