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
from eagle3.train.head import DraftConfig, Eagle3Draft


def draft_vocabulary(data: Dataset, n_vocab: int, size: int, keep: list[int]) -> np.ndarray:
    """The ``size`` target tokens the teacher most often ranks first (then the most
    frequent tokens of the text), with ``keep`` (end-of-generation tokens) always in."""
    size = min(size, n_vocab)
    score = np.bincount(data.top_ids[:, 0], minlength=n_vocab).astype(np.float64)
    score += 1e-3 * np.bincount(data.tokens, minlength=n_vocab)
    score[keep] = np.inf
    chosen = np.argsort(-score, kind="stable")[:size]
    return np.sort(chosen).astype(np.int64)


def new_head(cfg: DraftConfig, d2t: np.ndarray, output_rows, output_norm=None) -> Eagle3Draft:
    """A head to train: small random matrices, and the target's own output head (rows
    ``d2t`` of ``output_rows``: its embeddings when tied) and final norm to start from."""
    head = Eagle3Draft(cfg, torch.as_tensor(d2t))
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        head.lm_head.weight.copy_(torch.as_tensor(output_rows)[torch.as_tensor(d2t)].cpu())
        if output_norm is not None and tuple(output_norm.shape) == (cfg.hidden_size,):
            head.norm.weight.copy_(torch.as_tensor(output_norm).cpu())
    return head


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
    """Batches of whole examples and the head's losses on them. The data's
    arrays (numpy or torch) are moved to ``device`` once: a batch is gathered there."""

    def __init__(self, head: Eagle3Draft, embeddings: torch.Tensor, data: Dataset, ttt_steps: int,
                 batch_tokens: int, step_decay: float, device: torch.device) -> None:
        self.head, self.emb = head, embeddings
        self.steps, self.batch_tokens, self.device = ttt_steps, batch_tokens, device
        self.weights = [step_decay ** j for j in range(ttt_steps)]
        on = lambda a: torch.as_tensor(a, device=device)  # noqa: E731
        t2d = torch.full((embeddings.shape[0],), -1, dtype=torch.long, device=device)
        t2d[head.d2t.to(device)] = torch.arange(len(head.d2t), device=device)
        self.offsets = np.asarray(data.offsets, np.int64)
        self.lengths = np.diff(self.offsets)
        self.n_prompt = np.asarray(data.n_prompt, np.int64)
        self.features, self.tokens = on(data.features), on(data.tokens).long()
        self.top_ids, self.top_logits = t2d[on(data.top_ids).long()], on(data.top_logits)

    def __len__(self) -> int:
        return len(self.lengths)

    def sample(self, rng: np.random.Generator | None, examples: np.ndarray | None = None) -> Examples:
        """Random whole examples up to ``batch_tokens`` tokens (or the given ones)."""
        lengths = self.lengths
        if examples is None:
            order = rng.permutation(len(lengths))
            total = np.cumsum(lengths[order])
            examples = order[:max(1, int(np.searchsorted(total, self.batch_tokens)))]
        n, s = lengths[examples], self.steps
        L = int(n.max())
        at = np.arange(L + s)
        inside = at[None] < n[:, None]                                    # [B, L + s]
        rows = torch.as_tensor(np.where(inside, self.offsets[examples][:, None] + at[None], 0), device=self.device)
        inside_t = torch.as_tensor(inside, device=self.device)
        feats = self.features[rows[:, :L]].float() * inside_t[:, :L, None]
        tokens = torch.where(inside_t, self.tokens[rows], 0)
        top_ids = torch.where(inside_t[..., None], self.top_ids[rows], -1)
        top_logits = torch.where(inside_t[..., None], self.top_logits[rows].float(), 0.0)
        # step j from position p predicts from the teacher row q = p + 1 + j: inside an
        # answer, and with a token in the draft vocabulary (else it teaches nothing)
        q = at[None, None, :L - 1] + 1 + np.arange(s)[None, :, None]        # [1, s, L - 1]
        valid = (q < n[:, None, None]) & (q >= self.n_prompt[examples][:, None, None] - 1)
        has_target = (top_ids >= 0).any(-1)                                # [B, L + s]
        q_t = torch.as_tensor(np.broadcast_to(q, valid.shape).copy(), device=self.device)
        valid_t = torch.as_tensor(valid, device=self.device) & has_target.gather(1, q_t.flatten(1)).view(q_t.shape)
        return Examples(feats, tokens, top_ids, top_logits, valid_t)

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

    @torch.no_grad()
    def held_out(self) -> tuple[list[float], list[float]]:
        """Per draft step, the loss and the agreement, averaged over the examples taken one at a time."""
        parts = [self.losses(self.sample(None, np.array([i]))) for i in range(len(self))]
        return (np.mean([[float(x) for x in p[0]] for p in parts], 0).tolist(),
                np.mean([p[1] for p in parts], 0).tolist())

    def step(self, opt: torch.optim.Optimizer, rng: np.random.Generator, lr: float) -> tuple[float, list[float]]:
        """One update on a random batch at learning rate ``lr``: the loss and the per-step agreement."""
        for group in opt.param_groups:
            group["lr"] = lr
        losses, agree = self.losses(self.sample(rng))
        loss = self.loss(losses)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        opt.step()
        return float(loss.detach()), agree
