"""Why speculation is exactly lossless here: a target pass over several tokens
gives each token the logits that decoding it alone would, bit for bit. Without
that, a draft's verification can round a near-tie the other way and greedy
speculative output drifts from plain greedy output. Stock ggml picks its
kernels by pass size (llamafile's tinyBLAS for 2+ tokens, repacked gemm for
4+, tiled K-quant kernels for 8+, flash attention's split and tiled paths);
eagle3's build patches ggml so that a weight type takes one kernel family at
every size, and this checks it for every weight type a user can load."""

from __future__ import annotations

import random

import numpy as np
import pytest

import eagle3
from eagle3 import _build_config
from eagle3.testing import DraftSpec, TargetSpec, write_pair, write_target

exact = pytest.mark.skipif(not _build_config.BATCH_INVARIANT,
                           reason="built without eagle3's batch-invariant ggml patches")

# Wide enough for K-quants (rows of 256) and ggml's repacked layouts (8 | rows).
WIDE = TargetSpec(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=512, seed=21)
# every type a user can load, pure (each matrix in that type), and the mixes people run
WEIGHT_TYPES = [("F32", True), ("F16", True), ("BF16", True), ("Q8_0", True), ("Q4_0", True), ("Q4_1", True),
                ("Q5_0", True), ("Q5_1", True), ("Q2_K", True), ("Q3_K_M", True), ("Q4_K_M", True),
                ("Q5_K_M", True), ("Q6_K", True), ("IQ4_NL", True), ("IQ4_XS", True),
                ("Q4_K_M", False), ("Q5_K_M", False), ("Q3_K_M", False)]
PASS_SIZES = [*range(1, 33), 48, 64]


@pytest.fixture(scope="module")
def wide_f32(tmp_path_factory):
    return write_target(tmp_path_factory.mktemp("wide") / "wide-f32.gguf", WIDE)


def _quantized(wide_f32, file_type: str, pure: bool):
    if file_type == "F32":
        return wide_f32
    path = wide_f32.with_name(f"wide-{file_type}{'-pure' if pure else ''}.gguf")
    if not path.exists():
        eagle3.quantize(wide_f32, path, file_type, pure=pure)
    return path


@exact
@pytest.mark.parametrize("n_threads, flash_attn", [(1, False), (2, True)])
@pytest.mark.parametrize("file_type, pure", WEIGHT_TYPES, ids=[f"{t}{'-pure' if p else ''}" for t, p in WEIGHT_TYPES])
def test_every_weight_type_gives_a_token_its_one_token_logits_in_passes_of_any_size(
        wide_f32, file_type, pure, n_threads, flash_attn):
    path = _quantized(wide_f32, file_type, pure)
    rng = np.random.default_rng(len(file_type) + n_threads)
    tokens = rng.integers(3, WIDE.n_vocab, sum(PASS_SIZES)).astype(np.int32)
    prefix = rng.integers(3, WIDE.n_vocab, 600).astype(np.int32)
    with eagle3.Model(path) as model:
        if file_type != "F32":
            assert {t.type for t in model.tensors.values()} != {"f32"}
        kw = dict(n_ctx=2048, n_batch=1024, n_threads=n_threads, flash_attn=flash_attn)
        with eagle3.Context(model, **kw) as together, eagle3.Context(model, **kw) as alone:
            # cache lengths 0..1000 and 600..1600: past the 512 where flash attention would split the cache
            for pos0, sizes in ((0, PASS_SIZES), (len(prefix), PASS_SIZES[::-1])):
                if pos0:
                    together.clear()
                    alone.clear()
                    together.decode(eagle3.Batch.from_tokens(prefix))
                    alone.decode(eagle3.Batch.from_tokens(prefix))
                at = 0
                for k in sizes:
                    together.decode(eagle3.Batch.from_tokens(tokens[at:at + k], pos0=pos0 + at, output="all"))
                    for i in range(k):
                        alone.decode(eagle3.Batch.from_tokens(tokens[at + i:at + i + 1], pos0=pos0 + at + i))
                        np.testing.assert_array_equal(
                            together.logits(i), alone.logits(0),
                            err_msg=f"{file_type}: token {i} of a {k}-token pass at cache length {pos0 + at}")
                    at += k


@exact
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
    with eagle3.Context(target, flash_attn=False) as ctx:  # opting out still decodes
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


@exact
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


# Wide pairs: a random target, whose top two logits are often close (stock
# kernels flip some of its greedy choices under speculation), and a chain
# target whose drafts are mostly accepted.
WIDE_PAIRS = {
    "random": (TargetSpec(n_layer=3, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=512, seed=23),
               DraftSpec(n_head=4, n_head_kv=2, seed=24)),
    "chain": (TargetSpec(n_layer=3, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=512, weights="chain",
                         seed=25),
              DraftSpec(weights="aligned", agreement=0.8, n_head=4, n_head_kv=4, seed=26)),
}


@pytest.fixture(scope="module")
def wide_pairs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("wide-pairs")
    return {name: write_pair(directory, t, d, name=name) for name, (t, d) in WIDE_PAIRS.items()}


@exact
@pytest.mark.parametrize("weights", ["random", "chain"])
@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS", "Q2_K", "Q4_0", "Q8_0", "F16"])
def test_quantized_targets_generate_exactly_their_plain_greedy_tokens(wide_pairs, file_type, weights):
    from helpers import speculative

    f32_path, draft_path = wide_pairs[weights]
    path = f32_path.with_name(f"{weights}-{file_type}.gguf")
    if not path.exists():
        eagle3.quantize(f32_path, path, file_type)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 512, n).astype(np.int32) for n in (1, 5, 17, 40)]
    with eagle3.Model(path) as tm, eagle3.Model(draft_path) as dm, \
            eagle3.Context(tm, n_ctx=1024, n_seq_max=4) as target, eagle3.Context(dm, other=target) as draft, \
            eagle3.Context(tm, n_ctx=1024, n_seq_max=4) as plain:
        expected = [plain.generate(p, 96).tokens.tolist() for p in prompts]
        for n_draft_max in (2, 8, 16):
            with eagle3.Eagle3Session(target, draft, n_seq=4, n_draft_max=n_draft_max) as session:
                assert [session.generate(p, 96).tokens.tolist() for p in prompts] == expected
                assert [g.tokens.tolist() for g in session.generate_batch(prompts, 96)] == expected
                if n_draft_max == 8:  # the seed's loop in Python
                    for p, want in zip(prompts, expected):
                        target.clear()
                        draft.clear()
                        assert speculative(session, target, p, 96) == want
                if weights == "chain":  # drafts were accepted: verified in passes of many tokens
                    assert session.generation_stats.mean_accepted_length > 1.5
