"""eagle3's built-in loop vs llama.cpp's own llama-speculative-simple, side by side.

    python bench/vs_llama_cpp.py [-n 256] [--runs 3]

Builds llama-speculative-simple (--spec-type draft-eagle3) from the same
pinned llama.cpp tree with llama.cpp's own default options (into bench/.build;
not eagle3's options: this is what a user would otherwise run), then runs
both on the same GGUF pair, prompt, greedy settings and threads, each with its
defaults otherwise, for n_draft_max 3 and 8. Both speeds count the decode
phase only (after the prompt), as llama-speculative-simple reports it.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
from pathlib import Path

import eagle3
from eagle3.context import default_threads
from common import build_stock, pair

PROMPT_TEXT = "The EAGLE-3 draft model reads the target's hidden states and proposes the next tokens. " * 2


def run_llama_cpp(binary: Path, target: Path, draft: Path, n: int, n_draft: int,
                  threads: int) -> tuple[float, str, float]:
    """(decode tokens/s, stdout, acceptance) of one llama-speculative-simple run."""
    cmd = [str(binary), "-m", str(target), "-md", str(draft), "--spec-type", "draft-eagle3",
           "--spec-draft-n-max", str(n_draft), "-p", PROMPT_TEXT, "-n", str(n), "--temp", "0", "-c", "1024",
           "-t", str(threads), "-tb", str(threads), "-ngl", "0", "--seed", "1"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", result.stderr)
    accept = re.search(r"accept\s+=\s+([\d.]+)%", result.stderr)
    if result.returncode != 0 or not found or not accept:
        raise SystemExit(f"llama-speculative-simple failed:\n{result.stderr[-3000:]}")
    return float(found.group(3)), result.stdout, float(accept.group(1)) / 100


def run_eagle3(session: eagle3.Eagle3Session, prompt, n: int) -> tuple[float, str, float]:
    """(decode tokens/s, text, acceptance) of one generate call."""
    g = session.generate(prompt, n)
    decode_s = g.stats.t_total_s - g.stats.t_prefill_s
    return (g.stats.n_generated - 1) / decode_s, g.text, g.stats.acceptance_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=256, help="tokens to generate")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each; medians are compared")
    args = parser.parse_args()
    binary = build_stock("llama-speculative-simple") / "llama-speculative-simple"
    target_path, draft_path = pair()
    threads = default_threads()
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
            eagle3.Context(tm, n_ctx=1024, n_threads=threads) as target, \
            eagle3.Context(dm, other=target) as draft:
        prompt = tm.tokenize(PROMPT_TEXT)
        print(f"pair: {target_path.name} + {draft_path.name}; prompt {len(prompt)} tokens; {args.n} new tokens; "
              f"greedy; {threads} threads")
        for n_draft in (3, 8):
            with eagle3.Eagle3Session(target, draft, n_draft_max=n_draft) as session:
                ours, theirs = [], []
                run_eagle3(session, prompt, args.n)  # warm-up
                for _ in range(args.runs):
                    speed, stdout, accept_theirs = run_llama_cpp(binary, target_path, draft_path, args.n, n_draft,
                                                                 threads)
                    theirs.append(speed)
                    speed, text, accept_ours = run_eagle3(session, prompt, args.n)
                    ours.append(speed)
                same = text[:200] in stdout  # llama-speculative-simple prints the prompt, then the output
                a, b = statistics.median(ours), statistics.median(theirs)
                print(f"n_draft_max={n_draft}: llama-speculative-simple {b:8.1f} t/s (acceptance {accept_theirs:.1%}) "
                      f"| eagle3 generate {a:8.1f} t/s (acceptance {accept_ours:.1%}) | ratio {a / b:.3f}x "
                      f"| same output: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
