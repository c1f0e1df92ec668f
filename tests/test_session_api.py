"""The Eagle3Session API mirrors the seed's Rust module, in Python's idiom."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from gguf_edit import T, rewrite

import eagle3
from eagle3 import Eagle3SessionConfig


def test_config_defaults_and_builders():
    cfg = Eagle3SessionConfig(1, 3)
    assert (cfg.n_seq, cfg.n_draft_max, cfg.n_min, cfg.p_min) == (1, 3, 0, 0.0)
    tuned = cfg.with_n_min(2).with_p_min(0.25)
    assert (tuned.n_min, tuned.p_min) == (2, 0.25)
    assert (cfg.n_min, cfg.p_min) == (0, 0.0)  # builders return copies
    assert tuned == Eagle3SessionConfig(1, 3, 2, 0.25)
    with pytest.raises(AttributeError):
        cfg.n_seq = 2


def test_both_constructor_forms(tiny_models):
    target, draft = tiny_models
    with eagle3.Context(target) as tctx, eagle3.Context(draft, other=tctx) as dctx:
        with eagle3.Eagle3Session(tctx, dctx, n_seq=1, n_draft_max=5, n_min=1, p_min=0.1) as a:
            assert (a.n_seq, a.n_draft_max, a.n_min) == (1, 5, 1)
            assert a.p_min == pytest.approx(0.1)
            assert a.config == Eagle3SessionConfig(1, 5, 1, 0.1)
        cfg = Eagle3SessionConfig(1, 2).with_p_min(0.5)
        with eagle3.Eagle3Session(tctx, dctx, config=cfg) as b:
            assert b.config is cfg
            assert b.n_draft_max == 2 and b.p_min == 0.5


def test_properties_and_repr(spec_setup):
    _, _, session = spec_setup
    assert session.need_embd is False
    assert session.need_embd_pre_norm is True
    text = repr(session)
    assert "Eagle3Session" in text and "n_draft_max=4" in text and "open" in text
    session.close()
    assert "closed" in repr(session)


def test_draft_returns_int32_and_accept_roundtrip(spec_setup):
    tctx, _, session = spec_setup
    prompt = np.arange(10, 20, dtype=np.int32)
    batch = eagle3.Batch.from_tokens(prompt)
    tctx.decode(batch)
    session.process(batch)
    session.begin(0, prompt)
    draft = session.draft(0, len(prompt), tctx.argmax(-1))
    assert isinstance(draft, np.ndarray) and draft.dtype == np.int32
    assert 0 < len(draft) <= session.n_draft_max
    session.accept(0, 0)
    stats = session.stats(0)
    assert stats["n_draft_calls"] == 1 and stats["n_drafted"] == len(draft)
    assert stats["n_accept_calls"] == 1 and stats["n_accepted"] == 0
    assert stats["accepted_per_position"].dtype == np.int64
    session.reset_stats()
    assert session.stats()["n_draft_calls"] == 0


def test_draft_logits_are_those_of_the_last_draft_step_until_the_next_call(spec_setup):
    tctx, dctx, session = spec_setup
    with pytest.raises(eagle3.SessionStateError, match="no draft logits"):
        session.draft_logits()
    prompt = np.arange(10, 20, dtype=np.int32)
    batch = eagle3.Batch.from_tokens(prompt)
    tctx.decode(batch)
    session.process(batch)
    draft = session.draft(0, len(prompt), tctx.argmax(-1))
    logits = session.draft_logits()
    assert logits.dtype == np.float32 and logits.shape == (dctx.model.n_vocab,)
    assert int(np.argmax(logits)) == draft[-1]  # (the step that chose the last token, at the length limit)
    logits[:] = 0  # a copy: the next read is unchanged
    assert np.array_equal(np.argmax(session.draft_logits()), draft[-1])
    session.accept(0, 0)
    with pytest.raises(eagle3.SessionStateError, match="no draft logits"):
        session.draft_logits()


def _first_draft(pair, p_min):
    target, draft = pair
    with eagle3.Context(target, n_ctx=128) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=1, p_min=p_min) as session:
        prompt = np.arange(30, 45, dtype=np.int32)
        batch = eagle3.Batch.from_tokens(prompt)
        tctx.decode(batch)
        session.process(batch)
        drafted = session.draft(0, len(prompt), tctx.argmax(-1)).copy()
        return drafted, session.draft_logits() if len(drafted) else None


@pytest.mark.parametrize("pair", ["random", "chain"])
def test_greedy_draft_is_the_top_k_10_chains_choice(models, pair):
    # the drafters' greedy pick: the largest logit's token, and (what p_min is compared
    # with) its probability among the 10 largest logits, as llama.cpp's top-k 10 chain
    drafted, logits = _first_draft(models[pair], 0.0)
    assert drafted.tolist() == [int(np.argmax(logits))]
    top = np.sort(logits[np.isfinite(logits)])[::-1][:10]
    p = np.float32(1.0 / np.sum(np.exp(top - top[0]).astype(np.float32), dtype=np.float64))
    assert 0 < p <= 1
    assert _first_draft(models[pair], float(p) * (1 - 1e-5))[0].tolist() == drafted.tolist()
    if p < 1:
        assert len(_first_draft(models[pair], float(p) * (1 + 1e-5))[0]) == 0


def test_greedy_draft_skips_the_drafts_suppressed_tokens(pair_paths, tmp_path):
    # tokens a draft model's tokenizer.ggml.suppress_tokens lists are never drafted (the
    # chain gives them -inf): the pick is the largest other logit, its p among the 10
    # largest others
    target_path, draft_path = pair_paths["random"]
    with eagle3.Model(target_path) as target, eagle3.Model(draft_path) as draft:
        drafted, logits = _first_draft((target, draft), 0.0)
    suppressed = [int(drafted[0]), int(np.argsort(logits)[-3])]
    edited = rewrite(draft_path, tmp_path / "suppressing.gguf",
                     set_kv={"tokenizer.ggml.suppress_tokens": (suppressed, T.ARRAY, T.INT32)})
    rest = logits.copy()
    rest[suppressed] = -np.inf
    top = np.sort(rest)[::-1][:10]
    p = np.float32(1.0 / np.sum(np.exp(top - top[0]).astype(np.float32), dtype=np.float64))
    assert 0 < p < 1
    with eagle3.Model(target_path) as target, eagle3.Model(edited) as draft:
        assert _first_draft((target, draft), 0.0)[0].tolist() == [int(np.argmax(rest))]
        assert _first_draft((target, draft), float(p) * (1 - 1e-5))[0].tolist() == [int(np.argmax(rest))]
        assert len(_first_draft((target, draft), float(p) * (1 + 1e-5))[0]) == 0


def test_print_stats_logs_to_the_eagle3_logger(spec_setup, caplog):
    _, _, session = spec_setup
    with caplog.at_level(logging.INFO, logger="eagle3"):
        session.print_stats()
    assert any("draft calls" in r.getMessage() for r in caplog.records if r.name == "eagle3")


def test_common_logs_reach_python_logging(spec_setup, caplog, capfd):
    # llama.cpp's own statistics line comes from common/, whose log reaches Python
    # through the patch common-log-callback (without it: the console)
    _, _, session = spec_setup
    with caplog.at_level(logging.INFO, logger="eagle3"):
        session.print_stats()
    assert any("statistics" in r.getMessage() and "#calls" in r.getMessage() for r in caplog.records
               if r.name == "eagle3")
    out, err = capfd.readouterr()
    assert "#calls" not in out + err


def test_llama_cpp_messages_reach_python_logging(tiny_pair, caplog):
    with caplog.at_level(logging.DEBUG, logger="eagle3"):
        eagle3.Model(tiny_pair[0]).close()
    messages = [r.getMessage() for r in caplog.records if r.name == "eagle3"]
    assert any("llama" in m for m in messages)
    assert all("\n" not in m for m in messages)


@pytest.mark.parametrize("kwargs, message", [
    ({"n_seq": 0}, "n_seq must be > 0"),
    ({"n_draft_max": 0}, "n_draft_max must be > 0"),
    ({"n_draft_max": -3}, "n_draft_max must be > 0"),
    ({"n_min": 9}, "n_min"),
    ({"p_min": 1.5}, "p_min"),
    ({"p_min": float("nan")}, "p_min"),
])
def test_invalid_config(tiny_models, kwargs, message):
    target, draft = tiny_models
    with eagle3.Context(target) as tctx, eagle3.Context(draft, other=tctx) as dctx:
        with pytest.raises(eagle3.InvalidConfigError, match=message) as info:
            eagle3.Eagle3Session(tctx, dctx, **kwargs)
        assert isinstance(info.value, ValueError)
        assert str(info.value).startswith("invalid EAGLE-3 session config")


def test_more_sequences_than_the_contexts_hold(tiny_models):
    target, draft = tiny_models
    with eagle3.Context(target, n_seq_max=2) as tctx, eagle3.Context(draft, other=tctx) as dctx:
        with pytest.raises(eagle3.SessionInitError, match="n_seq_max"):
            eagle3.Eagle3Session(tctx, dctx, n_seq=3)
        with eagle3.Eagle3Session(tctx, dctx, n_seq=2) as session:
            assert session.n_seq == 2


@pytest.mark.parametrize("seq_id", [-1, 1, 7])
def test_bad_seq_id(spec_setup, seq_id):
    tctx, _, session = spec_setup
    batch = eagle3.Batch.from_tokens([1, 2, 3])
    tctx.decode(batch)
    session.process(batch)
    for call in (lambda: session.draft(seq_id, 3, 4), lambda: session.accept(seq_id, 0),
                 lambda: session.begin(seq_id, [1, 2])):
        with pytest.raises(eagle3.BadSeqIdError) as info:
            call()
        assert (info.value.seq_id, info.value.n_seq) == (seq_id, 1)
        assert isinstance(info.value, ValueError)
        assert str(info.value) == f"sequence id {seq_id} out of range (n_seq = 1)"


def test_a_llama_model_is_not_an_eagle3_draft(tiny_models):
    target, _ = tiny_models
    with eagle3.Context(target) as tctx, eagle3.Context(target, other=tctx) as not_a_draft:
        with pytest.raises(eagle3.SessionInitError, match="not 'eagle3'") as info:
            eagle3.Eagle3Session(tctx, not_a_draft)
        assert "3 extract layers" in str(info.value)


def test_state_machine(spec_setup):
    tctx, _, session = spec_setup
    batch = eagle3.Batch.from_tokens([5, 6, 7, 8])
    with pytest.raises(eagle3.SessionStateError, match="decode"):
        session.process(batch)  # nothing decoded yet
    tctx.decode(batch)
    session.process(batch)
    with pytest.raises(eagle3.SessionStateError, match="already processed"):
        session.process(batch)
    with pytest.raises(eagle3.SessionStateError, match="without a draft"):
        session.accept(0, 0)
    with pytest.raises(ValueError, match="n_past"):
        session.draft(0, 3, 1)  # the target holds 4 tokens
    with pytest.raises(ValueError, match="token id"):
        session.draft(0, 4, tctx.model.n_vocab)
    draft = session.draft(0, 4, tctx.argmax(-1))
    with pytest.raises(ValueError, match="n_accepted"):
        session.accept(0, len(draft) + 1)
    with pytest.raises(ValueError, match="n_accepted"):
        session.accept(0, -1)
    session.accept(0, len(draft))
    other = eagle3.Batch.from_tokens([9], pos0=4)
    tctx.decode(other)
    with pytest.raises(eagle3.SessionStateError, match="just decoded"):
        session.process(batch)
    session.process(other)


def test_process_rejects_a_batch_changed_after_decoding(spec_setup):
    tctx, _, session = spec_setup
    batch = eagle3.Batch(4)
    batch.add_sequence([1, 2])
    tctx.decode(batch)
    batch.add(3, 2, 0, True)
    with pytest.raises(eagle3.SessionStateError, match="changed"):
        session.process(batch)


def test_draft_many_drafts_every_sequence(tiny_models):
    target, draft = tiny_models
    with eagle3.Context(target, n_seq_max=3) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_seq=3, n_draft_max=2) as session:
        batch = eagle3.Batch(12, n_seq_max=3)
        for seq in range(3):
            batch.add_sequence([seq + 1, seq + 2, seq + 3], 0, seq)
        tctx.decode(batch)
        session.process(batch)
        tokens, lengths = session.draft_many([0, 1, 2], [3, 3, 3], [4, 5, 6])
        assert tokens.shape == (3, 2) and tokens.dtype == np.int32
        assert np.all(lengths == 2)
        with pytest.raises(ValueError, match="twice"):
            session.draft_many([1, 1], [3, 3], [4, 5])
