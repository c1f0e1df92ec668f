"""Fit the head to the teacher with a training-time test (PyTorch).

Each step takes whole examples up to ``batch_tokens`` tokens, runs the head
``ttt_steps`` draft steps deep from every position at once
(:meth:`Eagle3Draft.forward_ttt`: later steps read the head's own hidden
states, as drafting does) and minimises, per step, the cross-entropy from the
target's distribution restricted to the draft vocabulary (from its top-k
logits), on the positions whose next token is part of an answer. Step j's
loss weighs ``step_decay ** j``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from eagle3.train.data import Dataset
from eagle3.train.head import Eagle3Draft


def draft_vocabulary(data: Dataset, n_vocab: int, size: int, keep: list[int]) -> np.ndarray:
    """The ``size`` target tokens the teacher most often ranks first (then the most
    frequent tokens of the text), with ``keep`` (end-of-generation tokens) always in."""
    size = min(size, n_vocab)
    score = np.bincount(data.top_ids[:, 0], minlength=n_vocab).astype(np.float64)
    score += 1e-3 * np.bincount(data.tokens, minlength=n_vocab)
    score[keep] = np.inf
    chosen = np.argsort(-score, kind="stable")[:size]
    return np.sort(chosen).astype(np.int64)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


@dataclass
class Examples:
    features: torch.Tensor   # [B, L, 3E]
    tokens: torch.Tensor     # [B, L + steps] (padded with 0)
    top_ids: torch.Tensor    # [B, L + steps, k] draft ids, -1 outside the draft vocabulary
    top_logits: torch.Tensor  # [B, L + steps, k]
    valid: torch.Tensor      # [B, steps, L - 1]: position p at step j is trained on


class Trainer:
    def __init__(self, head: Eagle3Draft, embeddings: torch.Tensor, data: Dataset, ttt_steps: int,
                 batch_tokens: int, step_decay: float, device: torch.device) -> None:
        self.head, self.emb, self.data = head, embeddings, data
        self.steps, self.batch_tokens, self.device = ttt_steps, batch_tokens, device
        self.weights = [step_decay ** j for j in range(ttt_steps)]
        t2d = np.full(embeddings.shape[0], -1, np.int64)
        t2d[head.d2t.cpu().numpy()] = np.arange(len(head.d2t))
        self.t2d = t2d

    def sample(self, rng: np.random.Generator, examples: np.ndarray | None = None) -> Examples:
        """Random whole examples up to ``batch_tokens`` tokens (or the given ones)."""
        d = self.data
        lengths = np.diff(d.offsets)
        if examples is None:
            order = rng.permutation(len(d))
            total = np.cumsum(lengths[order])
            examples = order[:max(1, int(np.searchsorted(total, self.batch_tokens)))]
        L, k, s = int(lengths[examples].max()), d.top_ids.shape[1], self.steps
        feats = np.zeros((len(examples), L, d.features.shape[1]), np.float32)
        tokens = np.zeros((len(examples), L + s), np.int64)
        top_ids = np.full((len(examples), L + s, k), -1, np.int64)
        top_logits = np.zeros((len(examples), L + s, k), np.float32)
        valid = np.zeros((len(examples), s, L - 1), bool)
        for b, i in enumerate(examples):
            lo, n = d.offsets[i], lengths[i]
            feats[b, :n] = d.features[lo:lo + n]
            tokens[b, :n] = d.tokens[lo:lo + n]
            top_ids[b, :n] = self.t2d[d.top_ids[lo:lo + n]]
            top_logits[b, :n] = d.top_logits[lo:lo + n]
            p = np.arange(L - 1)
            for j in range(s):
                q = p + 1 + j  # the teacher row step j predicts from
                valid[b, j] = (q < n) & (q >= d.n_prompt[i] - 1)
        # a row whose teacher has no token in the draft vocabulary teaches nothing
        has_target = (top_ids >= 0).any(-1)
        for j in range(s):
            valid[:, j] &= has_target[:, 1 + j:L + j]
        t = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        return Examples(t(feats), t(tokens), t(top_ids), t(top_logits), t(valid))

    def losses(self, batch: Examples) -> tuple[list[torch.Tensor], list[float]]:
        """Per-step losses and the share of positions where the head's first choice is the teacher's."""
        n = batch.features.shape[1] - 1
        s = self.steps
        tokens = torch.stack([batch.tokens[:, 1 + j:1 + j + n] for j in range(s)], 1)
        logits = self.head.forward_ttt(self.emb[tokens], batch.features[:, :n], s)
        losses, agree = [], []
        for j, step_logits in enumerate(logits):
            ids = batch.top_ids[:, 1 + j:1 + j + n]
            teacher = torch.softmax(batch.top_logits[:, 1 + j:1 + j + n].masked_fill(ids < 0, -math.inf), -1)
            teacher = torch.nan_to_num(teacher)
            logp = torch.log_softmax(step_logits.float(), -1).gather(-1, ids.clamp(min=0))
            per_row = -(teacher * logp).sum(-1)
            mask = batch.valid[:, j].float()
            count = mask.sum().clamp(min=1)
            losses.append((per_row * mask).sum() / count)
            first = step_logits.argmax(-1) == ids[..., 0]
            agree.append(float((first.float() * mask).sum() / count))
        return losses, agree

    def loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        return sum(w * l for w, l in zip(self.weights, losses)) / sum(self.weights)
