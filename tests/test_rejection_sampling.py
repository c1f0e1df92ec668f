"""Rejection verification (speculative sampling) draws from the target's own distribution.

A pair whose target and draft distributions are both flat (so that drafts are often kept,
often rejected and resampled from the residual) samples the first generated tokens with
``verify="rejection"``, and the target alone samples them with the same settings and other
seeds; a chi-square test of homogeneity compares them at each position, for several
sampler settings, one sequence at a time and batched.
"""

from __future__ import annotations

import numpy as np
import pytest

import eagle3
from test_sampling_distribution import homogeneity_p

N_SAMPLES = 4000  # per arm
PER_CALL = 4
POSITIONS = (1, 2, 3)  # the first is sampled at the prompt, before any draft
PROMPTS = [[5, 6], [7, 8], [9, 1], [3, 3]]
SETTINGS = {
    "t1": dict(temperature=1.0),
    "t0.7-top_p": dict(temperature=0.7, top_p=0.9),
    "t1.5-top_k-min_p": dict(temperature=1.5, top_k=30, min_p=0.02),
}


@pytest.fixture(scope="module")
def soft(models):
    target, draft = models["chain-soft-q"]
    with eagle3.Context(target, n_ctx=64, n_seq_max=PER_CALL) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_seq=PER_CALL, n_draft_max=3) as session:
        yield tctx, session


def _samples(generate, batched: bool, first_seed: int, **kwargs) -> np.ndarray:
    """Tokens at POSITIONS of N_SAMPLES generations, as rows."""
    n = max(POSITIONS) + 1
    rows = []
    for call in range(N_SAMPLES // PER_CALL):
        seed = first_seed + call * PER_CALL
        if batched:
            gens = generate(PROMPTS, n, seed=seed, **kwargs)
        else:
            gens = [generate([PROMPTS[i]], n, seed=seed + i, **kwargs)[0] for i in range(PER_CALL)]
        rows.extend(g.tokens[list(POSITIONS)] for g in gens)
    return np.array(rows)


@pytest.mark.parametrize("name, batched", [(name, True) for name in SETTINGS] + [("t1", False)],
                         ids=[f"{name}-batched" for name in SETTINGS] + ["t1-one-sequence"])
def test_rejection_verification_samples_the_targets_distribution(soft, name, batched):
    tctx, session = soft
    settings = SETTINGS[name]
    session.generation_stats = type(session.generation_stats)()
    rejection = _samples(session.generate_batch, batched, 0, verify="rejection", **settings)
    stats = session.generation_stats
    plain = _samples(tctx.generate_batch, batched, 10**9, **settings)
    # the drafts took part: kept often, rejected (and resampled) often
    assert 0.2 < stats.acceptance_rate < 0.9, stats.acceptance_rate
    for i, position in enumerate(POSITIONS):
        assert len(np.unique(plain[:, i])) > 5
        p_same = homogeneity_p(rejection[:, i], plain[:, i])
        assert p_same > 1e-3, f"position {position}: rejection and plain sampling differ (p = {p_same:.2e})"


def test_the_comparison_would_see_a_small_bias(soft):
    """Power: the same samples with 3% of one position's tokens moved from the most frequent
    token to the next are told apart."""
    _, session = soft
    rejection = _samples(session.generate_batch, True, 0, verify="rejection", **SETTINGS["t1"])[:, 0]
    shifted = rejection.copy()
    first, second = np.argsort(np.bincount(rejection))[::-1][:2]
    moved = np.random.default_rng(0).choice(np.flatnonzero(rejection == first), int(0.03 * len(rejection)),
                                            replace=False)
    shifted[moved] = second
    assert homogeneity_p(rejection, shifted) < 1e-3


def test_rejection_verification_keeps_more_drafts_than_matching(soft):
    _, session = soft
    rates = {}
    for verify in ("match", "rejection"):
        session.generation_stats = type(session.generation_stats)()
        for seed in range(40):
            session.generate(PROMPTS[seed % 4], 24, temperature=1.0, seed=seed, verify=verify)
        rates[verify] = session.generation_stats.acceptance_rate
    assert rates["rejection"] > rates["match"] + 0.1, rates


def test_greedy_rejection_verification_is_greedy_decoding(models):
    target, draft = models["chain"]
    with eagle3.Context(target) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=4) as session:
        for prompt in PROMPTS:
            assert session.generate(prompt, 24, verify="rejection").tokens.tolist() == \
                tctx.generate(prompt, 24).tokens.tolist()


def test_verify_is_checked(soft):
    _, session = soft
    with pytest.raises(eagle3.InvalidArgumentError, match="verify"):
        session.generate([1, 2], 4, temperature=1.0, verify="exact")


def test_an_mtp_session_verifies_by_rejection_too(model_dir):
    from eagle3.testing import MtpSpec, write_mtp_target

    path = write_mtp_target(model_dir / "mtp-rejection.gguf", MtpSpec(weights="chain", noise=0.14))
    with eagle3.Model(path) as model, eagle3.Context(model) as tctx, \
            eagle3.Context(model, ctx_type="mtp") as mctx, eagle3.MtpSession(tctx, mctx, n_draft_max=3) as session:
        g = session.generate([5, 6, 7], 40, temperature=1.0, seed=1, verify="rejection", trace=True)
        drafted = g.trace["n_drafted"] > 0
        assert drafted.any() and np.all(g.trace["draft_p"][drafted, 0] > 0)
        assert session.generate([5, 6, 7], 30, verify="rejection").tokens.tolist() == \
            tctx.generate([5, 6, 7], 30).tokens.tolist()


def test_on_the_shipped_pair_rejection_keeps_more_drafts_at_temperature_one():
    from eagle3 import shipped

    t, d = shipped.toy_pair()
    taus = {}
    with eagle3.Model(t) as tm, eagle3.Model(d) as dm, eagle3.Context(tm) as tctx, \
            eagle3.Context(dm, other=tctx) as dctx, eagle3.Eagle3Session(tctx, dctx, n_draft_max=4) as session:
        for verify in ("match", "rejection"):
            session.generation_stats = type(session.generation_stats)()
            for prompt in shipped.toy_prompts()[:4]:
                for seed in range(2):
                    session.generate(prompt, 64, temperature=1.0, seed=seed, verify=verify)
            taus[verify] = session.generation_stats.mean_accepted_length
    assert taus["rejection"] > taus["match"] + 0.5, taus
