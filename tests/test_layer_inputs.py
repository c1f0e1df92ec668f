"""Context.capture_layer_inputs / layer_inputs: the hidden states an EAGLE-3 head reads."""

from __future__ import annotations

import numpy as np
import pytest

import eagle3
from conftest import expect_exception
from eagle3.testing import TargetSpec, write_target
from eagle3.train.export import target_matrix

SHAPES = [TargetSpec(), TargetSpec(n_layer=5, n_embd=48, n_head=6, n_head_kv=3, n_ff=96, seed=3)]


@pytest.fixture(scope="module", params=range(len(SHAPES)), ids=["64x4", "48x5"])
def target(request, tmp_path_factory):
    spec = SHAPES[request.param]
    return write_target(tmp_path_factory.mktemp("li") / "t.gguf", spec), spec


def _prompt(n, vocab, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int32)


def test_layer_zero_is_the_token_embeddings(target):
    path, spec = target
    tokens = _prompt(23, spec.n_vocab)
    with eagle3.Model(path) as m, eagle3.Context(m, n_ctx=64) as ctx:
        ctx.capture_layer_inputs([0])
        ctx.decode(eagle3.Batch.from_tokens(tokens, output="last"))
        h = ctx.layer_inputs([0])
    assert h.shape == (1, len(tokens), spec.n_embd) and h.dtype == np.float32
    np.testing.assert_array_equal(h[0], target_matrix(path, ("token_embd.weight",))[tokens])


def test_rows_do_not_depend_on_how_the_tokens_were_batched(target):
    path, spec = target
    tokens = _prompt(19, spec.n_vocab, seed=1)
    layers = [1, spec.n_layer // 2, spec.n_layer - 1]
    with eagle3.Model(path) as m, eagle3.Context(m, n_ctx=64) as ctx:
        ctx.capture_layer_inputs(layers)
        ctx.decode(eagle3.Batch.from_tokens(tokens, output="all"))
        whole = ctx.layer_inputs(layers)
        ctx.clear()
        rows = []
        start = 0
        for stop in (7, 8, 19):  # uneven pieces, each continuing the cache
            ctx.decode(eagle3.Batch.from_tokens(tokens[start:stop], pos0=start, output="last"))
            rows.append(ctx.layer_inputs(layers))
            start = stop
    assert whole.shape == (3, len(tokens), spec.n_embd)
    np.testing.assert_array_equal(np.concatenate(rows, axis=1), whole)
    # the layers differ from each other (each row is its own layer's input)
    assert not np.array_equal(whole[0], whole[1]) and not np.array_equal(whole[1], whole[2])


def test_capture_is_checked_before_llama_cpp_sees_it(target):
    path, spec = target
    with eagle3.Model(path) as m, eagle3.Context(m, n_ctx=64, n_seq_max=2) as ctx:
        for bad in ([spec.n_layer], [-1], [0, 10_000]):
            with pytest.raises(eagle3.InvalidArgumentError, match="not a layer"):
                ctx.capture_layer_inputs(bad)
        with pytest.raises(eagle3.InvalidArgumentError):
            ctx.capture_layer_inputs([])
        with pytest.raises(eagle3.ArgumentTypeError):
            ctx.capture_layer_inputs("12")
        with pytest.raises(eagle3.ArgumentTypeError):
            ctx.capture_layer_inputs([1.5])
        with pytest.raises(eagle3.DecodeError, match="nothing was decoded"):
            ctx.layer_inputs([0])
        ctx.decode(eagle3.Batch.from_tokens(_prompt(5, spec.n_vocab)))
        with pytest.raises(eagle3.InvalidArgumentError, match="not captured"):
            ctx.layer_inputs([0])  # capture starts at the next decode
        ctx.capture_layer_inputs([0, 1])
        with pytest.raises(eagle3.InvalidArgumentError, match="not captured"):
            ctx.layer_inputs([0])
        # two sequences in one batch: llama.cpp orders their tokens its own way
        b = eagle3.Batch(8, n_seq_max=2)
        b.add_sequence(_prompt(3, spec.n_vocab), pos0=0, seq_id=1)
        b.add_sequence(_prompt(3, spec.n_vocab, 2), pos0=5, seq_id=0)
        ctx.decode(b)
        with pytest.raises(eagle3.InvalidArgumentError, match="one sequence"):
            ctx.layer_inputs([0])
        ctx.decode(eagle3.Batch.from_tokens(_prompt(2, spec.n_vocab), pos0=3, seq_id=1))
        assert ctx.layer_inputs([1, 0]).shape == (2, 2, spec.n_embd)


def test_a_capture_that_moves_the_output_buffer_waits_for_logits_views(target):
    path, spec = target
    with eagle3.Model(path) as m, eagle3.Context(m, n_ctx=64) as ctx:
        ctx.decode(eagle3.Batch.from_tokens(_prompt(4, spec.n_vocab)))
        view = ctx.logits()
        before = np.array(view)
        ctx.capture_layer_inputs([0, 1, 2])
        with pytest.raises(eagle3.DecodeError, match="views"):
            ctx.decode(eagle3.Batch.from_tokens(_prompt(4, spec.n_vocab), pos0=4))
        np.testing.assert_array_equal(view, before)
        del view
        ctx.decode(eagle3.Batch.from_tokens(_prompt(4, spec.n_vocab), pos0=4))
        assert ctx.layer_inputs([2]).shape == (1, 4, spec.n_embd)


def test_architectures_without_recorded_layer_inputs_are_refused(pair_paths):
    # an EAGLE-3 draft model's graph records no layer inputs: llama.cpp would abort at its first decode
    target, draft = pair_paths["random-own-embd"]
    out = expect_exception(f"""
        m = eagle3.Model({str(draft)!r})
        ctx = eagle3.Context(m, n_ctx=64)
        ctx.capture_layer_inputs([0])
    """, "InvalidArgumentError")
    assert "does not record" in out


def test_a_session_context_keeps_its_layers_when_the_user_captures_more(models):
    # capture only adds layers: an EAGLE-3 session that reads others keeps working
    tm, dm = models["chain"]
    with eagle3.Context(tm, n_ctx=128) as tctx, eagle3.Context(dm, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=4) as s:
        before = s.generate(np.arange(1, 9, dtype=np.int32), 24).tokens
        tctx.capture_layer_inputs([0])
        after = s.generate(np.arange(1, 9, dtype=np.int32), 24).tokens
        np.testing.assert_array_equal(before, after)
        with pytest.raises(eagle3.DecodeError, match="nothing was decoded"):
            tctx.layer_inputs([0])  # the session's passes are not the user's decode


def test_qwen2_targets_record_their_layer_inputs(pair_paths, tmp_path):
    # the pinned qwen2 graph records them through eagle3's patch (qwen2-layer-inputs)
    from gguf_edit import as_qwen2

    target, draft = pair_paths["random"]
    qwen2 = as_qwen2(target, tmp_path / "qwen2.gguf")
    tokens = _prompt(12, 256)
    with eagle3.Model(qwen2) as m, eagle3.Context(m, n_ctx=64) as ctx:
        assert m.architecture == "qwen2"
        ctx.capture_layer_inputs([0, 2, 3])
        ctx.decode(eagle3.Batch.from_tokens(tokens))
        h = ctx.layer_inputs([0, 2, 3])
        np.testing.assert_array_equal(h[0], target_matrix(qwen2, ("token_embd.weight",))[tokens])
        assert np.isfinite(h).all() and not np.array_equal(h[1], h[2])
    # and an EAGLE-3 session over it drafts from them; greedy output is the target's own
    assert eagle3.check_pair(qwen2, draft).ok
    with eagle3.Model(qwen2) as tm, eagle3.Model(draft) as dm, eagle3.Context(tm, n_ctx=128) as tctx, \
            eagle3.Context(dm, other=tctx) as dctx, eagle3.Eagle3Session(tctx, dctx, n_draft_max=3) as s:
        spec = s.generate(tokens, 24)
        plain = tctx.generate(tokens, 24)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    assert spec.stats.n_drafted > 0
