"""eagle3's plain decoding and prompt processing vs stock llama.cpp's llama-bench, side by side.

    python bench/plain_vs_stock.py [--model T.gguf] [--runs 5] [--threads N] [--depth 1024 2048]

Builds llama-bench from the same pinned llama.cpp tree with llama.cpp's own
default options (not eagle3's: no batch-invariant kernels, flash attention
"auto"), since that is what a user would otherwise run, into bench/.build.
Then runs, alternately, several times:

* prompt processing: one pass over 512 tokens into an empty cache
  (llama-bench ``-p 512``; eagle3 ``Context.decode``);
* plain decoding: 128 tokens one at a time from an empty cache
  (llama-bench ``-n 128``; eagle3 ``Context.generate``, which also picks
  each token greedily);
* with ``--depth D``: decoding 128 tokens after D cached ones (llama-bench
  ``-n 128 -d D``; eagle3 ``Context.decode`` one token at a time, random tokens
  as llama-bench's are), where attention over the cache weighs more.

and prints each side's median tokens/s and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

import eagle3
from eagle3 import _build_config, shipped
from eagle3.context import default_threads
from common import build_stock

N_PROMPT, N_GEN = 512, 128


def llama_bench(binary: Path, model: Path, threads: int, prompt: int, gen: int, depth: int = 0) -> float:
    """tokens/s of one llama-bench test (one repetition after its own warm-up)."""
    cmd = [str(binary), "-m", str(model), "-p", str(prompt), "-n", str(gen), "-t", str(threads), "-r", "1",
           "-d", str(depth), "-o", "json"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"llama-bench failed:\n{result.stderr[-3000:]}")
    return float(json.loads(result.stdout)[0]["avg_ts"])


def eagle3_prompt(model: eagle3.Model, threads: int, tokens: np.ndarray) -> float:
    with eagle3.Context(model, n_ctx=N_PROMPT + N_GEN, n_batch=N_PROMPT, n_threads=threads) as ctx:
        ctx.decode(eagle3.Batch.from_tokens(tokens[:8]))  # warm-up, as llama-bench's
        ctx.clear()
        t0 = time.perf_counter()
        ctx.decode(eagle3.Batch.from_tokens(tokens))
        return N_PROMPT / (time.perf_counter() - t0)


def eagle3_decode(model: eagle3.Model, threads: int, first: int) -> float:
    with eagle3.Context(model, n_ctx=N_PROMPT + N_GEN, n_threads=threads) as ctx:
        ctx.generate([first], 8)  # warm-up, as llama-bench's
        ctx.clear()
        g = ctx.generate([first], N_GEN + 1)  # the prompt's own pass gives the first token
        if g.stats.n_generated != N_GEN + 1:
            raise SystemExit(f"decoding from token {first} stopped after {g.stats.n_generated} tokens")
        return N_GEN / (g.stats.t_total_s - g.stats.t_prefill_s)


def eagle3_decode_after(model: eagle3.Model, threads: int, depth: int, tokens: np.ndarray) -> float:
    with eagle3.Context(model, n_ctx=depth + N_GEN + 8, n_batch=max(512, depth), n_threads=threads) as ctx:
        ctx.decode(eagle3.Batch.from_tokens(tokens[:depth]))
        ctx.decode(eagle3.Batch.from_tokens(tokens[:1], pos0=depth))  # warm-up, as llama-bench's
        ctx.seq_rm(0, depth)
        t0 = time.perf_counter()
        for i in range(N_GEN):
            ctx.decode(eagle3.Batch.from_tokens(tokens[depth + i:depth + i + 1], pos0=depth + i))
        return N_GEN / (time.perf_counter() - t0)


def runs_to_the_end(model: eagle3.Model, candidates: np.ndarray) -> int:
    """A first token whose greedy continuation meets no end-of-generation token within
    N_GEN tokens: llama-bench decodes N_GEN tokens whatever they are, so eagle3 must too."""
    with eagle3.Context(model, n_ctx=N_GEN + 8, n_threads=1) as ctx:
        for token in candidates[:64]:
            ctx.clear()
            if ctx.generate([int(token)], N_GEN + 1).stats.n_generated == N_GEN + 1:
                return int(token)
    raise SystemExit("every first token tried led to an end-of-generation token early")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a GGUF model (default: the shipped target)")
    parser.add_argument("--runs", type=int, default=5, help="alternating runs of each; medians are compared")
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--depth", type=int, nargs="*", default=[], help="also decode after this many cached tokens")
    args = parser.parse_args()
    model_path = args.model or Path(shipped.toy_pair()[0])
    binary = build_stock("llama-bench") / "llama-bench"
    rng = np.random.default_rng(0)
    with eagle3.Model(model_path) as model:
        tokens = rng.integers(0, model.n_vocab, max([N_PROMPT, *args.depth]) + N_GEN).astype(np.int32)
        first = runs_to_the_end(model, tokens)
        tests = [(f"prompt ({N_PROMPT} tokens)", lambda: llama_bench(binary, model_path, args.threads, N_PROMPT, 0),
                  lambda: eagle3_prompt(model, args.threads, tokens[:N_PROMPT])),
                 (f"decode ({N_GEN} tokens)", lambda: llama_bench(binary, model_path, args.threads, 0, N_GEN),
                  lambda: eagle3_decode(model, args.threads, first))]
        for d in args.depth:
            tests.append((f"decode after {d}", lambda d=d: llama_bench(binary, model_path, args.threads, 0, N_GEN, d),
                          lambda d=d: eagle3_decode_after(model, args.threads, d, tokens)))
        rows = []
        for name, stock, ours in tests:
            theirs, mine = [], []
            for _ in range(args.runs):
                theirs.append(stock())
                mine.append(ours())
            rows.append((name, statistics.median(theirs), statistics.median(mine), theirs, mine))
    print(f"{model_path.name}, {args.threads} threads; eagle3 built with llamafile={_build_config.LLAMAFILE}, "
          f"batch_invariant={_build_config.BATCH_INVARIANT}; stock llama-bench with llama.cpp's defaults")
    print(f"{'':>22} {'stock t/s':>10} {'eagle3 t/s':>11} {'ratio':>7}   runs (stock | eagle3)")
    for name, theirs, mine, all_theirs, all_mine in rows:
        runs = " ".join(f"{x:.0f}" for x in all_theirs) + " | " + " ".join(f"{x:.0f}" for x in all_mine)
        print(f"{name:>22} {theirs:>10.1f} {mine:>11.1f} {mine / theirs:>6.3f}x   {runs}")


if __name__ == "__main__":
    main()
