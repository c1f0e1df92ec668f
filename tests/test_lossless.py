"""Greedy speculative decoding produces exactly the target's greedy tokens."""

from __future__ import annotations

import pytest

import eagle3
from helpers import greedy, prompts, speculative

N_NEW = 24


@pytest.fixture(scope="module")
def references(models):
    """Plain greedy continuations of every prompt, per pair."""
    return {name: [greedy(target, p, N_NEW) for p in prompts(target.n_vocab)]
            for name, (target, _) in models.items()}


@pytest.mark.parametrize("pair", ["random", "random-d2t", "random-own-embd", "chain", "chain-d2t"])
@pytest.mark.parametrize("n_draft_max", [1, 3, 8])
@pytest.mark.parametrize("p_min", [0.0, 0.5])
def test_speculative_equals_greedy(models, references, pair, n_draft_max, p_min):
    target, draft = models[pair]
    with eagle3.Context(target, n_ctx=512) as tctx, eagle3.Context(draft, other=tctx) as dctx:
        with eagle3.Eagle3Session(tctx, dctx, n_draft_max=n_draft_max, p_min=p_min) as session:
            for prompt, expected in zip(prompts(target.n_vocab), references[pair]):
                tctx.clear()
                dctx.clear()
                assert speculative(session, tctx, prompt, N_NEW) == expected
            stats = session.stats()
    assert stats["n_draft_calls"] > 0
    if pair.startswith("chain") and p_min == 0.0:
        # drafts are accepted, partly accepted and rejected: every path ran
        assert stats["mean_accepted_length"] > 1.5
        assert stats["accepted_per_position"][0] > stats["accepted_per_position"][-1] or n_draft_max == 1
        assert stats["n_accepted"] < stats["n_drafted"]
