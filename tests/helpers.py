"""The seed's speculative loop and plain greedy decoding, through the public API."""

from __future__ import annotations

import numpy as np

import eagle3


def greedy(model: eagle3.Model, prompt, n_new: int, n_ctx: int = 512) -> list[int]:
    """Plain greedy decoding: ``n_new`` tokens after ``prompt``."""
    prompt = np.asarray(prompt, dtype=np.int32)
    with eagle3.Context(model, n_ctx=n_ctx) as ctx:
        ctx.decode(eagle3.Batch.from_tokens(prompt))
        out = [ctx.argmax(-1)]
        step = eagle3.Batch(1)
        while len(out) < n_new:
            step.clear()
            step.add(out[-1], len(prompt) + len(out) - 1, 0, True)
            ctx.decode(step)
            out.append(ctx.argmax(-1))
        return out


def speculative(session: eagle3.Eagle3Session, target: eagle3.Context, prompt, n_new: int,
                seq_id: int = 0) -> list[int]:
    """The seed's loop: decode, process, draft, verify, accept, trim. Greedy verification."""
    prompt = np.asarray(prompt, dtype=np.int32)
    batch = eagle3.Batch(max(len(prompt), session.n_draft_max + 1), n_seq_max=target.n_seq_max)
    batch.add_sequence(prompt, 0, seq_id)
    target.decode(batch)
    session.process(batch)
    session.begin(seq_id, prompt)
    n_past = len(prompt)
    id_last = target.argmax(-1)
    out: list[int] = []
    while len(out) < n_new:
        draft = session.draft(seq_id, n_past, id_last)
        batch.clear()
        batch.add(id_last, n_past, seq_id, True)
        for i, token in enumerate(draft):
            batch.add(int(token), n_past + 1 + i, seq_id, True)
        target.decode(batch)
        session.process(batch)
        accepted = []
        for i, token in enumerate(draft):
            best = target.argmax(i)
            accepted.append(best)
            if best != token:
                break
        else:
            accepted.append(target.argmax(len(draft)))
        session.accept(seq_id, len(accepted) - 1)
        out.append(id_last)
        out.extend(accepted[:-1])
        n_past += len(accepted)
        id_last = accepted[-1]
        target.seq_rm(seq_id, n_past)
    return out[:n_new]


def prompts(n_vocab: int, count: int = 20, seed: int = 0) -> list[np.ndarray]:
    """``count`` prompts of varied lengths (1 to 40 tokens)."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(1, 40, count).astype(int)
    return [rng.integers(0, n_vocab, int(k)).astype(np.int32) for k in lengths]
