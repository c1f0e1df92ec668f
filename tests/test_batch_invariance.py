"""Why speculation is exactly lossless here: a target pass over several tokens
gives each token the logits that decoding it alone would, bit for bit. Without
that, a draft's verification can round a near-tie the other way and greedy
speculative output drifts from plain greedy output (llama.cpp's llamafile
kernels and its CPU flash attention past 512 cached tokens, both off here,
do exactly that)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import eagle3
from eagle3.testing import DraftSpec, TargetSpec, write_pair, write_target


@pytest.mark.parametrize("cached", [0, 700])  # 512+ cached tokens: where flash attention would split
@pytest.mark.parametrize("spec", [
    TargetSpec(n_layer=7, n_embd=32, n_head=4, n_head_kv=4, n_ff=64, n_vocab=200, seed=0),
    TargetSpec(n_layer=3, n_embd=96, n_head=6, n_head_kv=2, n_ff=160, n_vocab=300, weights="chain", seed=5),
])
def test_a_pass_over_k_tokens_matches_k_one_token_passes(tmp_path, spec, cached):
    path = write_target(tmp_path / "t.gguf", spec)
    rng = np.random.default_rng(cached)
    prefix = rng.integers(3, spec.n_vocab, cached).astype(np.int32)
    tokens = rng.integers(3, spec.n_vocab, 12).astype(np.int32)
    with eagle3.Model(path) as model, eagle3.Context(model, n_ctx=1024, n_batch=1024) as together, \
            eagle3.Context(model, n_ctx=1024, n_batch=1024) as alone:
        if cached:
            together.decode(eagle3.Batch.from_tokens(prefix))
            alone.decode(eagle3.Batch.from_tokens(prefix))
        together.decode(eagle3.Batch.from_tokens(tokens, pos0=cached, output="all"))
        for i in range(len(tokens)):
            alone.decode(eagle3.Batch.from_tokens(tokens[i:i + 1], pos0=cached + i))
            np.testing.assert_array_equal(together.logits(i), alone.logits(0))


def test_flash_attn_is_a_bool(tiny_models):
    target, _ = tiny_models
    with pytest.raises(eagle3.ArgumentTypeError):
        eagle3.Context(target, flash_attn="yes")
    with eagle3.Context(target, flash_attn=True) as ctx:  # opting in still decodes
        ctx.decode(eagle3.Batch.from_tokens([5, 6, 7]))
        logits = ctx.logits(-1)
        assert logits.shape == (target.n_vocab,) and np.isfinite(logits).all()


def _random_pair(rng: random.Random, directory, case: int):
    n_layer = rng.choice([2, 3, 5, 7])
    n_head = rng.choice([2, 4, 8])
    n_head_kv = rng.choice([h for h in (1, 2, n_head) if n_head % h == 0])
    target = TargetSpec(n_layer=n_layer, n_embd=n_head * rng.choice([8, 16]), n_head=n_head, n_head_kv=n_head_kv,
                        n_ff=rng.choice([64, 96, 200]), n_vocab=rng.choice([200, 256, 700]), seed=case)
    own = rng.random() < 0.3
    draft_heads = rng.choice([2, 4])
    draft = DraftSpec(n_head=draft_heads, n_head_kv=rng.choice([1, draft_heads]), n_ff=rng.choice([64, 128]),
                      d2t=rng.choice([None, 100, 150]), own_embeddings=own, n_embd=32 if own else None,
                      target_layers=tuple(sorted(rng.sample(range(n_layer), 3))) if n_layer >= 3 else None,
                      seed=case + 100)
    return write_pair(directory, target, draft, name=f"shape{case}")


@pytest.mark.parametrize("case", range(6))
def test_random_shapes_generate_exactly_the_plain_tokens(tmp_path, case):
    rng = random.Random(1000 + case)
    target_path, draft_path = _random_pair(rng, tmp_path, case)
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
            eagle3.Context(tm, n_ctx=512, n_seq_max=3) as target, eagle3.Context(dm, other=target) as draft, \
            eagle3.Context(tm, n_ctx=512, n_seq_max=3) as plain:
        prompts = [np.array([rng.randrange(3, tm.n_vocab) for _ in range(rng.randrange(1, 20))], np.int32)
                   for _ in range(3)]
        expected = [plain.generate(p, 40).tokens.tolist() for p in prompts]
        for n_draft_max in (1, 3, 8):
            with eagle3.Eagle3Session(target, draft, n_seq=3, n_draft_max=n_draft_max) as session:
                assert [session.generate(p, 40).tokens.tolist() for p in prompts] == expected
                assert [g.tokens.tolist() for g in session.generate_batch(prompts, 40)] == expected
