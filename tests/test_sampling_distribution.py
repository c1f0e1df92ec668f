"""Match verification draws from the target's own distribution (a chi-square test).

Two arms with disjoint seeds: speculative sampling with verify="match" through an
EAGLE-3 session whose drafts are often accepted, and plain sampling of the target
with the same settings, over the same four prompts. The third generated
token depends on two earlier sampled tokens, so it covers accepted, partly
accepted and rejected drafts. The same samples with 2% of the probability
moved from the most frequent token to the next must be told apart: the test
has the power to see such a shift.
"""

from __future__ import annotations

import math

import numpy as np

import eagle3

N_SAMPLES = 16_000   # per arm
PER_CALL = 4         # sequences per generate_batch call
POSITION = 2         # the third generated token
SETTINGS = dict(temperature=1.0, top_k=20, top_p=0.99, min_p=0.001)  # every truncation on
PROMPTS = [[5, 6], [7, 8], [9, 1], [3, 3]]


def chi2_sf(x: float, dof: int) -> float:
    """Upper tail of the chi-square distribution (Wilson-Hilferty approximation)."""
    if dof <= 0:
        return 1.0
    z = ((x / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def homogeneity_p(a: np.ndarray, b: np.ndarray, bins: int = 10) -> float:
    """p-value that two samples of tokens come from one distribution. The ``bins``
    most frequent tokens of both samples together keep a cell each; the rest share one."""
    counts = np.bincount(np.concatenate([a, b]))
    kept = np.argsort(counts)[::-1][:bins]
    table = np.array([[np.sum(x == t) for t in kept] + [np.sum(~np.isin(x, kept))] for x in (a, b)], dtype=float)
    table = table[:, table.sum(0) > 0]
    expected = table.sum(0) * table.sum(1)[:, None] / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    return chi2_sf(stat, table.shape[1] - 1)


def sample(generate, first_seed: int) -> np.ndarray:
    out = []
    for call in range(N_SAMPLES // PER_CALL):
        batch = generate(PROMPTS, POSITION + 1, seed=first_seed + call * PER_CALL, **SETTINGS)
        out.extend(int(g.tokens[POSITION]) for g in batch)
    return np.array(out)


def test_speculative_sampling_matches_plain_sampling(models):
    target, draft = models["chain-soft"]
    with eagle3.Context(target, n_ctx=64, n_seq_max=PER_CALL) as tctx, \
            eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_seq=PER_CALL, n_draft_max=3) as session:
        speculative = sample(lambda *args, **kwargs: session.generate_batch(*args, verify="match", **kwargs),
                             first_seed=0)
        stats = session.generation_stats
        plain = sample(tctx.generate_batch, first_seed=10**9)
    # the drafts took part: many were accepted, many rejected
    assert 0.15 < stats.acceptance_rate < 0.85, stats.acceptance_rate
    assert len(np.unique(plain)) > 5  # a real distribution, not one token

    p_same = homogeneity_p(speculative, plain)
    assert p_same > 1e-3, f"speculative and plain sampling differ (p = {p_same:.2e})"

    # power: move 2% of the samples from the most frequent token to the second
    shifted = plain.copy()
    rng = np.random.default_rng(0)
    first, second = np.argsort(np.bincount(plain))[::-1][:2]
    shifted[rng.choice(np.flatnonzero(plain == first), int(0.02 * N_SAMPLES), replace=False)] = second
    p_shifted = homogeneity_p(speculative, shifted)
    assert p_shifted < 1e-3, f"a 2% shift went unnoticed (p = {p_shifted:.2e})"
