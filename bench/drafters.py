"""Every drafter on one target, side by side: tokens/s, tau, against plain decoding and
against stock llama.cpp's ``llama-speculative-simple`` running the same drafter.

    python bench/drafters.py --target T.gguf [--draft SMALL.gguf] [--eagle3 HEAD.gguf]
                             [--threads 2] [-n 128] [--rounds 3]

Greedy decoding of three prompts: an input-grounded code edit (the answer repeats a
function from the prompt with one change), a quote (the answer repeats a paragraph) and
free text (nothing to repeat). Each round runs plain decoding, every drafter and the
stock tool in turn, so all see the same machine; figures are medians over the rounds.
Decode speed is tokens after the prompt per second, as llama-speculative-simple reports it.
Stock is built from the same llama.cpp tree with llama.cpp's default options.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
from dataclasses import dataclass, field

import eagle3
from common import build_stock

CODE = '''def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    total = sum(values[:window])
    averages = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        averages.append(total / window)
    return averages
'''
QUOTE = ("The committee met on Tuesday to review the budget for the coming year. After a long discussion, "
         "the members agreed to increase funding for the library, to repair the roof of the community hall, "
         "and to postpone the new parking lot until the spring.")
PROMPTS = {
    "code edit": CODE + "\n# The same function, renamed to rolling_mean and with `window` renamed to `size`:\n"
                        "def rolling_mean(values, size):\n",
    "quote": QUOTE + "\n\nRepeat the paragraph above word for word:\n\n",
    "free text": "The history of the printing press begins",
}


@dataclass
class Drafter:
    name: str
    session: object           # None: plain decoding; a callable: a fresh session for each generation
    stock_args: list[str] | None
    speeds: dict = field(default_factory=dict)    # prompt -> [tokens/s]
    stock: dict = field(default_factory=dict)     # prompt -> [tokens/s]
    tau: dict = field(default_factory=dict)
    draft_ms: dict = field(default_factory=dict)  # prompt -> the drafter's own time per round


def decode_speed(g) -> float:
    st = g.stats
    return st.n_generated / max(st.t_total_s - st.t_prefill_s, 1e-9)


def stock_speed(binary, target, prompt, n, threads, extra) -> float:
    cmd = [str(binary), "-m", str(target), "-p", prompt, "-n", str(n), "-t", str(threads), "--temp", "0",
           "-c", "2048", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    found = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", out.stderr + out.stdout)
    if not found:
        raise RuntimeError(f"llama-speculative-simple failed:\n{out.stderr[-2000:]}")
    return float(found.group(1))


def report(name: str, drafters: list[Drafter]) -> None:
    plain = statistics.median(drafters[0].speeds[name])
    print(f"\n{name}: plain {plain:.1f} tokens/s")
    print(f"  {'drafter':<18} {'tokens/s':>9} {'tau':>6} {'draft ms':>9} {'vs plain':>9} {'stock':>9} {'vs stock':>9}")
    for d in drafters[1:]:
        rate = statistics.median(d.speeds[name])
        row = f"  {d.name:<18} {rate:>9.1f} {d.tau[name]:>6.2f} {d.draft_ms[name]:>9.3f} {rate / plain:>8.2f}x"
        if d.stock.get(name):
            s = statistics.median(d.stock[name])
            row += f" {s:>9.1f} {rate / s:>8.2f}x"
        print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", help="a small draft model of the target's vocabulary")
    parser.add_argument("--eagle3", help="an EAGLE-3 draft for the target")
    parser.add_argument("--threads", type=int, default=eagle3.context.default_threads())
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--n-draft", type=int, default=8, help="draft length of every drafter (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-stock", action="store_true", help="skip llama-speculative-simple")
    args = parser.parse_args()
    k = args.n_draft
    stock = None if args.no_stock else build_stock("llama-speculative-simple") / "llama-speculative-simple"

    tm = eagle3.Model(args.target)
    kw = dict(n_ctx=2048, n_threads=args.threads)
    plain_ctx, tctx = eagle3.Context(tm, **kw), eagle3.Context(tm, **kw)
    ngram = dict(size_n=3, size_m=k)  # the same lookup in both: 3-token keys, drafts of k
    drafters = [
        Drafter("plain", None, None),
        Drafter("ngram-simple", eagle3.NgramSession(tctx, "simple", n_draft_max=k, **ngram),
                ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                 "--spec-ngram-simple-size-m", str(k)]),
        Drafter("ngram-map-k", eagle3.NgramSession(tctx, "map-k", n_draft_max=k, **ngram),
                ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "3", "--spec-ngram-map-k-size-m", str(k)]),
        # ngram-mod keeps its table across generations (llama.cpp shares it between sequences
        # and requests): a fresh session each time, or the rounds would draft their own past output
        Drafter("ngram-mod", lambda: eagle3.NgramSession(tctx, "mod", n_draft_max=k, n_match=8, mod_n_min=1,
                                                         mod_n_max=k),
                ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "8", "--spec-ngram-mod-n-min", "1",
                 "--spec-ngram-mod-n-max", str(k)]),
        Drafter("ngram-cache", eagle3.NgramSession(tctx, "cache", n_draft_max=k), ["--spec-type", "ngram-cache"]),
        Drafter("ngram-simple auto", "auto", None),
    ]
    extra_models = []
    if args.draft:
        dm = eagle3.Model(args.draft)
        extra_models.append(dm)
        dctx = eagle3.Context(dm, **kw)
        drafters.append(Drafter("draft model", eagle3.DraftSession(tctx, dctx, n_draft_max=k),
                                ["-md", args.draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "-td",
                                 str(args.threads)]))
    if args.eagle3:
        em = eagle3.Model(args.eagle3)
        extra_models.append(em)
        ectx = eagle3.Context(em, other=tctx)
        drafters.append(Drafter("eagle3", eagle3.Eagle3Session(tctx, ectx, n_draft_max=k),
                                ["-md", args.eagle3, "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(k)]))

    print(f"{args.target}, {args.threads} threads, {args.n} tokens greedy, drafts of up to {k}; medians of "
          f"{args.rounds} interleaved rounds (tokens/s after the prompt)", flush=True)
    auto_session = drafters[1].session
    for name, prompt in PROMPTS.items():
        tokens = tm.tokenize(prompt)
        reference = plain_ctx.generate(tokens, args.n).tokens
        for round_ in range(args.rounds + 1):  # round 0 warms up and is not counted
            for d in drafters:
                if d.session is None:
                    g = plain_ctx.generate(tokens, args.n)
                elif d.session == "auto":
                    g = auto_session.generate(tokens, args.n, n_draft_max="auto")
                elif callable(d.session):
                    with d.session() as fresh:
                        g = fresh.generate(tokens, args.n)
                else:
                    g = d.session.generate(tokens, args.n)
                assert g.tokens.tolist() == reference.tolist(), f"{d.name}: greedy output differs from plain"
                if round_:
                    d.speeds.setdefault(name, []).append(decode_speed(g))
                    d.tau[name] = g.stats.mean_accepted_length
                    d.draft_ms[name] = 1e3 * g.stats.t_draft_s / max(g.stats.n_draft_calls, 1)
                if round_ and stock is not None and d.stock_args is not None:
                    d.stock.setdefault(name, []).append(
                        stock_speed(stock, args.target, prompt, args.n, args.threads, d.stock_args))
        report(name, drafters)
    tctx.close()
    plain_ctx.close()
    for m in extra_models:
        m.close()
    tm.close()


if __name__ == "__main__":
    main()
