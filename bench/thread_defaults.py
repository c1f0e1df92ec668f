"""Which default thread count serves a user best, on a quiet machine and on a busy one.

    python bench/thread_defaults.py [-n 128] [--rounds 5]

Times plain decoding and EAGLE-3 generation (the bench pair, n_draft_max 4) with
n_threads = 1, the physical cores, all usable CPUs (eagle3's default), and llama.h's
own default (GGML_DEFAULT_N_THREADS, 4), first on a quiet machine, then while
another process keeps one core busy. The counts run in turn, several times; it
prints the median tokens/s of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import eagle3
from common import PROMPT, pair
from eagle3.context import default_threads


def physical_cores() -> int:
    """Distinct (package, core) pairs among the CPUs this process may use."""
    cores = set()
    for cpu in os.sched_getaffinity(0):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            cores.add(("?", str(cpu)))
    return max(1, len(cores))


def rate(tm, dm, threads: int, n: int, speculative: bool) -> float:
    with eagle3.Context(tm, n_ctx=1024, n_threads=threads) as target:
        if not speculative:
            target.generate(PROMPT, 8)
            t0 = time.perf_counter()
            tokens = len(target.generate(PROMPT, n).tokens)
            return tokens / (time.perf_counter() - t0)
        with eagle3.Context(dm, other=target) as draft, eagle3.Eagle3Session(target, draft, n_draft_max=4) as s:
            s.generate(PROMPT, 8)
            t0 = time.perf_counter()
            tokens = len(s.generate(PROMPT, n).tokens)
            return tokens / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    counts = {"one": 1, "physical cores": physical_cores(), "all CPUs (default)": default_threads(),
              "llama.h default": 4}
    target_path, draft_path = pair("bench")
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm:
        for busy in (False, True):
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                print(f"\n{'one core kept busy by another process' if busy else 'quiet machine'}:")
                for speculative in (False, True):
                    results = {name: [] for name in counts}
                    for _ in range(args.rounds):
                        for name, threads in counts.items():
                            results[name].append(rate(tm, dm, threads, args.n, speculative))
                    kind = "EAGLE-3 n_draft_max 4" if speculative else "plain decoding"
                    cells = ", ".join(f"{name} ({counts[name]}): {statistics.median(v):.1f}"
                                      for name, v in results.items())
                    print(f"  {kind:22} tokens/s  {cells}")
            finally:
                if spinner is not None:
                    spinner.kill()


if __name__ == "__main__":
    main()
