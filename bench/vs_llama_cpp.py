"""eagle3's built-in loop vs llama.cpp's own llama-speculative-simple, side by side.

    python bench/vs_llama_cpp.py [-n 256] [--runs 3]

Builds llama-speculative-simple (--spec-type draft-eagle3) from the same
pinned llama.cpp tree and options eagle3 was built with (into bench/.build),
then runs both on the same GGUF pair, prompt, greedy settings and threads,
for n_draft_max 3 and 8. Both speeds count the decode phase only (after the
prompt), as llama-speculative-simple reports it.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import eagle3
from eagle3 import _build_config
from eagle3.context import default_threads
from common import BUILD, pair

REPO = Path(__file__).resolve().parent.parent
PROMPT_TEXT = "The EAGLE-3 draft model reads the target's hidden states and proposes the next tokens. " * 2


def build_example() -> Path:
    build_dir = BUILD / "llama.cpp"
    binary = build_dir / "bin" / "llama-speculative-simple"
    # always through the build script: it rebuilds only what changed, and
    # reconfigures when eagle3's own llama.cpp options did
    subprocess.run([sys.executable, str(REPO / "build_support" / "llama_cpp.py"), "build",
                    "--source", _build_config.LLAMA_CPP_SOURCE, "--build-dir", str(build_dir),
                    "--out-dir", str(build_dir / "lib"), "--examples",
                    "--native", str(_build_config.NATIVE).lower(), "--amx", str(_build_config.AMX).lower(),
                    "--llamafile", str(_build_config.LLAMAFILE).lower(),
                    "--target", "llama-common", "--target", "llama-speculative-simple"], check=True)
    return binary


def run_llama_cpp(binary: Path, target: Path, draft: Path, n: int, n_draft: int,
                  threads: int) -> tuple[float, str, float]:
    """(decode tokens/s, stdout, acceptance) of one llama-speculative-simple run."""
    cmd = [str(binary), "-m", str(target), "-md", str(draft), "--spec-type", "draft-eagle3",
           "--spec-draft-n-max", str(n_draft), "-p", PROMPT_TEXT, "-n", str(n), "--temp", "0", "-c", "1024",
           "-t", str(threads), "-tb", str(threads), "-ngl", "0", "--seed", "1",
           "-fa", "off"]  # as eagle3's contexts default to
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
    binary = build_example()
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
