"""The public-API Python loop of examples/eagle3_loop.py vs the built-in loop, side by side.

    python bench/python_loop_vs_builtin.py [-n 256] [--n-draft 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import eagle3
from common import PROMPT, pair, side_by_side

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from eagle3_loop import speculative_generate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=256, help="tokens to generate")
    parser.add_argument("--n-draft", type=int, default=4)
    args = parser.parse_args()
    for name in ("tiny", "bench"):
        target_path, draft_path = pair(name)
        with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
                eagle3.Context(tm, n_ctx=1024) as target, eagle3.Context(dm, other=target) as draft, \
                eagle3.Eagle3Session(target, draft, n_draft_max=args.n_draft) as session:
            prompt = np.array(PROMPT, dtype=np.int32) % tm.n_vocab

            def python_loop():
                target.clear()
                draft.clear()
                return speculative_generate(session, target, prompt, args.n)

            assert python_loop() == session.generate(prompt, args.n).tokens.tolist()
            t_py, t_c = side_by_side(python_loop, lambda: session.generate(prompt, args.n))
            print(f"{name} pair ({tm.n_params / 1e6:.1f}M parameters): Python loop {args.n / t_py:8.1f} tokens/s | "
                  f"built-in loop {args.n / t_c:8.1f} tokens/s | {t_py / t_c:.2f}x")


if __name__ == "__main__":
    main()
