"""What one target pass costs as the number of tokens in it grows.

    python bench/verify_cost.py                    # the shipped target (q8_0)
    python bench/verify_cost.py --model T.gguf

Speculative decoding trades k single-token passes for one pass over k tokens
(the last accepted token and its drafts). It pays off when that pass costs
little more than a single token, as on a GPU or when a CPU waits on memory.
When the CPU's matrix kernels are compute-bound instead, a pass over k tokens
costs close to k single-token passes and no acceptance rate can win it back.
This prints the ratio for the model and machine at hand.
"""

from __future__ import annotations

import argparse

import eagle3
from common import pass_costs
from eagle3 import shipped

PASSES = 10
CONTEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n" * 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a target GGUF (default: the shipped target)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 5, 9])
    args = parser.parse_args()
    path = args.model or shipped.default_pair()[0]
    with eagle3.Model(path) as model, eagle3.Context(model, n_ctx=1024) as ctx:
        context = model.tokenize(CONTEXT)
        n0 = len(context)
        times = pass_costs(ctx, context, args.sizes, repeats=PASSES, rounds=9)
        threads = ctx.n_threads
    print(f"{path}, {threads} threads, {n0} tokens in the cache")
    print(f"{'tokens in pass':>14} {'ms':>7} {'x one token':>12} {'x per token':>12}")
    for k, t in zip(args.sizes, times):
        print(f"{k:>14} {t * 1e3:>7.2f} {t / times[0]:>11.2f}x {t / times[0] / k:>11.2f}x")


if __name__ == "__main__":
    main()
