"""Where speculation pays on a CPU: speedup against target size and weight type.

    python bench/scaling.py [--sizes 20 50 100 200 400] [--types Q8_0 Q4_K_M F16] [-n 96]

Synthesizes agreeing pairs at bench time (a "chain" target whose greedy next
token follows a fixed rule, and an EAGLE-3 draft that knows 90% of the rule,
so acceptance is the same at every size), from about 20M to 400M target
parameters, quantizes each target with llama.cpp's quantizer, and measures
side by side: plain greedy decoding, EAGLE-3 at n_draft_max 4 and "auto",
and what a target pass over 5 tokens costs in one-token passes. Small targets
are compute-bound on a CPU (a pass over k tokens costs nearly k passes);
larger ones wait on memory, and a pass over several tokens costs little more
than one: that is where a draft's tokens come cheap. Files go to
bench/.build/scaling (several GB at the largest sizes).
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

import eagle3
from eagle3.testing import DraftSpec, TargetSpec, write_pair
from common import BUILD, pass_costs, side_by_side

# millions of target parameters -> (layers, width, feed-forward width); widths
# and feed-forward widths are multiples of 256 (K-quant rows); 4096 tokens,
# heads of 64, two query heads per KV head
SHAPES = {20: (6, 512, 1280), 50: (8, 768, 2048), 100: (10, 1024, 2304), 200: (12, 1280, 3584),
          400: (16, 1536, 4096)}
N_VOCAB = 4096
PROMPT = list(range(100, 132))


def spec_for(size: int) -> TargetSpec:
    n_layer, n_embd, n_ff = SHAPES[size]
    return TargetSpec(n_layer=n_layer, n_embd=n_embd, n_head=n_embd // 64, n_head_kv=n_embd // 128, n_ff=n_ff,
                      n_vocab=N_VOCAB, weights="chain", seed=size)


def n_params(t: TargetSpec) -> int:
    kv = t.n_head_kv * t.head_dim
    return t.n_layer * (2 * t.n_embd * t.n_embd + 2 * t.n_embd * kv + 3 * t.n_embd * t.n_ff) + 2 * N_VOCAB * t.n_embd


def pair_files(size: int, file_type: str):
    directory = BUILD / "scaling"
    target_spec = spec_for(size)
    target_f32, draft = directory / f"s{size}-target.gguf", directory / f"s{size}-draft.gguf"
    if not (target_f32.exists() and draft.exists()):
        logging.getLogger("gguf").setLevel(logging.WARNING)
        write_pair(directory, target_spec,
                   DraftSpec(n_head=target_spec.n_head, n_head_kv=target_spec.n_head, n_ff=target_spec.n_ff,
                             weights="aligned", agreement=0.9, seed=size + 1), name=f"s{size}")
    if file_type == "F32":
        return target_f32, draft
    target = directory / f"s{size}-target-{file_type}.gguf"
    if not target.exists():
        eagle3.quantize(target_f32, target, file_type)
    return target, draft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--types", nargs="+", default=["Q8_0", "Q4_K_M", "F16"])
    parser.add_argument("-n", type=int, default=96, help="tokens to generate")
    args = parser.parse_args()
    print(f"{'params':>7} {'type':>7} {'MB':>6} {'pass of 5':>10} {'plain t/s':>10} {'n=4 t/s':>8} {'auto t/s':>9} "
          f"{'n=4':>6} {'auto':>6} {'tau(4)':>7}")
    for size in args.sizes:
        for file_type in args.types:
            target_path, draft_path = pair_files(size, file_type)
            with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
                    eagle3.Context(tm, n_ctx=512) as plain, eagle3.Context(tm, n_ctx=512) as tctx, \
                    eagle3.Context(dm, other=tctx) as dctx, \
                    eagle3.Eagle3Session(tctx, dctx, n_draft_max=8) as session:
                one, five = pass_costs(plain, np.array(PROMPT, np.int32), [1, 5], repeats=5, rounds=3)
                ratio = five / one
                expected = plain.generate(PROMPT, args.n).tokens
                g4 = session.generate(PROMPT, args.n, n_draft_max=4)
                assert np.array_equal(g4.tokens, expected)
                t_plain, t4, t_auto = side_by_side(lambda: plain.generate(PROMPT, args.n),
                                                   lambda: session.generate(PROMPT, args.n, n_draft_max=4),
                                                   lambda: session.generate(PROMPT, args.n, n_draft_max="auto"),
                                                   rounds=3)
                print(f"{n_params(spec_for(size)) / 1e6:>6.0f}M {file_type:>7} {tm.size / 2**20:>6.0f} "
                      f"{ratio:>9.2f}x {args.n / t_plain:>10.1f} {args.n / t4:>8.1f} {args.n / t_auto:>9.1f} "
                      f"{t_plain / t4:>5.2f}x {t_plain / t_auto:>5.2f}x {g4.stats.mean_accepted_length:>7.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
