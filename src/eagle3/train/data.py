"""Self-distillation data, computed by the GGUF target itself through eagle3.

1. **Answers.** The target answers each prompt (plain decoding, batched), so
   the head learns the text the target really produces.
2. **Features and teacher.** Each prompt + answer is decoded once more in one
   batch with the three layers' inputs captured (what the head reads at
   inference, from the same quantized weights) and the target's logits kept
   as their ``top_k`` largest entries (the teacher's distribution).

Both stages write shards into the work folder and skip shards already there,
so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from eagle3._core import Batch
from eagle3.context import Context
from eagle3.errors import InvalidArgumentError
from eagle3.model import Model
from eagle3.train.progress import Progress

SHARD_SEQUENCES = 32


@dataclass
class Dataset:
    """Training examples, concatenated: example i is ``tokens[offsets[i]:offsets[i+1]]``."""

    tokens: np.ndarray       # int32 [N]
    offsets: np.ndarray      # int64 [n + 1]
    n_prompt: np.ndarray     # int32 [n]: prompt tokens of each example
    features: np.ndarray     # float16 [N, 3 * n_embd]: the three layers' inputs, concatenated
    top_ids: np.ndarray      # int32 [N, k]: the target's k most likely next tokens after each token
    top_logits: np.ndarray   # float32 [N, k]: their logits

    def __len__(self) -> int:
        return len(self.n_prompt)

    def answer_tokens(self) -> int:
        return int(np.diff(self.offsets).sum() - self.n_prompt.sum())


def prompt_tokens(model: Model, prompts: Sequence, chat: bool) -> list[np.ndarray]:
    """Token ids of each prompt: strings through the chat template (when the
    model has one and ``chat``) or the tokenizer; int arrays as they are."""
    use_chat = chat and model.chat_template is not None
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            ids = model.chat_tokens([{"role": "user", "content": p}]) if use_chat else model.tokenize(p)
        else:
            ids = np.asarray(p)
            if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
                raise InvalidArgumentError(f"prompt {i} is neither a string nor a 1-D array of token ids")
            if ids.min() < 0 or ids.max() >= model.n_vocab:
                raise InvalidArgumentError(f"prompt {i} holds token ids outside the vocabulary "
                                           f"(0..{model.n_vocab - 1})")
        out.append(np.ascontiguousarray(ids, dtype=np.int32))
    return out


def _shards(n: int) -> list[range]:
    return [range(i, min(n, i + SHARD_SEQUENCES)) for i in range(0, n, SHARD_SEQUENCES)]


def answer(model: Model, prompts: list[np.ndarray], folder: Path, max_new_tokens: int, temperature: float,
           seed: int, n_seq: int, threads: int, progress: bool, budget: int | None = None) -> list[np.ndarray]:
    """Prompt + the target's answer for each prompt in order, until the answers
    hold ``budget`` tokens (None: every prompt); cached in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    longest = max(len(p) for p in prompts) + max_new_tokens + 1
    shards = _shards(len(prompts))
    bar = Progress("answers", len(prompts), progress)
    out: list[np.ndarray] = []
    ctx = None
    answered = 0
    for s, rows in enumerate(shards):
        if budget is not None and answered >= budget:
            break
        path = folder / f"answers-{s:05d}.npz"
        if not path.exists():
            if ctx is None:
                ctx = Context(model, n_ctx=n_seq * longest, n_batch=max(512, longest), n_seq_max=n_seq,
                              n_threads=threads)
            seqs = []
            for i in range(rows.start, rows.stop, n_seq):
                batch = [prompts[j] for j in range(i, min(rows.stop, i + n_seq))]
                gens = ctx.generate_batch(batch, max_new_tokens, temperature=temperature, seed=seed + i)
                seqs += [np.concatenate([p, g.tokens]).astype(np.int32) for p, g in zip(batch, gens)]
                bar.advance(len(batch))
            _save_ragged(path, seqs)
        else:
            bar.advance(len(rows))
        got = _load_ragged(path)
        answered += sum(len(g) - len(prompts[i]) for g, i in zip(got, rows))
        out += got
    bar.done()
    if ctx is not None:
        ctx.close()
    return out


def _save_ragged(path: Path, seqs: list[np.ndarray]) -> None:
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    tmp = path.with_name(path.stem + ".partial.npz")
    np.savez(tmp, tokens=np.concatenate(seqs), offsets=offsets)
    tmp.replace(path)


def _load_ragged(path: Path) -> list[np.ndarray]:
    with np.load(path) as f:
        tokens, offsets = f["tokens"], f["offsets"]
    return [tokens[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def features(model: Model, sequences: list[np.ndarray], n_prompt: list[int], layers: Sequence[int], top_k: int,
             folder: Path, threads: int, progress: bool) -> Dataset:
    """Decode every sequence with ``layers`` captured; keep the features and the teacher's top-k."""
    folder.mkdir(parents=True, exist_ok=True)
    longest = max(len(s) for s in sequences)
    bar = Progress("features", len(sequences), progress)
    parts = []
    ctx = None
    for s, rows in enumerate(_shards(len(sequences))):
        path = folder / f"features-{s:05d}.npz"
        if not path.exists():
            if ctx is None:
                ctx = Context(model, n_ctx=longest, n_batch=longest, n_ubatch=min(512, longest), n_seq_max=1,
                              n_threads=threads)
                ctx.capture_layer_inputs(layers)
            feats, ids, logits = [], [], []
            for i in rows:
                f, t, lg = _one(ctx, sequences[i], layers, top_k)
                feats.append(f)
                ids.append(t)
                logits.append(lg)
                bar.advance(1)
            tmp = path.with_name(path.stem + ".partial.npz")
            np.savez(tmp, features=np.concatenate(feats), top_ids=np.concatenate(ids),
                     top_logits=np.concatenate(logits))
            tmp.replace(path)
        else:
            bar.advance(len(rows))
        with np.load(path) as f:
            parts.append((f["features"], f["top_ids"], f["top_logits"]))
    bar.done()
    if ctx is not None:
        ctx.close()
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sequences])]).astype(np.int64)
    return Dataset(np.concatenate(sequences).astype(np.int32), offsets, np.asarray(n_prompt, np.int32),
                   np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                   np.concatenate([p[2] for p in parts]).astype(np.float32))


def _one(ctx: Context, tokens: np.ndarray, layers: Sequence[int], top_k: int):
    ctx.clear()
    ctx.decode(Batch.from_tokens(tokens, output="all"))
    h = ctx.layer_inputs(layers)                        # [3, n, E]
    feats = np.ascontiguousarray(h.transpose(1, 0, 2).reshape(len(tokens), -1), dtype=np.float16)
    logits = np.stack([np.asarray(ctx.logits(i)) for i in range(len(tokens))])
    ids = np.argpartition(-logits, top_k - 1, axis=1)[:, :top_k]
    top = np.take_along_axis(logits, ids, axis=1)
    order = np.argsort(-top, axis=1, kind="stable")
    return (feats, np.take_along_axis(ids, order, axis=1).astype(np.int32),
            np.take_along_axis(top, order, axis=1).astype(np.float16))


def write_manifest(folder: Path, settings: dict) -> None:
    """Record what the cached shards were made with; a different recipe refuses to reuse them."""
    path = folder / "data.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != settings:
            changed = sorted(k for k in settings.keys() | old.keys() if old.get(k) != settings.get(k))
            raise InvalidArgumentError(f"the work folder {folder} holds data made with other settings "
                                       f"({', '.join(changed)}); use another work folder or delete it")
        return
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
