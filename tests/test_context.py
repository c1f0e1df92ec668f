"""Contexts: decoding, logits views, KV cache."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import eagle3


def test_sizes_and_draft_defaults(tiny_models):
    target, draft = tiny_models
    with eagle3.Context(target, n_ctx=300, n_batch=64, n_seq_max=2) as tctx:
        assert tctx.n_ctx >= 300 and tctx.n_batch == 64 and tctx.n_seq_max == 2
        with eagle3.Context(draft, other=tctx) as dctx:
            assert (dctx.n_ctx, dctx.n_batch, dctx.n_seq_max) == (tctx.n_ctx, tctx.n_batch, tctx.n_seq_max)
            assert dctx.other is tctx and dctx.model is draft


@pytest.mark.parametrize("kwargs", [{"n_ctx": 0}, {"n_batch": -1}, {"n_seq_max": 0}, {"n_seq_max": 300},
                                    {"n_ubatch": 1024, "n_batch": 512}, {"ctx_type": "fast"}])
def test_bad_context_parameters(tiny_models, kwargs):
    with pytest.raises(ValueError):
        eagle3.Context(tiny_models[0], **kwargs)


def test_decode_and_logits_views(tiny_models):
    target, _ = tiny_models
    with eagle3.Context(target) as ctx:
        batch = eagle3.Batch.from_tokens([1, 2, 3, 4], output="all")
        ctx.decode(batch)
        row = ctx.logits(2)
        assert row.dtype == np.float32 and row.shape == (target.n_vocab,)
        assert not row.flags.writeable and not row.flags.owndata
        with pytest.raises(ValueError):
            row[0] = 1.0
        # a view of llama.cpp's buffer: the same row twice is the same memory
        assert np.shares_memory(row, ctx.logits(2))
        assert ctx.logits(-1).ctypes.data == ctx.logits(3).ctypes.data
        assert int(np.argmax(row)) == ctx.argmax(2)
        with pytest.raises(IndexError):
            ctx.logits(4)
        with pytest.raises(IndexError):
            ctx.logits(-5)


def test_logits_only_for_output_rows(tiny_models):
    target, _ = tiny_models
    with eagle3.Context(target) as ctx:
        with pytest.raises(eagle3.DecodeError):
            ctx.logits(0)  # nothing decoded
        ctx.decode(eagle3.Batch.from_tokens([1, 2, 3]))  # output only on the last
        with pytest.raises(IndexError, match="did not request logits"):
            ctx.logits(0)
        ctx.logits(2)


def test_a_logits_view_outlives_its_context(tiny_models):
    target, _ = tiny_models
    ctx = eagle3.Context(target)
    ctx.decode(eagle3.Batch.from_tokens([7, 8, 9]))
    view = ctx.logits(-1)
    expected = np.array(view)
    ctx.close()
    del ctx
    gc.collect()
    np.testing.assert_array_equal(view, expected)  # the memory is still alive


def test_views_block_a_decode_that_would_move_the_buffer(tiny_models):
    target, _ = tiny_models
    with eagle3.Context(target) as ctx:
        ctx.decode(eagle3.Batch.from_tokens([1]))
        view = ctx.logits(-1)
        more = eagle3.Batch.from_tokens(np.arange(2, 40), pos0=1, output="all")
        with pytest.raises(eagle3.DecodeError, match="views"):
            ctx.decode(more)
        del view
        ctx.decode(more)


@pytest.mark.parametrize("tokens, pos0, seq, match", [
    ([1, 2], 5, 0, "position"),
    ([1, 256], 0, 0, "vocabulary"),
])
def test_decode_errors(tiny_models, tokens, pos0, seq, match):
    with eagle3.Context(tiny_models[0]) as ctx:
        with pytest.raises(eagle3.DecodeError, match=match):
            ctx.decode(eagle3.Batch.from_tokens(tokens, pos0=pos0, seq_id=seq))


def test_decode_limits(tiny_models):
    with eagle3.Context(tiny_models[0], n_ctx=256, n_batch=16) as ctx:
        with pytest.raises(eagle3.DecodeError, match="n_batch"):
            ctx.decode(eagle3.Batch.from_tokens(np.zeros(17, np.int32)))
        with pytest.raises(eagle3.BadSeqIdError):
            ctx.decode(eagle3.Batch.from_tokens([1], seq_id=1))
        with pytest.raises(eagle3.DecodeError, match="empty"):
            ctx.decode(eagle3.Batch(4))


def test_kv_cache(tiny_models):
    with eagle3.Context(tiny_models[0]) as ctx:
        assert ctx.seq_pos_max(0) == -1
        ctx.decode(eagle3.Batch.from_tokens(np.arange(10)))
        assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0)) == (0, 9)
        assert ctx.seq_rm(0, 6)
        assert ctx.seq_pos_max(0) == 5
        ctx.decode(eagle3.Batch.from_tokens([1, 2], pos0=6))
        with pytest.raises(eagle3.BadSeqIdError):
            ctx.seq_rm(3, 0)
        ctx.clear()
        assert ctx.seq_pos_max(0) == -1


def test_a_draft_context_runs_on_its_targets_threads(tiny_models):
    target, draft = tiny_models
    with eagle3.Context(target, n_threads=1, n_threads_batch=2) as tctx:
        with eagle3.Context(draft, other=tctx) as dctx:
            assert (dctx.n_threads, dctx.n_threads_batch) == (1, 2)
        with eagle3.Context(draft, other=tctx, n_threads=2) as dctx:
            assert (dctx.n_threads, dctx.n_threads_batch) == (2, 2)
    with eagle3.Context(target) as ctx:
        assert ctx.n_threads == ctx.n_threads_batch == eagle3.context.default_threads()


def test_sizes_llama_cpp_changes_are_reported(tiny_models, caplog):
    target, _ = tiny_models
    with caplog.at_level("WARNING", logger="eagle3"):
        with eagle3.Context(target, n_ctx=8) as ctx:
            assert ctx.n_ctx > 8 and ctx.n_batch == 8
            ctx.decode(eagle3.Batch.from_tokens(list(range(8))))
    assert any("n_ctx" in r.getMessage() and "asked for 8" in r.getMessage() for r in caplog.records)
