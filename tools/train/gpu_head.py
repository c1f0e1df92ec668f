"""Train an EAGLE-3 head for a GGUF target on a CUDA GPU, with its data made there too.

``eagle3.train_head`` makes its data with eagle3's engine on the CPU; this recipe makes
it with :class:`eagle3.train.torch_target.TorchTarget` on the GPU (answers, layer inputs
and teacher logits from the same GGUF weights), then fits and writes the head with the
same code as ``train_head``. It runs in two steps, so that the GPU machine needs only
PyTorch, numpy and the pinned tree's gguf-py, not eagle3's extension:

    # where eagle3 is installed: tokenize the prompts, record the target's shape
    python tools/train/gpu_head.py prepare TARGET.gguf inputs/
    # on the GPU machine (PYTHONPATH need not hold eagle3: src/ is found from here)
    python tools/train/gpu_head.py run TARGET.gguf inputs/ out/ --gguf-py PATH/gguf-py --train-minutes 4
    # back where eagle3 is installed: the held-out tau of out/head.gguf
    eagle3 bench --target TARGET.gguf --draft out/head.gguf ...

Data: eagle3's default prompts (held out as ``train_head`` holds them out) and
``--self-prompts`` prompts the target writes (its chat template up to the user's turn,
sampled at temperature 1, kept when the model ends the turn itself), greedy answers of
up to ``--max-new-tokens``. Training runs ``--train-minutes``: the number of steps is
fixed after the first steps' time (or given: ``--steps``), and the learning rate follows
``train_head``'s schedule. ``--init HEAD.gguf`` trains a written head further.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import types
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[2] / "src"


def prepare(target: str, folder: Path, held_out: int, seed: int) -> None:
    import eagle3
    from eagle3.train import _layers, _shape, _split
    from eagle3.train.data import prompt_tokens
    from eagle3.train.prompts import _MARK, default_prompts

    folder.mkdir(parents=True, exist_ok=True)
    with eagle3.Model(target) as model:
        ids = prompt_tokens(model, default_prompts(), chat=True)
        train_ids, held_ids = _split(ids, held_out, seed)
        text = model.apply_chat_template([{"role": "user", "content": _MARK}], add_generation_prompt=True)
        at = text.index(_MARK)
        prefix = model.template_tokens(text[:at])
        suffix = model.tokenize(text[at + len(_MARK):], add_bos=False, special=True)
        stop = [t for t in range(model.n_vocab) if model.is_eog(t)][:16]
        meta = dict(layers=_layers(model, None), shape=_shape(model), stop=stop,
                    context_length=int(model.metadata.get(f"{model.architecture}.context_length", 4096)))
    arrays = {f"train_{i}": p for i, p in enumerate(train_ids)}
    arrays.update({f"held_{i}": p for i, p in enumerate(held_ids)})
    np.savez(folder / "prompts.npz", prefix=prefix, suffix=suffix, **arrays)
    (folder / "meta.json").write_text(json.dumps(dict(meta, n_train=len(train_ids), n_held=len(held_ids))) + "\n")
    print(f"{len(train_ids)} training and {len(held_ids)} held-out prompts; prefix {len(prefix)} tokens, "
          f"suffix {suffix.tolist()}; stop {stop}")


def _import_training_modules(gguf_py: str):
    """eagle3's training modules without the package's __init__ (which loads the extension)."""
    sys.path.insert(0, gguf_py)
    for name, path in (("eagle3", SRC / "eagle3"), ("eagle3.train", SRC / "eagle3" / "train")):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(path)]
            sys.modules[name] = module
    config = types.ModuleType("eagle3._build_config")
    config.LLAMA_CPP_SOURCE = str(Path(gguf_py).parent)
    sys.modules.setdefault("eagle3._build_config", config)
    import gguf

    from eagle3.train import data, export, fit, head, torch_target
    return gguf, data, export, fit, head, torch_target


def _log(msg: str, t0: float) -> None:
    print(f"[{time.monotonic() - t0:7.1f} s] {msg}", flush=True)


def run(args) -> None:
    import torch

    t0 = time.monotonic()
    gguf, data, export, fit, head_mod, torch_target = _import_training_modules(args.gguf_py)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    meta = json.loads((args.inputs / "meta.json").read_text())
    saved = np.load(args.inputs / "prompts.npz")
    train_ids = [saved[f"train_{i}"] for i in range(meta["n_train"])]
    held_ids = [saved[f"held_{i}"] for i in range(meta["n_held"])]
    prefix, suffix, stop = saved["prefix"], saved["suffix"], meta["stop"]
    layers = tuple(meta["layers"])
    if args.default_prompts is not None:
        train_ids = train_ids[:args.default_prompts]
    target = torch_target.TorchTarget.from_gguf(args.target, dev, gguf=gguf)
    _log(f"target on {dev}: {target.shape}", t0)

    # prompts the target writes: its user turns, ended by itself
    own, seen = [], set()
    for attempt in range(4):
        if len(own) >= args.self_prompts:
            break
        turns = target.generate([prefix] * args.self_prompts, args.prompt_tokens, stop, batch=args.batch,
                                temperature=1.0, seed=args.seed + attempt)
        for turn in turns:
            key = tuple(turn.tolist())
            if len(turn) > 1 and turn[-1] in stop and not np.isin(turn[:-1], stop).any() and key not in seen:
                seen.add(key)
                own.append(np.concatenate([prefix, turn[:-1], suffix]).astype(np.int32))
    own = own[:args.self_prompts]
    _log(f"{len(own)} self-written prompts", t0)
    prompts = [p for pair in zip(own, train_ids) for p in pair] + own[len(train_ids):] + train_ids[len(own):]

    answers = target.generate(prompts + held_ids, args.max_new_tokens, stop, batch=args.batch)
    seqs = [np.concatenate([p, a]).astype(np.int32) for p, a in zip(prompts + held_ids, answers)]
    _log(f"answers: {sum(len(a) for a in answers[:len(prompts)])} tokens for {len(prompts)} prompts", t0)

    def dataset(sequences, n_prompt):  # (features and teacher logits stay on the GPU)
        feats, ids, top = target.features(sequences, layers, args.top_k, batch_tokens=args.feature_batch_tokens)
        offsets = np.concatenate([[0], np.cumsum([len(s) for s in sequences])]).astype(np.int64)
        return data.Dataset(np.concatenate(sequences), offsets, np.asarray(n_prompt, np.int32), feats,
                            ids.cpu().numpy(), top)

    train_set = dataset(seqs[:len(prompts)], [len(p) for p in prompts])
    held_set = dataset(seqs[len(prompts):], [len(p) for p in held_ids])
    n_answer = int(np.diff(train_set.offsets).sum() - train_set.n_prompt.sum())
    _log(f"features: {len(train_set.tokens)} tokens ({n_answer} in answers)", t0)

    # the draft vocabulary: how much of the held-out teacher's first choices each size covers
    vocabularies = {size: fit.draft_vocabulary(train_set, target.shape.n_vocab, size, stop)
                    for size in sorted({2048, 4096, 8192, 16384, args.draft_vocab})}
    coverage = {size: float(np.isin(held_set.top_ids[:, 0], d2t).mean()) for size, d2t in vocabularies.items()}
    _log(f"held-out first choices in the draft vocabulary: {coverage}", t0)
    if args.init:  # (a head to train further: its draft vocabulary and shape stay)
        head = export.read_head(args.init, gguf=gguf)
        if head.cfg.aux_layers != layers or head.cfg.vocab_size != target.shape.n_vocab:
            raise SystemExit(f"{args.init} reads layers {head.cfg.aux_layers}, not this target's {layers}")
        d2t = head.d2t.numpy()
    else:
        d2t = vocabularies[args.draft_vocab]
        cfg = head_mod.DraftConfig(**meta["shape"], draft_vocab_size=len(d2t), aux_layers=layers,
                                   max_position_embeddings=meta["context_length"])
        torch.manual_seed(args.seed)
        head = fit.new_head(cfg, d2t, target.out, target.w["output_norm.weight"])
    emb = target.w["token_embd.weight"]
    head.to(dev).train()
    trainer = fit.Trainer(head, emb, train_set, args.ttt_steps, args.batch_tokens, 0.8, dev)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng(args.seed)
    total, step, t_train, curve = args.steps, 0, time.monotonic(), []
    probe = 30
    seconds = args.train_minutes * 60
    if args.deadline_minutes:  # (what the deadline leaves, a minute kept for measuring and writing)
        seconds = max(10.0, min(seconds, args.deadline_minutes * 60 - (t_train - t0) - 60))
    while total is None or step < total:
        if step == probe and not args.steps:  # (the schedule's length, from the time of the first steps)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.monotonic() - t_train) / probe
            total = max(probe + 1, int(seconds / per_step))
            _log(f"{per_step * 1000:.0f} ms a step: {total} steps of {args.batch_tokens} tokens "
                 f"({total * args.batch_tokens / len(train_set.tokens):.1f} epochs)", t0)
        loss, agree = trainer.step(opt, rng, fit.lr_at(step, total or 10 * probe, args.lr, warmup=probe))
        step += 1
        curve.append([loss] + agree)
        if total and step % max(1, total // 10) == 0:
            recent = np.mean(curve[-50:], 0)
            _log(f"step {step}/{total}: loss {recent[0]:.3f}, agreement per step "
                 f"{', '.join(f'{a:.3f}' for a in recent[1:])}", t0)
    head.eval()
    _, held_agree = fit.Trainer(head, emb, held_set, args.ttt_steps, args.batch_tokens, 0.8, dev).held_out()
    _log(f"held-out agreement per draft step: {', '.join(f'{a:.3f}' for a in held_agree)}", t0)

    args.out.mkdir(parents=True, exist_ok=True)
    head.cpu()
    export.write_head(args.out / "head.gguf", args.target, head, head.cfg.max_position_embeddings, args.outtype)
    report = dict(self_prompts=len(own), prompts=len(prompts), answer_tokens=n_answer,
                  tokens=int(len(train_set.tokens)), coverage=coverage, draft_vocab=len(d2t), steps=total,
                  held_out_agreement=held_agree, seconds=time.monotonic() - t0, settings=vars(args) | {
                      k: str(v) for k, v in vars(args).items() if isinstance(v, Path)})
    (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    _log(f"wrote {args.out / 'head.gguf'}", t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("target")
    p.add_argument("inputs", type=Path)
    p.add_argument("--held-out", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run")
    r.add_argument("target")
    r.add_argument("inputs", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--gguf-py", required=True, help="the pinned llama.cpp tree's gguf-py folder")
    r.add_argument("--self-prompts", type=int, default=16384)
    r.add_argument("--default-prompts", type=int, default=None, help="use only the first N default prompts")
    r.add_argument("--prompt-tokens", type=int, default=128)
    r.add_argument("--max-new-tokens", type=int, default=256)
    r.add_argument("--batch", type=int, default=1024, help="sequences generated at once")
    r.add_argument("--feature-batch-tokens", type=int, default=65536)
    r.add_argument("--top-k", type=int, default=32)
    r.add_argument("--draft-vocab", type=int, default=4096)
    r.add_argument("--init", help="an eagle3 head GGUF to train further (its draft vocabulary is kept)")
    r.add_argument("--ttt-steps", type=int, default=4)
    r.add_argument("--batch-tokens", type=int, default=16384)
    r.add_argument("--lr", type=float, default=2e-3)
    r.add_argument("--train-minutes", type=float, default=4.0)
    r.add_argument("--steps", type=int, default=None, help="train this many steps (not --train-minutes)")
    r.add_argument("--deadline-minutes", type=float, default=None,
                   help="train for less when the run as a whole would pass this")
    r.add_argument("--outtype", default="q8_0")
    r.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.target, args.inputs, args.held_out, args.seed)
    else:
        run(args)


if __name__ == "__main__":
    main()
