"""What one target pass costs as the number of tokens in it grows, against the
roofline stock llama.cpp's own kernels define.

    python bench/verify_cost.py                          # the shipped target (q8_0)
    python bench/verify_cost.py --model A.gguf B.gguf    # any GGUF models
    python bench/verify_cost.py --no-stock               # eagle3 alone

Speculative decoding trades k one-token passes for one pass over k tokens (the
last accepted token and its drafts). It pays when that pass costs little more
than one token, as when a CPU waits on memory. For each model this prints, side
by side in one run (rounds interleaved, medians):

* R(k): eagle3's pass of k tokens after a cached context, in one-token passes;
* stock R(k): the same for llama-bench (``-p k -d N``; ``-n`` for one token),
  built from the same tree with llama.cpp's default options;
* the roofline max(1, k * t_pp / t_1), where t_1 is stock's one-token time and
  t_pp its time per token in a 512-token prompt: what stock's own kernels say
  k tokens can cost; R/roofline is eagle3's pass against it in eagle3's own
  one-token passes, and "vs stock t_1" against it in stock's (the pass over
  roofline * t_1): where eagle3's one-token pass is the faster, the first
  counts that speed against the pass, the second does not;
* one-token decoding against stock, and the memory bandwidth the one-token
  pass reaches against what this machine streams (numpy, all threads);
* for every pass, how near it comes to each of the machine's two limits: the
  time its weights take to stream, and the time its multiply-adds take at
  this CPU's measured peak (bench/peak.c: 8-bit integer dot products for
  quantized weights, f32 fused multiply-adds for f32/f16/bf16 ones), each as a
  share of the pass's time. A pass near neither limit has room to go faster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

import eagle3
from eagle3 import shipped
from eagle3.context import default_threads
from common import build_stock, machine_peaks, multiply_adds_per_token, pass_costs

CONTEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n" * 3


def stream_bandwidth(threads: int, size: int = 1 << 30) -> float:
    """Bytes/s this machine reads from memory: the best of a few sums of a 1 GiB
    array, split across ``threads`` threads (numpy releases the GIL)."""
    data = np.ones(size // 8, dtype=np.int64)
    parts = np.array_split(data, threads)
    best = float("inf")
    for _ in range(5):
        workers = [threading.Thread(target=np.add.reduce, args=(part,)) for part in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return size / best


def llama_bench(binary: Path, model: Path, threads: int, args: list[str]) -> float:
    """Seconds per token of one llama-bench test (one repetition after its own warm-up)."""
    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-r", "1", "-o", "json", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"llama-bench failed:\n{result.stderr[-3000:]}")
    return 1.0 / float(json.loads(result.stdout)[0]["avg_ts"])


def stock_costs(binary: Path, model: Path, threads: int, sizes: list[int], depth: int) -> tuple[list[float], float]:
    """Stock's seconds for a pass of each k tokens after ``depth`` cached ones, and per token of a 512-token prompt."""
    costs = []
    for k in sizes:
        if k == 1:
            costs.append(llama_bench(binary, model, threads, ["-p", "0", "-n", "32", "-d", str(depth)]))
        else:
            costs.append(k * llama_bench(binary, model, threads, ["-p", str(k), "-n", "0", "-d", str(depth)]))
    t_pp = llama_bench(binary, model, threads, ["-p", "512", "-n", "0"])
    return costs, t_pp


def best_peaks(a: dict | None, b: dict | None) -> dict | None:
    """the higher of two peak measurements, operation by operation"""
    if a is None or b is None:
        return a or b
    return {kind: max(a[kind], b[kind], key=lambda p: p["per_s"]) for kind in ("int8", "f32")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", nargs="+", type=Path, help="GGUF models (default: the shipped target)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 5, 9, 16])
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each side; medians are printed")
    parser.add_argument("--no-stock", action="store_true", help="skip llama-bench")
    args = parser.parse_args()
    sizes = sorted(set([1, *args.sizes]))
    binary = None if args.no_stock else build_stock("llama-bench") / "llama-bench"
    bandwidth = stream_bandwidth(args.threads)
    peaks = machine_peaks(args.threads)
    print(f"{args.threads} threads; this machine streams {bandwidth / 1e9:.1f} GB/s (numpy, {args.threads} threads)")
    if peaks is not None:
        print(f"peaks: {peaks['int8']['per_s'] / 1e9:.0f} G int8 multiply-adds/s ({peaks['int8']['op']}), "
              f"{peaks['f32']['per_s'] / 1e9:.0f} G f32 multiply-adds/s ({peaks['f32']['op']})")
    for path in args.model or [Path(shipped.toy_pair()[0])]:
        ours: list[list[float]] = []
        theirs: list[list[float]] = []
        pp: list[float] = []
        with eagle3.Model(path) as model, eagle3.Context(model, n_ctx=1024, n_threads=args.threads) as ctx:
            context = model.tokenize(CONTEXT)
            weight_bytes = model.size
            multiply_adds = multiply_adds_per_token(model)
            for _ in range(args.rounds):
                ours.append(pass_costs(ctx, context, sizes, repeats=5, rounds=3))
                if binary is not None:
                    costs, t_pp = stock_costs(binary, path, args.threads, sizes, len(context))
                    theirs.append(costs)
                    pp.append(t_pp)
        mine = [statistics.median(r[i] for r in ours) for i in range(len(sizes))]
        peaks = best_peaks(peaks, machine_peaks(args.threads))  # this machine's speed drifts: the best seen

        def limits(k: int, t: float) -> str:
            """the weights' streaming time and the multiply-adds' time at peak, as shares of t"""
            memory = f"{weight_bytes / bandwidth / t:>7.0%}"
            if peaks is None:
                return memory
            compute = k * sum(n / peaks[kind]["per_s"] for kind, n in multiply_adds.items())
            return f"{memory} {compute / t:>8.0%}"
        columns = f"{'memory':>7} {'compute':>8}" if peaks is not None else f"{'memory':>7}"
        print(f"\n{path.name}: {weight_bytes / 2**20:.0f} MiB, {len(context)} tokens in the cache; "
              f"one token in {mine[0] * 1e3:.1f} ms reads {weight_bytes / mine[0] / 1e9:.1f} GB/s "
              f"({weight_bytes / mine[0] / bandwidth:.0%} of the stream figure)")
        if theirs:
            stock = [statistics.median(r[i] for r in theirs) for i in range(len(sizes))]
            t_pp = statistics.median(pp)
            print(f"stock: one token {stock[0] * 1e3:.1f} ms, 512-token prompt {t_pp * 1e3:.2f} ms/token; "
                  f"eagle3 one-token decoding {stock[0] / mine[0]:.2f}x stock")
            print(f"{'k':>4} {'eagle3 ms':>10} {'R(k)':>7} {'stock R(k)':>11} {'roofline':>9} {'R/roofline':>11} "
                  f"{'vs stock t_1':>13} {columns}")
            for k, t, s in zip(sizes, mine, stock):
                roof = max(1.0, k * t_pp / stock[0])
                print(f"{k:>4} {t * 1e3:>10.2f} {t / mine[0]:>6.2f}x {s / stock[0]:>10.2f}x {roof:>8.2f}x "
                      f"{t / mine[0] / roof:>10.2f} {t / stock[0] / roof:>13.2f} {limits(k, t)}")
        else:
            print(f"{'k':>4} {'eagle3 ms':>10} {'R(k)':>7} {columns}")
            for k, t in zip(sizes, mine):
                print(f"{k:>4} {t * 1e3:>10.2f} {t / mine[0]:>6.2f}x {limits(k, t)}")


if __name__ == "__main__":
    main()
