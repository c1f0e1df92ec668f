"""Self-distillation data, computed by the GGUF target itself through eagle3.

1. **Answers.** The target answers each prompt (plain decoding, batched), so
   the head learns the text the target really produces.
2. **Features and teacher.** Each prompt + answer is decoded once more in one
   batch with the three layers' inputs captured (what the head reads at
   inference, from the same quantized weights) and the target's logits kept
   as their ``top_k`` largest entries (the teacher's distribution).

Both stages keep what they make in shards of the work folder, keyed by the
tokens it was made from: an interrupted run resumes where it stopped, and a
run over more prompts computes only the new ones. With a ``teacher``
(:class:`~eagle3.train.torch_target.TorchTarget`, the same GGUF's forward in
PyTorch) both stages run there instead, many sequences at a time (on a GPU).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from eagle3.errors import InvalidArgumentError
from eagle3.train.progress import Progress

if TYPE_CHECKING:  # (the engine is imported where it runs: Dataset and the stores need no extension)
    from eagle3.context import Context
    from eagle3.model import Model

SHARD_SEQUENCES = 32


@dataclass
class Dataset:
    """Training examples, concatenated: example i is ``tokens[offsets[i]:offsets[i+1]]``.
    (Features and logits may also be torch tensors already on the training device.)"""

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


def _key(tokens: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(tokens, np.int32).tobytes()).hexdigest()[:32]


class _Store:
    """Items (arrays of equal length each), keyed by a digest of the tokens that made
    them, in shards ``STEM-NNNNN.npz`` of a folder: a run that stops, or a later run
    over more or reordered prompts, reuses every item already made."""

    def __init__(self, folder: Path, stem: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.stem = folder, stem
        self.items: dict[str, dict[str, np.ndarray]] = {}
        self.n_shards = 0
        for path in sorted(folder.glob(f"{stem}-*.npz")):
            if not re.fullmatch(rf"{stem}-\d{{5}}\.npz", path.name):
                continue  # (an unfinished shard: written to a .partial file, renamed when whole)
            with np.load(path) as f:
                arrays = {name: f[name] for name in f.files}
            if "keys" not in arrays:
                raise InvalidArgumentError(f"{path} was written by an older eagle3; delete the work folder "
                                           f"{folder.parent} or use another")
            keys, offsets = arrays.pop("keys"), arrays.pop("offsets")
            for i, key in enumerate(keys):
                self.items[str(key)] = {name: a[offsets[i]:offsets[i + 1]] for name, a in arrays.items()}
            self.n_shards = max(self.n_shards, int(path.stem[len(stem) + 1:]) + 1)

    def __contains__(self, key: str) -> bool:
        return key in self.items

    def __getitem__(self, key: str) -> dict[str, np.ndarray]:
        return self.items[key]

    def add(self, keys: list[str], items: list[dict[str, np.ndarray]]) -> None:
        lengths = [len(next(iter(item.values()))) for item in items]
        arrays = {name: np.concatenate([item[name] for item in items]) for name in items[0]}
        path = self.folder / f"{self.stem}-{self.n_shards:05d}.npz"
        tmp = path.with_name(path.stem + ".partial.npz")
        np.savez(tmp, keys=np.array(keys), offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                 **arrays)
        tmp.replace(path)
        self.n_shards += 1
        self.items.update(zip(keys, items))


def answer(model: Model, prompts: list[np.ndarray], folder: Path, max_new_tokens: int, temperature: float,
           seed: int, n_seq: int, threads: int, progress: bool, budget: int | None = None,
           teacher=None) -> list[np.ndarray]:
    """Prompt + the target's answer for each prompt in order, until the answers
    hold ``budget`` tokens (None: every prompt); answers already in ``folder``
    are reused, new ones saved there ``SHARD_SEQUENCES`` (or ``n_seq``) at a time.
    ``teacher``: a :class:`~eagle3.train.torch_target.TorchTarget` that answers
    instead of the engine, ``n_seq`` prompts at a time."""
    store = _Store(folder, "answers")
    shard = max(SHARD_SEQUENCES, n_seq)
    stop = [t for t in range(model.n_vocab) if model.is_eog(t)] if teacher is not None else []
    keys = [_key(p) for p in prompts]
    longest = max(len(p) for p in prompts) + max_new_tokens + 1
    # counts what stops the run: answer tokens against the budget, or prompts
    bar = Progress("answers", len(prompts), progress) if budget is None else \
        Progress("answer tokens", budget, progress)

    def advance(n_prompts: int, n_tokens: int) -> None:
        bar.advance(n_prompts if budget is None else n_tokens)
    ctx = None

    def run(rows: list[int]) -> int:
        nonlocal ctx
        if ctx is None and teacher is None:
            from eagle3.context import Context
            ctx = Context(model, n_ctx=n_seq * longest, n_batch=max(512, longest), n_seq_max=n_seq,
                          n_threads=threads)
        seqs = []
        for i in range(0, len(rows), n_seq):
            batch = [prompts[j] for j in rows[i:i + n_seq]]
            # (sampled answers: the seed follows the batch's first prompt, not its place in the list)
            batch_seed = (seed + int(keys[rows[i]][:8], 16)) % 2**32
            if teacher is None:
                gens = [g.tokens for g in ctx.generate_batch(batch, max_new_tokens, temperature=temperature,
                                                             seed=batch_seed)]
            else:
                gens = teacher.generate(batch, max_new_tokens, stop, batch=n_seq, temperature=temperature,
                                        seed=batch_seed)
            seqs += [np.concatenate([p, g]).astype(np.int32) for p, g in zip(batch, gens)]
            advance(len(batch), sum(len(g) for g in gens))
        store.add([keys[j] for j in rows], [{"tokens": s} for s in seqs])
        return sum(len(s) - len(prompts[j]) for s, j in zip(seqs, rows))

    pending: list[int] = []
    answered = used = 0
    for j, key in enumerate(keys):
        if budget is not None and answered >= budget:
            break
        used = j + 1
        if key in store:
            n = len(store[key]["tokens"]) - len(prompts[j])
            answered += n
            advance(1, n)
        else:
            pending.append(j)
            if len(pending) == shard:
                answered += run(pending)
                pending = []
    if pending:
        run(pending)
    bar.done()
    if ctx is not None:
        ctx.close()
    out, answered = [], 0
    for j in range(used):  # the shortest prefix that fills the budget, whatever was cached
        out.append(store[keys[j]]["tokens"])
        answered += len(out[-1]) - len(prompts[j])
        if budget is not None and answered >= budget:
            break
    return out


def features(model: Model, sequences: list[np.ndarray], n_prompt: list[int], layers: Sequence[int], top_k: int,
             folder: Path, threads: int, progress: bool, teacher=None, shard: int = SHARD_SEQUENCES) -> Dataset:
    """Decode every sequence with ``layers`` captured; keep the features and the teacher's
    top-k. Sequences already in ``folder`` are reused, new ones saved there ``shard`` at a
    time. ``teacher``: a :class:`~eagle3.train.torch_target.TorchTarget` that computes them
    instead of the engine."""
    store = _Store(folder, "features")
    keys = [_key(s) for s in sequences]
    missing = [i for i in _first_of_each(keys) if keys[i] not in store]
    bar = Progress("features", len(sequences), progress)
    bar.advance(len(sequences) - len(missing))
    if missing and teacher is not None:
        for at in range(0, len(missing), shard):
            rows = missing[at:at + shard]
            store.add([keys[i] for i in rows], _torch_items(teacher, [sequences[i] for i in rows], layers, top_k))
            bar.advance(len(rows))
    elif missing:
        from eagle3.context import Context
        longest = max(len(sequences[i]) for i in missing)
        with Context(model, n_ctx=longest, n_batch=longest, n_ubatch=min(512, longest), n_seq_max=1,
                     n_threads=threads) as ctx:
            ctx.capture_layer_inputs(layers)
            for at in range(0, len(missing), shard):
                rows = missing[at:at + shard]
                items = []
                for i in rows:
                    items.append(_one(ctx, sequences[i], layers, top_k))
                    bar.advance(1)
                store.add([keys[i] for i in rows], items)
    bar.done()
    items = [store[key] for key in keys]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sequences])]).astype(np.int64)
    return Dataset(np.concatenate(sequences).astype(np.int32), offsets, np.asarray(n_prompt, np.int32),
                   np.concatenate([it["features"] for it in items]), np.concatenate([it["top_ids"] for it in items]),
                   np.concatenate([it["top_logits"] for it in items]).astype(np.float32))


def _first_of_each(keys: list[str]) -> list[int]:
    """Indices of each key's first occurrence (the same sequence twice is computed once)."""
    first: dict[str, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    return sorted(first.values())


def _torch_items(teacher, sequences: list[np.ndarray], layers: Sequence[int], top_k: int) -> list[dict]:
    """What :func:`_one` keeps of each sequence, computed by a TorchTarget for all of them at once."""
    feats, ids, top = (t.cpu().numpy() for t in teacher.features(sequences, tuple(layers), top_k))
    cut = np.cumsum([len(s) for s in sequences])[:-1]
    return [dict(features=f, top_ids=i, top_logits=v.astype(np.float16))
            for f, i, v in zip(np.split(feats, cut), np.split(ids, cut), np.split(top, cut))]


def _one(ctx: Context, tokens: np.ndarray, layers: Sequence[int], top_k: int) -> dict[str, np.ndarray]:
    import torch

    from eagle3._core import Batch

    ctx.clear()
    ctx.decode(Batch.from_tokens(tokens, output="all"))
    h = ctx.layer_inputs(layers)                        # [3, n, E]
    feats = np.ascontiguousarray(h.transpose(1, 0, 2).reshape(len(tokens), -1), dtype=np.float16)
    logits = np.stack([np.asarray(ctx.logits(i)) for i in range(len(tokens))])
    top, ids = torch.topk(torch.from_numpy(logits), top_k, dim=1)  # (a tenth of numpy's argpartition's time)
    return dict(features=feats, top_ids=ids.numpy().astype(np.int32), top_logits=top.numpy().astype(np.float16))


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
