"""One set of counters: per sequence and per call, the same definitions everywhere, errors that keep reasons."""

from __future__ import annotations

import math

import numpy as np
import pytest

import eagle3
from eagle3 import stats


def test_each_sequence_of_a_batch_has_its_own_counters(chain_session):
    batch = chain_session.generate_batch([[5, 6, 7], [1, 2], list(range(40, 50))], 30)
    per_seq = [g.stats for g in batch]
    total = batch.stats
    for g, st in zip(batch, per_seq):
        assert st.n_generated == len(g.tokens)
        assert st.n_rounds == st.n_seq_rounds  # a sequence takes part in a round once
        assert st.n_accepted == st.accepted_per_position.sum()
        assert st.draft_lengths.sum() == st.n_seq_rounds
        assert 0 < st.t_total_s <= total.t_total_s
    assert [st.n_prompt for st in per_seq] == [3, 2, 10]
    for name in ("n_prompt", "n_generated", "n_seq_rounds", "n_draft_calls", "n_drafted", "n_accepted"):
        assert getattr(total, name) == sum(getattr(st, name) for st in per_seq), name
    assert np.array_equal(total.accepted_per_position, sum(st.accepted_per_position for st in per_seq))
    # the passes are shared: the call counts each once
    assert max(st.n_rounds for st in per_seq) == total.n_rounds < total.n_seq_rounds
    assert chain_session.generation_stats.n_generated == total.n_generated


def test_the_derived_figures_have_one_definition(chain_session):
    g = chain_session.generate([3, 1, 4], 50, n_draft_max=4)
    st = g.stats
    assert st.acceptance_rate == pytest.approx(st.n_accepted / st.n_drafted)
    assert st.mean_accepted_length == pytest.approx(1 + st.n_accepted / st.n_seq_rounds)
    reached = [st.draft_lengths[k + 1:].sum() for k in range(len(st.accepted_per_position))]
    expect = [a / r if r else 0.0 for a, r in zip(st.accepted_per_position, reached)]
    assert np.allclose(st.acceptance_per_position, expect)
    assert np.all((0 <= st.acceptance_per_position) & (st.acceptance_per_position <= 1))

    # the session counts its own accept() calls the same way
    s = chain_session.stats()
    assert s["n_accept_calls"] == s["n_seq_rounds"] > 0
    assert s["mean_accepted_length"] == pytest.approx(stats.mean_accepted_length(s["n_accepted"], s["n_seq_rounds"]))
    assert s["acceptance_rate"] == pytest.approx(s["n_accepted"] / s["n_drafted"])
    assert s["n_accepted"] == st.n_accepted and s["n_drafted"] == st.n_drafted
    assert np.array_equal(s["accepted_per_position"], st.accepted_per_position)
    assert np.array_equal(s["draft_lengths"][1:], st.draft_lengths[1:])  # (the session never verifies no draft)


def test_reset_stats_resets_the_session_and_its_generation_totals(chain_session):
    chain_session.generate([3, 1, 4], 20)
    assert chain_session.stats()["n_drafted"] > 0 and chain_session.generation_stats.n_generated == 20
    chain_session.reset_stats()
    s = chain_session.stats()
    assert all(s[k] == 0 for k in ("n_draft_calls", "n_drafted", "n_seq_rounds", "n_accepted", "n_process_calls"))
    assert not s["accepted_per_position"].any() and not s["draft_lengths"].any()
    assert chain_session.generation_stats.n_generated == chain_session.generation_stats.n_rounds == 0


def test_stats_of_one_sequence_and_bad_sequence_ids(chain_session):
    chain_session.generate_batch([[5, 6], [7, 8]], 12)
    one, two, every = chain_session.stats(0), chain_session.stats(1), chain_session.stats()
    assert one["n_drafted"] + two["n_drafted"] == every["n_drafted"]
    for bad in (4, -2):
        with pytest.raises(eagle3.BadSeqIdError) as info:
            chain_session.stats(bad)
        assert (info.value.seq_id, info.value.n_seq) == (bad, 4)


def test_a_stream_interrupted_by_another_generation_ends_with_an_error(chain_session):
    stream = chain_session.stream([3, 1, 4], 40)
    first = next(stream)
    other = chain_session.generate([9, 8, 7], 10)
    assert len(other.tokens) == 10
    with pytest.raises(eagle3.SessionStateError, match="another call"):
        list(stream)
    assert isinstance(first, int)
    # and the session goes on working
    again = chain_session.stream([3, 1, 4], 12)
    assert len(list(again)) == 12 and again.generation.tokens.size == 12


def test_a_bad_sequence_id_in_a_processed_batch_is_named(models):
    target, draft = models["chain"]
    with eagle3.Context(target, n_seq_max=3) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_seq=2) as session:
        batch = eagle3.Batch(4, n_seq_max=3)
        batch.add(5, 0, 0)
        batch.add(6, 0, 2, True)
        tctx.decode(batch)
        with pytest.raises(eagle3.BadSeqIdError) as info:
            session.process(batch)
        assert (info.value.seq_id, info.value.n_seq) == (2, 2)


def test_a_failing_process_carries_llama_cpps_reason(models):
    target, draft = models["chain"]
    with eagle3.Context(target) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=2) as session:
        session.generate([5, 6, 7], 30)
        tctx.clear()  # the draft side still holds its cache: a new prompt no longer continues it
        batch = eagle3.Batch.from_tokens([5, 6, 7])
        tctx.decode(batch)
        with pytest.raises(eagle3.ProcessError) as info:
            session.process(batch)
        message = str(info.value)
        assert "llama.cpp:" in message and "position" in message
        assert not message.startswith("EAGLE-3")
        dctx.clear()  # what to clear to go on
        tctx.clear()
        tctx.decode(batch)
        session.process(batch)


@pytest.mark.parametrize("field, value", [("n_seq", 0), ("n_seq", -1), ("n_seq", 257),
                                          ("n_draft_max", 0), ("n_draft_max", 2**40), ("n_draft_max", 65536),
                                          ("n_min", -1), ("n_min", 9), ("p_min", math.nan), ("p_min", 1.5),
                                          ("n_seq", 1.0), ("p_min", "0.5")])
def test_session_configs_out_of_range_are_refused(field, value):
    config = eagle3.Eagle3SessionConfig(n_seq=1, n_draft_max=8)
    bad = eagle3.Eagle3SessionConfig(**{**config.__dict__, field: value})
    with pytest.raises(eagle3.InvalidConfigError):
        bad.validate()


def test_limits_come_from_llama_cpp():
    from eagle3 import _core

    assert _core.MAX_SEQ == 256 and _core.MAX_LAYERS == 512
    eagle3.Eagle3SessionConfig(n_seq=_core.MAX_SEQ, n_draft_max=65535).validate()
