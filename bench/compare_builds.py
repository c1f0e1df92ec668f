"""This build of eagle3 against another one (an earlier commit, another option), side by side.

    python bench/compare_builds.py --other /path/to/other/venv/bin/python [--rounds 5]

Each workload runs in a fresh interpreter of each build, the two builds in turn
(which goes first alternates), several times, on the same model files; it prints tokens per second of both and
their ratio (this build / the other). The workloads use the public API only,
so any build of eagle3 runs them: speculative generate (n_draft_max 4 and
auto), plain generate, generate_batch of 4, and the step-by-step Python loop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from common import PROMPT, pair

WORKLOAD = r"""
import json, sys, time
import eagle3

target_path, draft_path, name, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
prompt = json.loads(sys.argv[5])
sys.path.insert(0, sys.argv[6])
from eagle3_loop import speculative_generate  # the step-by-step loop, public API only


with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
        eagle3.Context(tm, n_ctx=1024, n_seq_max=4) as target, eagle3.Context(dm, other=target) as draft, \
        eagle3.Eagle3Session(target, draft, n_seq=4, n_draft_max=8) as session:
    def run():
        if name == "plain":
            return len(target.generate(prompt, n).tokens)
        if name == "batch4":
            return sum(len(t) for t in session.generate_batch([prompt] * 4, n).tokens)
        if name == "python-loop":
            target.clear()
            draft.clear()
            return len(speculative_generate(session, target, prompt, n))
        return len(session.generate(prompt, n, n_draft_max="auto" if name == "auto" else int(name[6:])).tokens)

    run()  # warm-up: graphs, caches
    t0 = time.perf_counter()
    tokens = run()
    print(json.dumps(tokens / (time.perf_counter() - t0)))
"""

WORKLOADS = ("spec-n4", "auto", "plain", "batch4", "python-loop")


def tokens_per_s(python: str, target: str, draft: str, name: str, n: int) -> float:
    examples = str(Path(__file__).resolve().parent.parent / "examples")
    out = subprocess.run([python, "-c", WORKLOAD, target, draft, name, str(n), json.dumps(PROMPT), examples],
                         capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", required=True, help="the Python interpreter of the other build")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", type=int, default=192, help="tokens per generation")
    args = parser.parse_args()
    target, draft = (str(p) for p in pair("bench"))
    print(f"{'workload':12} {'this build':>12} {'other':>12} {'ratio':>7}   (tokens/s, median of {args.rounds})")
    for name in WORKLOADS:
        this, other = [], []
        for r in range(args.rounds):
            # in turn, so that both see the same machine; which goes first alternates (the
            # second of two back-to-back runs tends to be faster)
            order = ((this, sys.executable), (other, args.other))
            for results, python in (order if r % 2 == 0 else order[::-1]):
                results.append(tokens_per_s(python, target, draft, name, args.n))
        a, b = statistics.median(this), statistics.median(other)
        print(f"{name:12} {a:12.1f} {b:12.1f} {a / b:7.3f}   (ratios per round: "
              f"{', '.join(f'{x / y:.2f}' for x, y in zip(this, other))})")


if __name__ == "__main__":
    main()
