"""Train an EAGLE-3 head for a GGUF target, with no Hugging Face checkpoint.

``eagle3.train_head(target, out)`` distils the head from the target itself:
the target answers chat prompts (its own text), eagle3 reads the three layer
inputs the head fuses and the target's next-token logits straight from the
GGUF (:mod:`eagle3.train.data`), and PyTorch fits one decoder layer with a
training-time test over a reduced draft vocabulary (:mod:`eagle3.train.fit`).
The head is written as an ``eagle3`` GGUF that borrows the target's
embeddings (:mod:`eagle3.train.export`), checked with :func:`eagle3.check_pair`
and measured on held-out prompts. Needs the ``train`` extra (PyTorch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from eagle3 import _core
from eagle3._validate import as_int
from eagle3.compat import check_pair
from eagle3.draft_formats import default_target_layers
from eagle3.errors import Eagle3Error, InvalidArgumentError
from eagle3.model import Model
from eagle3.train import data as _data
from eagle3.train.progress import Progress
from eagle3.train import prompts as _prompts
from eagle3.train.prompts import default_prompts, self_prompts

__all__ = ["train_head", "TrainReport", "default_prompts", "self_prompts"]


@dataclasses.dataclass
class TrainReport:
    """What :func:`train_head` made and measured."""

    head: Path
    """The written ``eagle3`` GGUF."""
    target_layers: list[int]
    draft_vocab_size: int
    train_examples: int
    answer_tokens: int
    """Tokens of the target's own answers trained on."""
    steps: int
    held_out_loss: list[float]
    """Per draft step, on the held-out examples' teacher."""
    held_out_agreement: list[float]
    """Per draft step: share of positions where the head's first choice is the target's."""
    held_out_tau: float
    """Tokens per target pass when the head drafts (greedy, ``n_draft_max=4``) for the held-out prompts."""
    seconds: dict[str, float]


def _layers(model: Model, layers: Sequence[int] | None) -> list[int]:
    n = model.n_layer
    if layers is None:
        return [min(max(lid, 0), n - 1) for lid in default_target_layers(n)]
    layers = [int(x) for x in layers]
    if len(layers) != 3 or not all(0 <= x < n for x in layers):
        raise InvalidArgumentError(f"layers must be 3 layer ids in 0..{n - 1}, got {layers}")
    return layers


def _shape(model: Model) -> dict:
    meta, arch = model.metadata, model.architecture
    n_embd, n_head, n_kv = model.n_embd, model.n_head, model.n_head_kv
    if n_embd % n_head or (n_embd // n_head) % 2 or n_kv < 1 or n_head % n_kv:
        # the head's attention need not be the target's: heads of the widest even size that fits
        head_dim = next((d for d in (128, 64, 32, 16, 8, 4, 2) if n_embd % d == 0), None)
        if head_dim is None:
            raise InvalidArgumentError(f"a head of odd width {n_embd} cannot use rope")
        n_head = n_kv = n_embd // head_dim
    n_ff = meta.get(f"{arch}.feed_forward_length", 0)
    n_ff = int(np.max(n_ff)) if np.size(n_ff) else 0  # (per-layer arrays; MoE targets may give 0)
    return dict(hidden_size=n_embd, target_hidden_size=n_embd, num_attention_heads=n_head,
                num_key_value_heads=n_kv, intermediate_size=n_ff if n_ff > 0 else 4 * n_embd,
                vocab_size=model.n_vocab,
                rms_norm_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
                rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)))


def _split(prompts: list, held_out: int, seed: int) -> tuple[list, list]:
    order = np.random.default_rng(seed).permutation(len(prompts))
    held = sorted(order[:held_out].tolist())
    keep = sorted(order[held_out:].tolist())
    return [prompts[i] for i in keep], [prompts[i] for i in held]


def _digest(prompts: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(np.asarray(p, np.int32).tobytes() + b"|")
    return h.hexdigest()[:16]


def _own_prompts(target: str, n: int, seed: int, work: Path, threads: int, progress: bool) -> list[str]:
    """:func:`self_prompts`, kept in the work folder (they take minutes to write)."""
    path = work / "self-prompts.json"
    if path.exists():
        kept = json.loads(path.read_text())
        if kept["seed"] == seed and len(kept["prompts"]) >= n:  # (the first n of more are the same n)
            return kept["prompts"][:n]
    got = _prompts.self_prompts(target, n, seed=seed, threads=threads, progress=progress)
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(seed=seed, prompts=got), indent=0) + "\n")
    return got


def _alternate(a: list, b: list) -> list:
    """``a[0], b[0], a[1], b[1], ...``, then the rest of the longer list."""
    out = [x for pair in zip(a, b) for x in pair]
    return out + a[len(b):] + b[len(a):]


def train_head(target: str | os.PathLike, out: str | os.PathLike, prompts: Sequence | None = None, *,
               self_prompts: int = 0, tokens: int = 100_000, max_new_tokens: int = 256, temperature: float = 0.0,
               chat: bool = True, layers: Sequence[int] | None = None, draft_vocab_size: int = 8192, top_k: int = 32,
               ttt_steps: int = 5, epochs: float = 4.0, batch_tokens: int = 4096, lr: float = 1e-3,
               step_decay: float = 0.8, held_out: int = 8, seed: int = 0, work_dir: str | os.PathLike | None = None,
               threads: int | None = None, n_seq: int = 8, device: str | None = None, teacher: str = "engine",
               checkpoint_every: int = 50, outtype: str = "f16", progress: bool = True) -> TrainReport:
    """Train an EAGLE-3 head for the GGUF ``target`` and write it to ``out``.

    - ``prompts``: chat messages (strings, put through the model's chat
      template when it has one and ``chat``) or int32 token arrays; by default
      :func:`default_prompts`. ``held_out`` of them are kept for measuring.
    - ``self_prompts``: that many more prompts, written by the target itself
      (:func:`eagle3.train.self_prompts`), taken in turn with ``prompts``.
    - ``tokens``: how many answer tokens to distil; answers are generated
      (``max_new_tokens`` each, ``temperature`` 0: greedy) in the prompts'
      order until there are that many or the prompts run out.
    - ``layers``: the three target layers whose inputs the head fuses
      (default: inputs of layers 2, n/2 and n-3, as EAGLE-3 does).
    - ``draft_vocab_size``: the head predicts over the target tokens the
      target most often chooses (``d2t``).
    - ``ttt_steps`` draft steps deep, ``epochs`` passes over the data in
      batches of about ``batch_tokens`` tokens, AdamW at ``lr``.
    - ``work_dir`` (default ``OUT.work``) keeps the data and checkpoints:
      a run that stops resumes from them, and a run with more or other
      prompts reuses the answers and features of those it shares;
      ``seed`` fixes every draw.
    - ``device``: a torch device (default ``cuda`` when present, else the CPU).
    - ``teacher``: what makes the answers and features: ``"engine"`` (eagle3's
      llama.cpp, on the CPU) or ``"torch"`` (:class:`eagle3.train.torch_target.TorchTarget`,
      the same GGUF's forward in PyTorch on ``device``, ``n_seq`` prompts at a time: on a
      GPU, far faster; llama, qwen2 and qwen3 targets).
    - ``outtype``: the head's matrices in ``"f16"`` or ``"q8_0"``.

    Returns a :class:`TrainReport`; the head passes :func:`check_pair` with
    the target, or an :class:`Eagle3Error` says why not.
    """
    try:
        import torch
    except ImportError:
        raise Eagle3Error("train_head needs PyTorch: pip install 'eagle3[train]'") from None
    from eagle3.context import default_threads
    from eagle3.train import export, fit
    from eagle3.train.head import DraftConfig

    out = Path(out)
    work = Path(work_dir) if work_dir is not None else out.with_name(out.name + ".work")
    threads = threads or default_threads()
    self_prompts, tokens = as_int(self_prompts, "self_prompts", 0), as_int(tokens, "tokens", 1)
    max_new_tokens, top_k = as_int(max_new_tokens, "max_new_tokens", 1), as_int(top_k, "top_k", 1)
    ttt_steps, batch_tokens = as_int(ttt_steps, "ttt_steps", 1), as_int(batch_tokens, "batch_tokens", 16)
    draft_vocab_size, held_out = as_int(draft_vocab_size, "draft_vocab_size", 2), as_int(held_out, "held_out", 0)
    if teacher not in ("engine", "torch"):
        raise InvalidArgumentError(f"teacher must be 'engine' or 'torch', got {teacher!r}")
    if outtype not in export.OUTTYPES:
        raise InvalidArgumentError(f"outtype must be one of {export.OUTTYPES}, got {outtype!r}")
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    with Model(target) as model:
        if _core.eagle3_target_support(model.architecture) < 1:
            raise InvalidArgumentError(f"llama.cpp's EAGLE-3 cannot read hidden states from a '{model.architecture}' "
                                       f"target (its graph does not record its layers' inputs)")
        if teacher == "torch":
            from eagle3.train.torch_target import ROPE_NEOX
            if model.architecture not in ROPE_NEOX:
                raise InvalidArgumentError(f"teacher='torch' has no PyTorch forward for a '{model.architecture}' "
                                           f"target (it has: {', '.join(sorted(ROPE_NEOX))}); use teacher='engine'")
        layers = _layers(model, layers)
        shape = _shape(model)
        torch.manual_seed(seed)
        torch.set_num_threads(threads)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

        all_prompts = list(default_prompts() if prompts is None else prompts)
        if self_prompts:
            all_prompts = _alternate(_own_prompts(model.path, self_prompts, seed, work, threads, progress), all_prompts)
        if len(all_prompts) <= held_out:
            raise InvalidArgumentError(f"{len(all_prompts)} prompts: more than held_out = {held_out} are needed")
        ids = _data.prompt_tokens(model, all_prompts, chat)
        train_ids, held_ids = _split(ids, held_out, seed)
        # what the cached data depends on (the prompts key each item: other prompts add to it)
        _data.write_manifest(work, dict(target=model.path, target_size=os.path.getsize(model.path), layers=layers,
                                        top_k=top_k, max_new_tokens=max_new_tokens, temperature=temperature,
                                        **({"seed": seed} if temperature > 0 else {}),
                                        **({"teacher": teacher} if teacher != "engine" else {})))
        forward = None
        if teacher == "torch":
            from eagle3.train.torch_target import TorchTarget
            forward = TorchTarget.from_gguf(model.path, dev)

        sequences = _data.answer(model, train_ids, work / "answers", max_new_tokens, temperature, seed, n_seq, threads,
                                 progress, budget=tokens, teacher=forward)
        n_prompt = [len(p) for p in train_ids[:len(sequences)]]
        held_seqs = _data.answer(model, held_ids, work / "answers", max_new_tokens, temperature, seed, n_seq,
                                 threads, progress, teacher=forward)
        seconds["answers"] = time.monotonic() - t0
        t1 = time.monotonic()
        shard = max(_data.SHARD_SEQUENCES, n_seq)
        train_set = _data.features(model, sequences, n_prompt, layers, top_k, work / "features", threads, progress,
                                   forward, shard)
        held_set = _data.features(model, held_seqs, [len(p) for p in held_ids], layers, top_k, work / "features",
                                  threads, progress, forward, shard)
        del forward  # (its weights: the head's training needs the memory more)
        seconds["features"] = time.monotonic() - t1

        # the head
        t2 = time.monotonic()
        eog = [t for t in range(model.n_vocab) if model.is_eog(t)][:16]
        d2t = fit.draft_vocabulary(train_set, model.n_vocab, draft_vocab_size, eog)
        context_length = int(model.metadata.get(f"{model.architecture}.context_length", 4096))
        cfg = DraftConfig(**shape, draft_vocab_size=len(d2t), aux_layers=tuple(layers),
                          max_position_embeddings=context_length)
        emb = export.target_matrix(model.path, ("token_embd.weight",))
        embeddings = torch.from_numpy(emb).to(dev)
        lm = export.target_matrix(model.path, ("output.weight",)) if "output.weight" in model.tensors else emb
        head = fit.new_head(cfg, d2t, lm, export.target_vector(model.path, "output_norm.weight"))
        head.to(dev)
        trainer = fit.Trainer(head, embeddings, train_set, ttt_steps, batch_tokens, step_decay, dev)
        total_steps = max(1, round(epochs * len(train_set.tokens) / batch_tokens))
        opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        rng = np.random.default_rng(seed)
        step = 0
        ckpt = work / "checkpoint.pt"
        recipe = dict(data=_digest([train_set.tokens, train_set.offsets, train_set.n_prompt]), d2t=_digest([d2t]),
                      steps=total_steps, ttt_steps=ttt_steps, batch_tokens=batch_tokens, lr=lr,
                      step_decay=step_decay, cfg=dataclasses.asdict(cfg))
        if ckpt.exists():
            state = torch.load(ckpt, map_location=dev, weights_only=False)
            if state["recipe"] == recipe:
                head.load_state_dict(state["head"])
                opt.load_state_dict(state["opt"])
                rng.bit_generator.state = state["rng"]
                step = state["step"]
        bar = Progress("training", total_steps, progress)
        bar.advance(step)
        head.train()
        curve: list[float] = []
        while step < total_steps:
            rate = fit.lr_at(step, total_steps, lr, warmup=min(50, total_steps // 10 + 1))
            loss, agree = trainer.step(opt, rng, rate)
            step += 1
            curve.append(loss)
            bar.advance(1, f"loss {np.mean(curve[-20:]):.3f}, first-step agreement {agree[0]:.2f}")
            if step % checkpoint_every == 0 or step == total_steps:
                tmp = ckpt.with_name(ckpt.name + ".partial")
                torch.save(dict(recipe=recipe, head=head.state_dict(), opt=opt.state_dict(),
                                rng=rng.bit_generator.state, step=step), tmp)
                tmp.replace(ckpt)
        bar.done()
        head.eval()
        held_loss, held_agree = fit.Trainer(head, embeddings, held_set, ttt_steps, batch_tokens, step_decay,
                                            dev).held_out()
        seconds["training"] = time.monotonic() - t2

        head.cpu()
        path = export.write_head(out, model.path, head, context_length, outtype)
        t3 = time.monotonic()
        tau = measure_tau(model, path, held_ids, max_new_tokens=min(128, max_new_tokens), threads=threads)
        seconds["held_out_tau"] = time.monotonic() - t3
        report = TrainReport(path, layers, len(d2t), len(train_set), train_set.answer_tokens(), total_steps,
                             held_loss, held_agree, tau, seconds)
        (work / "report.json").write_text(json.dumps(dataclasses.asdict(report), default=str, indent=2) + "\n")
        if progress:
            print(f"held-out: tau {tau:.2f} at n_draft_max 4; first-choice agreement per draft step "
                  f"{', '.join(f'{a:.2f}' for a in held_agree)}")
        return report


def measure_tau(target: Model, head: str | os.PathLike, prompts: list[np.ndarray], max_new_tokens: int = 128,
                n_draft_max: int = 4, threads: int | None = None) -> float:
    """Tokens per target pass, greedy, with ``head`` drafting for ``target`` on ``prompts``."""
    from eagle3.context import Context
    from eagle3.session import Eagle3Session

    n_ctx = max(len(p) for p in prompts) + max_new_tokens + n_draft_max + 8
    accepted = rounds = 0
    with Model(head) as draft:
        check_pair(target, draft).raise_if_incompatible()
        with Context(target, n_ctx=n_ctx, n_threads=threads) as tctx, Context(draft, other=tctx) as dctx, \
                Eagle3Session(tctx, dctx, n_draft_max=n_draft_max) as session:
            for p in prompts:
                g = session.generate(p, max_new_tokens)
                accepted += g.stats.n_accepted
                rounds += g.stats.n_seq_rounds
    return 1.0 + accepted / rounds if rounds else 0.0
