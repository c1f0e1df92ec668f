"""Drafts are written by C straight into NumPy memory; logits are views."""

from __future__ import annotations

import numpy as np
import pytest

import eagle3


def _ready(spec_setup):
    tctx, _, session = spec_setup
    batch = eagle3.Batch.from_tokens([3, 1, 4, 1, 5])
    tctx.decode(batch)
    session.process(batch)
    return tctx, session


def test_draft_fills_the_callers_array(spec_setup):
    tctx, session = _ready(spec_setup)
    out = np.full(session.n_draft_max, -1, dtype=np.int32)
    draft = session.draft(0, 5, tctx.argmax(-1), out=out)
    assert draft.ctypes.data == out.ctypes.data  # same buffer, no copy
    assert draft.base is out
    assert np.array_equal(out[:len(draft)], draft) and np.all(draft >= 0)


def test_draft_without_out_is_a_view_of_the_array_c_wrote(spec_setup):
    tctx, session = _ready(spec_setup)
    draft = session.draft(0, 5, tctx.argmax(-1))
    assert draft.base is not None and draft.base.shape == (session.n_draft_max,)
    assert draft.ctypes.data == draft.base.ctypes.data


@pytest.mark.parametrize("out", [np.zeros(4, np.int64), np.zeros(2, np.int32), np.zeros((4, 1), np.int32),
                                 np.zeros(8, np.int32)[::2], [0, 0, 0, 0]])
def test_draft_rejects_unusable_out(spec_setup, out):
    tctx, session = _ready(spec_setup)
    with pytest.raises((TypeError, ValueError)):
        session.draft(0, 5, tctx.argmax(-1), out=out)


def test_read_only_out_is_rejected(spec_setup):
    tctx, session = _ready(spec_setup)
    out = np.zeros(4, np.int32)
    out.flags.writeable = False
    with pytest.raises(TypeError):
        session.draft(0, 5, tctx.argmax(-1), out=out)


def test_logits_share_memory_with_the_context(tiny_models):
    target, _ = tiny_models
    with eagle3.Context(target) as ctx:
        ctx.decode(eagle3.Batch.from_tokens([1, 2, 3], output="all"))
        rows = [ctx.logits(i) for i in range(3)]
        # consecutive output rows are consecutive slices of one buffer
        strides = {rows[i + 1].ctypes.data - rows[i].ctypes.data for i in range(2)}
        assert strides == {4 * target.n_vocab}
        assert all(not r.flags.writeable and r.base is not None for r in rows)
        first = np.array(rows[0])
        ctx.decode(eagle3.Batch.from_tokens([9], pos0=3))
        # the view shows the buffer: the next decode writes into it
        assert rows[0].ctypes.data == ctx.logits(-1).ctypes.data
        assert not np.array_equal(rows[0], first)
