"""The EAGLE-3 speculative loop, step by step, through eagle3's public API.

    python examples/eagle3_loop.py                      # synthesized tiny pair
    python examples/eagle3_loop.py --target T.gguf --draft D.gguf --prompt "def fib(n):"

Each round: the draft model proposes up to n_draft_max tokens from the
target's hidden states; the target verifies them in one batch; the session
learns how many were accepted; rejected positions leave the KV cache. With
greedy verification the output is exactly the target's own greedy output,
which --check confirms by decoding without speculation.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import eagle3


def speculative_generate(session, target, prompt, n_predict, seq_id=0):
    """Greedy speculative decoding of ``n_predict`` tokens after ``prompt`` on ``seq_id``,
    whose KV cache (on both contexts) must be empty."""
    prompt = np.asarray(prompt, dtype=np.int32)
    batch = eagle3.Batch(max(len(prompt), session.n_draft_max + 1), n_seq_max=target.n_seq_max)
    batch.add_sequence(prompt, 0, seq_id)      # prefill: logits for the last token only
    target.decode(batch)
    session.process(batch)                     # the draft reads the target's hidden states
    session.begin(seq_id, prompt)
    n_past, id_last = len(prompt), target.argmax(-1)
    out = []
    while len(out) < n_predict:
        draft = session.draft(seq_id, n_past, id_last)
        batch.clear()                          # verify: id_last plus every drafted token
        batch.add(id_last, n_past, seq_id, True)
        for i, token in enumerate(draft):
            batch.add(int(token), n_past + 1 + i, seq_id, True)
        target.decode(batch)
        session.process(batch)
        accepted = []                          # greedy verification
        for i, token in enumerate(draft):
            accepted.append(target.argmax(i))
            if accepted[-1] != token:
                break
        else:
            accepted.append(target.argmax(len(draft)))
        session.accept(seq_id, len(accepted) - 1)  # the last one is the target's own token
        out += [id_last] + accepted[:-1]
        n_past += len(accepted)
        id_last = accepted[-1]
        target.seq_rm(seq_id, n_past)          # drop the rejected drafts from the target's cache
    return out[:n_predict]


def greedy_generate(model, prompt, n_predict, n_ctx=512):
    """Plain greedy decoding, one token per target pass."""
    prompt = np.asarray(prompt, dtype=np.int32)
    with eagle3.Context(model, n_ctx=n_ctx) as ctx:
        ctx.decode(eagle3.Batch.from_tokens(prompt))
        out = [ctx.argmax(-1)]
        while len(out) < n_predict:
            ctx.decode(eagle3.Batch.from_tokens([out[-1]], pos0=len(prompt) + len(out) - 1))
            out.append(ctx.argmax(-1))
        return out


def synthesized_pair(directory):
    """A tiny target whose next token follows a fixed rule, and a draft that knows 80% of it."""
    from eagle3.testing import DraftSpec, TargetSpec, write_pair

    return write_pair(directory, TargetSpec(weights="chain"), DraftSpec(weights="aligned", agreement=0.8))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target model GGUF (default: a synthesized tiny pair)")
    parser.add_argument("--draft", help="EAGLE-3 draft GGUF for the target")
    parser.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog")
    parser.add_argument("-n", "--n-predict", type=int, default=64)
    parser.add_argument("--n-draft-max", type=int, default=4)
    parser.add_argument("--p-min", type=float, default=0.0)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--check", action="store_true", help="also decode without speculation and compare")
    args = parser.parse_args()
    if bool(args.target) != bool(args.draft):
        parser.error("give both --target and --draft, or neither")

    with tempfile.TemporaryDirectory() as tmp:
        target_path, draft_path = (args.target, args.draft) if args.target else synthesized_pair(tmp)
        with eagle3.Model(target_path) as target_model, eagle3.Model(draft_path) as draft_model, \
                eagle3.Context(target_model, n_ctx=args.n_ctx) as target, \
                eagle3.Context(draft_model, other=target) as draft, \
                eagle3.Eagle3Session(target, draft, n_draft_max=args.n_draft_max, p_min=args.p_min) as session:
            prompt = target_model.tokenize(args.prompt)
            start = time.perf_counter()
            tokens = speculative_generate(session, target, prompt, args.n_predict)
            elapsed = time.perf_counter() - start
            stats = session.stats()

            print(f"prompt: {len(prompt)} tokens; generated {len(tokens)} tokens in {elapsed:.3f} s")
            note = "" if args.target else " (the synthesized pair's test vocabulary renders tokens as hex ids)"
            print(f"text{note}:", target_model.detokenize(np.array(tokens)))
            print(f"acceptance rate: {stats['acceptance_rate']:.1%} "
                  f"({stats['n_accepted']} of {stats['n_drafted']} drafted tokens)")
            print(f"mean accepted length (tau): {stats['mean_accepted_length']:.2f} tokens per target pass")
            print("accepted at draft position:", stats["accepted_per_position"].tolist())
            if args.check:
                same = greedy_generate(target_model, prompt, args.n_predict) == tokens
                print("identical to plain greedy decoding:", "yes" if same else "NO")
                if not same:
                    raise SystemExit(1)


if __name__ == "__main__":
    main()
