"""The ``eagle3`` command line (also ``python -m eagle3``).

    eagle3 generate "def fibonacci(n):"          # the shipped pair, EAGLE-3
    eagle3 generate "def f(x):" --compare         # plus plain decoding and the speedup
    eagle3 generate "..." --target T.gguf --drafter ngram   # n-gram drafts from the text itself
    eagle3 generate "..." --target T.gguf --drafter draft --draft SMALL.gguf  # a small draft model
    eagle3 bench                                  # speculative vs plain, several draft lengths
    eagle3 check TARGET.gguf DRAFT.gguf           # does the draft fit the target?
    eagle3 convert HF_TARGET HF_DRAFT -o OUT      # Hugging Face checkpoints to GGUF
    eagle3 info MODEL.gguf                        # a model's metadata
    eagle3 rpc-server --port 50052                # serve this CPU to other machines' models
    eagle3 generate "..." --rpc HOST:50052        # the target's layers on that server
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from eagle3 import _build_config, _core, remote, sampling, shipped
from eagle3.compat import check_pair
from eagle3.errors import Eagle3Error, InvalidArgumentError, ModelLoadError
from eagle3.sampling import SamplingParams


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    return value


def _summary(value: Any, limit: int = 16) -> Any:
    """Short rendering of long arrays (a vocabulary has thousands of entries)."""
    if isinstance(value, (tuple, np.ndarray)) and len(value) > limit:
        head = [_jsonable(v) for v in value[:4]]
        return f"[{', '.join(map(repr, head))}, ... {len(value)} items]"
    return _jsonable(value)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


COMPARE_RUNS = 3  # generate --compare: timed runs of each, alternated

# --drafter: what drafts, and whether it takes a --draft model
DRAFTERS = {"eagle3": True, "mtp": False, "draft": True,
            **{f"ngram-{m}": False for m in ("simple", "map-k", "map-k4v", "mod", "cache")}, "ngram": False}


def _pair(args: argparse.Namespace) -> tuple[str, str | None]:
    """The target and draft files: a shipped pair (--pair) for EAGLE-3 without --target."""
    needs_draft = DRAFTERS[args.drafter]
    if args.ngram and not args.drafter.startswith("ngram"):
        raise Eagle3Error("--ngram sets the parameters of an n-gram drafter (--drafter ngram...)")
    if not args.target:
        if args.draft or args.drafter != "eagle3":
            raise Eagle3Error(f"--drafter {args.drafter} needs --target (only EAGLE-3 has a shipped pair)")
        target, draft = shipped.toy_pair() if args.pair == "toy" else shipped.default_pair()
        return str(target), str(draft)
    if args.pair:
        raise Eagle3Error("--pair names a shipped pair: give it or --target, not both")
    if needs_draft and not args.draft:
        raise Eagle3Error(f"--drafter {args.drafter} needs --draft (its draft model)")
    if args.draft and not needs_draft:
        raise Eagle3Error(f"--drafter {args.drafter} takes no --draft")
    return args.target, args.draft


def _ngram_param(value: str) -> tuple[str, str | int]:
    """``NAME=VALUE``: an n-gram drafter's parameter (integers, or a cache file's path)."""
    name, sep, text = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {value!r}")
    if name.startswith("lookup_cache"):
        return name, text
    try:
        return name, int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} takes an integer, got {text!r}") from None


def _n_draft(value: str) -> int | str:
    """A draft length option: a positive integer or ``auto`` (argparse's type: a usage error otherwise)."""
    if value == "auto":
        return value
    return _positive(value)


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return number


def _prompt(value: str) -> str:
    """``-`` reads the prompt from standard input."""
    return sys.stdin.read() if value == "-" else value


class _Loaded:
    """Models, contexts and a session for the commands that generate."""

    def __init__(self, args: argparse.Namespace, n_draft_max: int):
        import eagle3

        target_path, draft_path = _pair(args)
        drafter = "ngram-simple" if args.drafter == "ngram" else args.drafter
        _progress(f"loading {target_path}" + (f" and {draft_path}" if draft_path else "") + f" ({drafter})")
        # --rpc splits the target; the draft, small and run once per drafted
        # token, stays here (a round trip per token would cost more than it saves)
        self.target_model = eagle3.Model(target_path, args.n_gpu_layers, rpc_servers=args.rpc,
                                         load_mtp=drafter == "mtp")
        self.draft_model = eagle3.Model(draft_path) if draft_path else None
        self.target = eagle3.Context(self.target_model, n_ctx=args.n_ctx, n_threads=args.threads)
        if drafter == "eagle3":
            self.draft = eagle3.Context(self.draft_model, other=self.target)
            self.session = eagle3.Eagle3Session(self.target, self.draft, n_draft_max=n_draft_max)
        elif drafter == "mtp":
            self.draft = eagle3.Context(self.target_model, ctx_type="mtp", n_ctx=args.n_ctx, n_threads=args.threads)
            self.session = eagle3.MtpSession(self.target, self.draft, n_draft_max=n_draft_max)
        elif drafter == "draft":
            self.draft = eagle3.Context(self.draft_model, n_ctx=args.n_ctx, n_threads=args.threads)
            self.session = eagle3.DraftSession(self.target, self.draft, n_draft_max=n_draft_max)
        else:
            self.session = eagle3.NgramSession(self.target, drafter.removeprefix("ngram-"), n_draft_max=n_draft_max,
                                               **dict(args.ngram))
        self.label = f"{self.session._label} ({drafter})" if drafter.startswith("ngram-") else self.session._label
        # plain decoding gets a context of its own: the session's target may also
        # extract hidden states for the draft, which plain decoding need not pay for
        self.plain = eagle3.Context(self.target_model, n_ctx=args.n_ctx, n_threads=args.threads)

    def close(self) -> None:
        self.target_model.close()
        if self.draft_model is not None:
            self.draft_model.close()


def _sampling(args: argparse.Namespace) -> SamplingParams:
    """The SamplingParams the options built by _add_sampling_args ask for."""
    values = {name: getattr(args, name) for name in sampling.FIELDS}
    values["logit_bias"] = values["logit_bias"] or ()
    schema = None
    try:
        if args.grammar:
            values["grammar"] = Path(args.grammar).read_text(encoding="utf-8")
        if args.json_schema:
            text = args.json_schema
            if not text.lstrip().startswith("{"):
                text = Path(text).read_text(encoding="utf-8")
            schema = json.loads(text)
    except OSError as e:
        raise Eagle3Error(f"cannot read {e.filename}: {e.strerror}") from None
    except ValueError as e:
        raise Eagle3Error(f"--json-schema is not JSON: {e}") from None
    return sampling.sampling_params(SamplingParams(**values), schema)


def _logit_bias_option(text: str) -> tuple[int, float]:
    token, sep, bias = text.partition("=")
    try:
        if sep:
            return int(token), float(bias)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected TOKEN=BIAS (e.g. 42=-inf), got {text!r}")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    """One option per SamplingParams field, from its default and help."""
    for field in dataclasses.fields(SamplingParams):
        flag, help = "--" + field.name.replace("_", "-"), field.metadata["help"]
        if field.name == "grammar":
            p.add_argument(flag, metavar="FILE", help=help + ", read from FILE")
        elif field.name == "logit_bias":
            p.add_argument(flag, metavar="TOKEN=BIAS", action="append", type=_logit_bias_option,
                           help=help + "; repeat it for several tokens")
        elif field.name == "verify":
            p.add_argument(flag, choices=sampling.VERIFICATIONS, default=field.default, help=help)
        elif field.name == "seed":
            p.add_argument(flag, type=int, default=None, help=help)
        else:
            p.add_argument(flag, type=type(field.default), default=field.default, help=help)
    p.add_argument("--json-schema", metavar="SCHEMA", help="constrain the output to this JSON schema (a file, or "
                                                            "the JSON itself)")


def cmd_generate(args: argparse.Namespace) -> int:
    n_draft = args.n_draft_max
    args.prompt = _prompt(args.prompt)
    loaded = _Loaded(args, 8 if n_draft == "auto" else n_draft)
    try:
        params = _sampling(args)
        prompt: Any = args.prompt
        if _chat(args):  # the prompt is the user's turn of a chat, through the model's template
            messages = [{"role": "user", "content": args.prompt}]
            args.prompt = loaded.target_model.apply_chat_template(messages)
            prompt = loaded.target_model.chat_tokens(messages)
        if args.json:
            g = loaded.session.generate(prompt, args.n_predict, n_draft_max=n_draft, sampling=params)
        else:  # the text as it is produced, after the prompt it continues
            print(args.prompt, end="", flush=True)
            stream = loaded.session.stream(prompt, args.n_predict, text=True, n_draft_max=n_draft, sampling=params)
            for piece in stream:
                print(piece, end="", flush=True)
            print()
            g = stream.generation
        st = g.stats
        result: dict[str, Any] = {"prompt": args.prompt, "text": g.text, "tokens": g.tokens.tolist(),
                                  "finish_reason": g.finish_reason, "n_draft_max": n_draft, "stats": st.as_dict()}
        if args.compare:
            loaded.plain.generate(prompt, 8, params)  # warm the plain path too
            plain_s, spec_s = [], []
            # alternately, so that the machine's drift falls on both; each decodes the whole
            # prompt (reuse=False), as a fresh question would
            for _ in range(COMPARE_RUNS):
                t0 = time.perf_counter()
                plain = loaded.plain.generate(prompt, args.n_predict, params, reuse=False)
                plain_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                timed = loaded.session.generate(prompt, args.n_predict, n_draft_max=n_draft, sampling=params,
                                                reuse=False)
                spec_s.append(time.perf_counter() - t0)
            plain_median, spec_median = statistics.median(plain_s), statistics.median(spec_s)
            result["plain"] = {"tokens_per_s": plain.stats.n_generated / plain_median, "seconds": plain_median,
                               "identical": plain.tokens.tolist() == timed.tokens.tolist()}
            result["speculative_seconds"] = spec_median
            result["speedup"] = plain_median / spec_median
        if args.json:
            print(json.dumps(_jsonable(result), default=_jsonable, indent=2))
            return 0
        print(f"\n--- {st.n_generated} tokens in {st.t_total_s:.2f} s ({st.tokens_per_s:.1f} tokens/s), {loaded.label} "
              f"n_draft_max={n_draft}: acceptance {st.acceptance_rate:.1%}, tau {st.mean_accepted_length:.2f} "
              f"tokens per target pass ({g.finish_reason})", file=sys.stderr)
        if st.n_plain_rounds:
            print(f"--- n_draft_max=auto decoded {st.n_plain_rounds} of {st.n_seq_rounds} rounds plainly: "
                  f"{st.n_accepted} of the {st.n_drafted} tokens it drafted first were accepted, "
                  f"too few for drafting to pay", file=sys.stderr)
        if args.compare:
            plain = result["plain"]
            print(f"--- plain decoding: {plain['tokens_per_s']:.1f} tokens/s; speedup {result['speedup']:.2f}x "
                  f"(medians of {COMPARE_RUNS} runs each, alternated); identical output: "
                  f"{'yes' if plain['identical'] else 'no (sampling)'}", file=sys.stderr)
        return 0
    finally:
        loaded.close()


def _chat(args: argparse.Namespace) -> bool:
    """Whether prompts are chat messages: --chat, or by default with the default (chat model) pair."""
    return args.chat if args.chat is not None else not args.target and args.pair != "toy"


def cmd_bench(args: argparse.Namespace) -> int:
    chat = _chat(args)
    if args.prompt:
        prompts = [args.prompt]
    elif chat:
        prompts = shipped.held_out_chat_prompts()[:args.prompts]
    else:
        prompts = shipped.toy_prompts()[:args.prompts]
    drafts = args.n_draft
    n_session = max([n for n in drafts if n != "auto"], default=8)
    loaded = _Loaded(args, n_session)
    try:
        if chat:
            prompts = [loaded.target_model.chat_tokens([{"role": "user", "content": p}]) for p in prompts]
        plain_s, plain_tokens = 0.0, 0
        spec_s = {n: 0.0 for n in drafts}
        stats = {}
        # plain and each draft length in turn, on the same machine state; every timed call
        # decodes its whole prompt (reuse=False), so none gains from what an earlier one left
        for i, prompt in enumerate(prompts):
            loaded.plain.generate(prompt, 4)
            t0 = time.perf_counter()
            plain_tokens += loaded.plain.generate(prompt, args.n_predict, reuse=False).stats.n_generated
            plain_s += time.perf_counter() - t0
            for n_draft in drafts:
                t0 = time.perf_counter()
                g = loaded.session.generate(prompt, args.n_predict, n_draft_max=n_draft, reuse=False)
                spec_s[n_draft] += time.perf_counter() - t0
                stats[n_draft] = g.stats if n_draft not in stats else stats[n_draft] + g.stats
            _progress(f"\r[{'#' * (30 * (i + 1) // len(prompts)):<30}] {i + 1}/{len(prompts)} prompts")
        plain_rate = plain_tokens / plain_s
        rows = []
        for n_draft in drafts:
            st = stats[n_draft]
            rate = st.n_generated / spec_s[n_draft]
            rows.append({"n_draft_max": n_draft, "tokens_per_s": rate, "plain_tokens_per_s": plain_rate,
                         "speedup": rate / plain_rate, "tau": st.mean_accepted_length,
                         "acceptance": st.acceptance_rate,
                         "acceptance_per_position":
                             st.acceptance_per_position[:n_session if n_draft == "auto" else n_draft].tolist(),
                         "plain_rounds": st.n_plain_rounds / max(st.n_rounds, 1),
                         "draft_lengths": st.draft_lengths.tolist()})
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print(f"{len(prompts)} prompts, {args.n_predict} tokens each, greedy; plain decoding {plain_rate:.1f} "
                  f"tokens/s")
            print(f"{'n_draft_max':>11} {'tokens/s':>9} {'speedup':>8} {'tau':>6} {'acceptance':>11} "
                  f"{'plain rounds':>13}")
            for r in rows:
                print(f"{r['n_draft_max']:>11} {r['tokens_per_s']:>9.1f} {r['speedup']:>7.2f}x {r['tau']:>6.2f} "
                      f"{r['acceptance']:>10.1%} {r['plain_rounds']:>12.0%}")
        if args.plot:
            _plot(rows, args.plot)
        return 0
    finally:
        loaded.close()


def _plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _progress("matplotlib is not installed: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        rates = r["acceptance_per_position"]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"n_draft_max={r['n_draft_max']}")
    ax.set_xlabel("draft position")
    ax.set_ylabel("share of drafts reaching it that were accepted there")
    ax.set_ylim(0, 1)
    ax.set_title("acceptance per draft position")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _progress(f"plot written to {path}")


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0: compatible; 1: not; 2: a file that cannot be read (as usage errors)."""
    try:
        report = check_pair(args.target, args.draft)
    except ModelLoadError as e:
        print(f"eagle3 check: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"target": report.target, "draft": report.draft, "compatible": report.ok,
                          "facts": {k: _jsonable(v) for k, v in report.facts.items()},
                          "problems": [{"code": p.code, "message": p.message} for p in report.problems]},
                         indent=2))
    else:
        print(report)
    return 0 if report.ok else 1


def _layer_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three layer numbers like 2,16,29, got {text!r}") from None
    if len(ids) != 3 or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected three layer numbers >= 0, got {text!r}")
    return ids


def cmd_convert(args: argparse.Namespace) -> int:
    from eagle3.convert import convert

    target, draft, report = convert(args.target, args.draft, args.out, outtype=args.outtype, name=args.name,
                                    target_layers=args.target_layers)
    print(f"target: {target}")
    if draft is not None:
        print(f"draft:  {draft}")
        print(report)
        return 0 if report.ok else 1
    return 0


def _prompt_file(path: str) -> list:
    """Prompts from a file: a JSON list of strings (or of token-id lists), or one prompt per line."""
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".json"):
        prompts = json.loads(text)
        if not isinstance(prompts, list) or not prompts:
            raise InvalidArgumentError(f"{path}: expected a JSON list of prompts")
        return [p if isinstance(p, str) else np.asarray(p, dtype=np.int32) for p in prompts]
    return [line for line in text.splitlines() if line.strip()]


def cmd_train_head(args: argparse.Namespace) -> int:
    from eagle3.train import train_head

    prompts = _prompt_file(args.prompts) if args.prompts else None
    report = train_head(args.target, args.out, prompts, self_prompts=args.self_prompts, tokens=args.tokens,
                        max_new_tokens=args.max_new_tokens, temperature=args.temperature, epochs=args.epochs,
                        draft_vocab_size=args.draft_vocab, layers=args.target_layers, seed=args.seed,
                        work_dir=args.work_dir, threads=args.threads, device=args.device, teacher=args.teacher,
                        n_seq=args.n_seq, held_out=args.held_out, ttt_steps=args.ttt_steps,
                        batch_tokens=args.batch_tokens, lr=args.lr, outtype=args.outtype)
    print(f"head: {report.head} ({report.answer_tokens} answer tokens from {report.train_examples} prompts, "
          f"{report.steps} steps; held-out tau {report.held_out_tau:.2f} at n_draft_max 4)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    metadata, types, tensors = _core.read_gguf(args.model)
    if args.json:
        print(json.dumps({"path": args.model, "metadata": {k: _jsonable(v) for k, v in metadata.items()},
                          "types": types,
                          "tensors": {n: {"shape": list(t.shape), "type": t.type} for n, t in tensors.items()}},
                         indent=2))
        return 0
    arch = metadata.get("general.architecture", "?")
    n_params = sum(int(np.prod(t.shape)) for t in tensors.values())
    print(f"{args.model}: architecture {arch}, {len(tensors)} tensors, {n_params:,} parameters")
    for key in sorted(metadata):
        print(f"  {key} ({types[key]}) = {_summary(metadata[key])}")
    if args.tensors:
        for name, t in tensors.items():
            print(f"  tensor {name}: {t.type} {list(t.shape)}")
    return 0


def _rpc_servers(value: str) -> tuple[str, ...]:
    try:
        return remote.endpoints([v.strip() for v in value.split(",") if v.strip()])
    except Eagle3Error as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="target model GGUF (default: the shipped pair)")
    p.add_argument("--pair", choices=["default", "toy"], default=None,
                   help="without --target: SmolLM2-135M-Instruct (fetched on first use) and its EAGLE-3 head "
                        "(default), or the toy code model (no download)")
    p.add_argument("--drafter", choices=list(DRAFTERS), default="eagle3",
                   help="what drafts: an EAGLE-3 draft (default), the target's MTP heads, a small draft model, or "
                        "n-grams of the text so far (ngram: ngram-simple)")
    p.add_argument("--draft", help="the draft GGUF: an EAGLE-3 draft (--drafter eagle3) or a small model of the "
                                   "target's vocabulary (--drafter draft)")
    p.add_argument("--ngram", type=_ngram_param, action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter of the n-gram drafter, as llama.cpp names it (size_n=3, size_m=16, min_hits, "
                        "n_match, mod_n_min, mod_n_max, lookup_cache_static=FILE, ...); repeatable")
    p.add_argument("--n-ctx", type=_positive, default=2048, help="context size (default 2048)")
    p.add_argument("--threads", type=_positive, default=None,
                   help="CPU threads of every context (default: all usable)")
    p.add_argument("--rpc", type=_rpc_servers, default=(), metavar="HOST:PORT,...",
                   help="split the target's layers across these RPC servers (eagle3 rpc-server); the draft stays "
                        "here")
    p.add_argument("--n-gpu-layers", type=int, default=None, metavar="N",
                   help="with --rpc: how many of the target's last layers go to the servers (default: all)")


def cmd_rpc_server(args: argparse.Namespace) -> int:
    # what llama.cpp's server reports (a client refused, a connection lost) is for the operator
    report = logging.StreamHandler(sys.stderr)
    report.setFormatter(logging.Formatter("eagle3 rpc-server: %(message)s"))
    logging.getLogger("eagle3").addHandler(report)
    remote.serve(args.host, args.port, threads=args.threads, cache_dir=args.cache, allow_remote=args.allow_remote)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"eagle3 {_build_config.VERSION} "
                        f"(llama.cpp {_build_config.LLAMA_CPP_COMMIT})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("generate", help="generate text with speculative decoding (EAGLE-3 by default)",
                       description="Generate a continuation of PROMPT with speculative decoding and "
                                   "print it with its statistics (acceptance, tau, tokens/s).")
    p.add_argument("prompt", help="the text to continue ('-': read it from standard input)")
    p.add_argument("-n", "--n-predict", type=_positive, default=128, help="tokens to generate (default 128)")
    p.add_argument("--n-draft-max", type=_n_draft, default="auto",
                   help="longest draft, or 'auto': the length that pays best, measured as it runs, down to plain "
                        "decoding (default auto)")
    _add_sampling_args(p)
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="the prompt is a user message: wrap it in the model's chat template (default: on for "
                        "the default pair, off otherwise)")
    p.add_argument("--compare", action="store_true", help="also decode without speculation and print the speedup")
    p.add_argument("--json", action="store_true", help="print the result and statistics as one JSON object")
    _add_model_args(p)
    p.set_defaults(run=cmd_generate)

    p = sub.add_parser("bench", help="speculative vs plain decoding over several draft lengths",
                       description="Time greedy speculative decoding against plain decoding of the same target, "
                                   "on held-out prompts (or PROMPT), for each draft length.")
    p.add_argument("--prompt", help="one prompt instead of the shipped held-out prompts (chat messages with "
                                    "--chat, code snippets without)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="prompts are user messages, through the model's chat template (default: on for the "
                        "default pair)")
    p.add_argument("--prompts", type=_positive, default=8, help="how many held-out prompts (default 8)")
    p.add_argument("-n", "--n-predict", type=_positive, default=128)
    p.add_argument("--n-draft", nargs="+", type=_n_draft, default=[2, 4, 8, "auto"],
                   help="draft lengths, 'auto' among them (default 2 4 8 auto)")
    p.add_argument("--plot", help="write a PNG of acceptance per draft position here (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    _add_model_args(p)
    p.set_defaults(run=cmd_bench)

    p = sub.add_parser("check", help="check that an EAGLE-3 draft fits its target (exit 0 if so, 1 if not, "
                                     "2 if a file cannot be read)",
                       description="Read both GGUF headers (no weights) and list every incompatibility.")
    p.add_argument("target", help="target model GGUF")
    p.add_argument("draft", help="EAGLE-3 draft GGUF")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=cmd_check)

    p = sub.add_parser("convert", help="convert Hugging Face checkpoints (target, EAGLE-3 draft) to GGUF",
                       description="Convert a Hugging Face target and its EAGLE-3 draft with llama.cpp's own "
                                   "converter (needs PyTorch: pip install \"eagle3[train]\"). Drafts of the EAGLE "
                                   "trainer, SpecForge, speculators, ModelOpt and AngelSlim are read with their own "
                                   "layer-id conventions; docs/formats.md lists the formats, what each means and "
                                   "what is refused.")
    p.add_argument("target", help="Hugging Face target checkpoint folder")
    p.add_argument("draft", nargs="?", help="Hugging Face EAGLE-3 draft checkpoint folder")
    p.add_argument("-o", "--out", default=".", help="output folder (default: here)")
    p.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0", "auto"])
    p.add_argument("--name", help="file name stem (default: the target folder's name)")
    p.add_argument("--target-layers", type=_layer_ids, metavar="A,B,C",
                   help="the three target layers the draft reads, as layer inputs (0: the embeddings); "
                        "for a draft whose config does not name them")
    p.set_defaults(run=cmd_convert)

    p = sub.add_parser("train-head", help="train an EAGLE-3 head for a GGUF target (needs PyTorch)",
                       description="Self-distillation: the target answers chat prompts, eagle3 reads its hidden "
                                   "states and logits from the GGUF, and PyTorch trains one EAGLE-3 decoder layer "
                                   "with a training-time test. Resumes from its work folder; prints the head's "
                                   "held-out tau. Needs the train extra: pip install \"eagle3[train]\".")
    p.add_argument("target", help="target model GGUF")
    p.add_argument("-o", "--out", required=True, help="the head GGUF to write")
    p.add_argument("--prompts", metavar="FILE", help="a JSON list of prompts, or one prompt per line (default: "
                                                    "eagle3's own chat prompts)")
    p.add_argument("--self-prompts", type=int, default=0, metavar="N",
                   help="N more prompts written by the target itself from its chat template, taken in turn with "
                        "the others (default 0)")
    p.add_argument("--tokens", type=_positive, default=100_000, help="answer tokens to distil (default 100000)")
    p.add_argument("--max-new-tokens", type=_positive, default=256, help="longest answer (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="answers' sampling temperature (default 0: greedy)")
    p.add_argument("--epochs", type=float, default=4.0, help="passes over the data (default 4)")
    p.add_argument("--draft-vocab", type=_positive, default=8192, help="draft vocabulary size (default 8192)")
    p.add_argument("--ttt-steps", type=_positive, default=5, help="draft steps trained at once (default 5)")
    p.add_argument("--batch-tokens", type=_positive, default=4096, help="tokens per training step (default 4096)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 0.001)")
    p.add_argument("--outtype", choices=["f16", "q8_0"], default="f16", help="the head's matrices (default f16)")
    p.add_argument("--target-layers", type=_layer_ids, metavar="A,B,C",
                   help="the three target layers whose inputs the head reads (default 2, n/2, n-3)")
    p.add_argument("--held-out", type=int, default=8, help="prompts kept for measuring tau (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", help="data and checkpoints (default: OUT.work); a stopped run resumes from it")
    p.add_argument("--threads", type=_positive, default=None, help="CPU threads (default: all usable)")
    p.add_argument("--device", help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--teacher", choices=["engine", "torch"], default="engine",
                   help="what makes the answers and features: eagle3's llama.cpp on the CPU (default), or the "
                        "target's forward in PyTorch on --device (on a GPU, far faster)")
    p.add_argument("--n-seq", type=_positive, default=8,
                   help="prompts answered at once (default 8; with --teacher torch on a GPU, hundreds)")
    p.set_defaults(run=cmd_train_head)

    p = sub.add_parser("info", help="show a GGUF model's metadata",
                       description="Print a GGUF file's metadata (and tensors) without loading it.")
    p.add_argument("model", help="model GGUF")
    p.add_argument("--tensors", action="store_true", help="also list the tensors")
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.set_defaults(run=cmd_info)

    p = sub.add_parser("rpc-server", help="serve this machine's CPU to models on other machines (llama.cpp RPC)",
                       description="Run llama.cpp's RPC server in the foreground until Ctrl-C or SIGTERM. A model loaded "
                                   "with rpc_servers=['HOST:PORT'] (or eagle3 generate --rpc HOST:PORT) puts its "
                                   "layers here. The protocol has no authentication: keep it on loopback or a "
                                   "trusted network.")
    p.add_argument("--host", default="127.0.0.1", help="IPv4 address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_positive, default=remote.DEFAULT_PORT,
                   help=f"port (default {remote.DEFAULT_PORT})")
    p.add_argument("--threads", type=_positive, default=None, help="CPU threads (default: all usable)")
    p.add_argument("--cache", metavar="DIR", help="keep the weights clients send here, so that loading the same "
                                                   "model again sends less")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a --host other than loopback (anyone who reaches the port can use this machine)")
    p.set_defaults(run=cmd_rpc_server)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except Eagle3Error as e:
        print(f"eagle3 {args.command}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the output went to a pager or `head` that stopped reading
        sys.stdout = None
        return 0
