"""Generation inside the extension: generate, generate_batch, stream, plain generate."""

from __future__ import annotations

import numpy as np
import pytest

import eagle3
from helpers import greedy, prompts

N_NEW = 40


@pytest.mark.parametrize("pair", ["random", "random-d2t", "random-own-embd", "chain", "chain-d2t"])
@pytest.mark.parametrize("n_draft_max", [1, 3, 8, "auto"])
def test_greedy_generate_equals_greedy_decoding(models, pair, n_draft_max):
    target, draft = models[pair]
    with eagle3.Context(target, n_ctx=512) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=8) as session:
        for prompt in prompts(target.n_vocab, count=6, seed=3):
            g = session.generate(prompt, N_NEW, n_draft_max=n_draft_max)
            assert g.tokens.dtype == np.int32
            assert g.tokens.tolist() == greedy(target, prompt, N_NEW)
            assert g.finish_reason == "length" and g.stats.n_generated == N_NEW
            assert g.text == target.detokenize(g.tokens)
            # the plain engine, same sampler
            assert tctx.generate(prompt, N_NEW).tokens.tolist() == g.tokens.tolist()


def test_generate_batch_equals_single_sequences(chain_session):
    session = chain_session
    model = session.target.model
    cases = [[5, 6, 7], [1], list(range(30, 60)), [9, 9, 9, 9]]
    budgets = [25, 40, 7, 33]
    singles = []
    for p, n in zip(cases, budgets):
        singles.append(session.generate(p, n).tokens.tolist())
        assert singles[-1] == greedy(model, p, n)
    # sequences of one batch have their own budgets via stop tokens: run with the largest budget
    batch = session.generate_batch(cases, 40)
    assert len(batch) == 4
    for generated, p in zip(batch, cases):
        assert generated.tokens.tolist() == greedy(model, p, 40)
    assert np.array_equal(batch.values, np.concatenate(batch.tokens))
    assert batch.offsets.tolist() == [0, 40, 80, 120, 160]
    # one target pass serves every live sequence
    assert batch.stats.n_rounds < batch.stats.n_seq_rounds
    with pytest.raises(eagle3.InvalidArgumentError, match="n_seq"):
        session.generate_batch([[1]] * 5, 4)


def test_sequences_finish_independently(chain_session):
    session = chain_session
    model = session.target.model
    ref = greedy(model, [5, 6, 7], 30)
    stop = ref[10]
    batch = session.generate_batch([[5, 6, 7], [2, 3]], 30, stop_tokens=[stop])
    first = batch[0]
    assert first.finish_reason == "stop" and first.tokens[-1] == stop
    assert first.tokens.tolist() == ref[:ref.index(stop) + 1]
    second_ref = greedy(model, [2, 3], 30)
    expected = second_ref[:second_ref.index(stop) + 1] if stop in second_ref else second_ref
    assert batch[1].tokens.tolist() == expected


def test_stop_strings_and_context_end(models):
    target, draft = models["chain"]
    ref = greedy(target, [4, 5], 30)
    hex_of = f"{ref[6]:x}{ref[7]:x}"  # the test vocabulary renders tokens as hex ids
    with eagle3.Context(target, n_ctx=256) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=4) as session:
        g = session.generate([4, 5], 30, stop_strings=[hex_of])
        assert g.finish_reason == "stop"
        assert hex_of not in g.text and target.detokenize(g.tokens).find(hex_of) == len(g.text)
        assert g.tokens.tolist() == ref[:len(g.tokens)]
        long = session.generate(np.arange(200) % 256, 500)
        assert long.finish_reason == "context"
        assert 200 + len(long.tokens) <= tctx.n_ctx + 1


def test_text_prompts(models):
    target, draft = models["chain"]
    with eagle3.Context(target) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx) as session:
        g = session.generate("speculative decoding", 12)
        assert g.tokens.tolist() == greedy(target, target.tokenize("speculative decoding"), 12)


def test_stream_yields_the_generated_tokens(chain_session):
    session = chain_session
    expected = session.generate([3, 1, 4], 30).tokens.tolist()
    stream = session.stream([3, 1, 4], 30)
    assert stream.generation is None
    tokens = list(stream)
    assert tokens == expected
    assert stream.generation.tokens.tolist() == expected and stream.generation.finish_reason == "length"


def test_stream_ends_cleanly_when_the_contexts_are_used_in_between(chain_session):
    session = chain_session
    stream = session.stream([3, 1, 4], 30)
    next(stream)
    session.target.decode(eagle3.Batch.from_tokens([1], seq_id=1, n_seq_max=4))
    with pytest.raises(eagle3.SessionStateError, match="streaming"):
        list(stream)


def test_stats(chain_session):
    session = chain_session
    before = session.generation_stats.n_generated
    g = session.generate([8, 9], 60)
    st = g.stats
    assert st.n_generated == 60 and st.n_prompt == 2
    assert 0.0 < st.acceptance_rate <= 1.0
    assert st.mean_accepted_length == pytest.approx((st.n_accepted + st.n_seq_rounds) / st.n_seq_rounds)
    assert st.mean_accepted_length > 1.5
    per_pos = st.accepted_per_position
    assert per_pos.dtype == np.int64 and len(per_pos) == session.n_draft_max
    assert np.all(np.diff(per_pos) <= 0) and per_pos.sum() == st.n_accepted
    assert st.n_drafted >= st.n_accepted and st.n_draft_calls <= st.n_seq_rounds
    assert min(st.t_draft_s, st.t_verify_s, st.t_process_s, st.t_prefill_s) > 0
    assert st.t_total_s >= st.t_draft_s + st.t_verify_s
    assert st.tokens_per_s > 0
    assert session.generation_stats.n_generated == before + 60
    assert set(st.as_dict()) >= {"acceptance_rate", "mean_accepted_length", "tokens_per_s", "t_verify_s"}


def test_adaptive_draft_length_drafts_less_when_little_is_accepted(models):
    target, draft = models["random"]  # drafts are almost never accepted
    with eagle3.Context(target) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=8) as session:
        fixed = session.generate([1, 2, 3], 40).stats
        auto = session.generate([1, 2, 3], 40, n_draft_max="auto").stats
        assert fixed.n_drafted / fixed.n_draft_calls > 6  # 8, less near the end of the budget
        # a round or two of short drafts, then plain decoding
        assert auto.n_drafted <= 4 * auto.n_draft_calls and auto.n_drafted < fixed.n_drafted / 10
        assert auto.n_plain_rounds > 0


def test_mtp_session_uses_the_same_engine(model_dir):
    from eagle3.testing import MtpSpec, write_mtp_target

    path = write_mtp_target(model_dir / "mtp-generate.gguf", MtpSpec(weights="chain", noise=0.14))
    with eagle3.Model(path) as model, eagle3.Context(model) as tctx, \
            eagle3.Context(model, ctx_type="mtp") as mctx, eagle3.MtpSession(tctx, mctx, n_draft_max=3) as session:
        for prompt in prompts(model.n_vocab, count=4, seed=5):
            g = session.generate(prompt, 30)
            assert g.tokens.tolist() == greedy(model, prompt, 30)
        assert session.generation_stats.n_accepted > 0


def test_sampling_with_a_seed_is_reproducible_and_matches_plain_sampling(chain_session):
    session = chain_session
    for seed in range(20):
        kw = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.01, seed=seed, verify="match")
        a = session.generate([5, 6], 24, **kw).tokens
        assert np.array_equal(a, session.generate([5, 6], 24, **kw).tokens)
        # one random draw per token, and a verify pass rounds every logit as a
        # one-token pass does (test_batch_invariance): the same stream with or
        # without speculation
        assert np.array_equal(a, session.target.generate([5, 6], 24, **kw).tokens)


@pytest.mark.parametrize("kwargs, error", [
    ({"max_new_tokens": 0}, eagle3.InvalidArgumentError),
    ({"temperature": -1.0}, eagle3.InvalidArgumentError),
    ({"temperature": "hot"}, eagle3.ArgumentTypeError),
    ({"top_p": 0.0}, eagle3.InvalidArgumentError),
    ({"top_p": 1.5}, eagle3.InvalidArgumentError),
    ({"min_p": 2.0}, eagle3.InvalidArgumentError),
    ({"top_k": -1}, eagle3.InvalidArgumentError),
    ({"seed": -5}, eagle3.InvalidArgumentError),
    ({"n_draft_max": 9}, eagle3.InvalidArgumentError),
    ({"n_draft_max": "fast"}, eagle3.ArgumentTypeError),
    ({"stop_tokens": [99999]}, eagle3.InvalidArgumentError),
    ({"stop_strings": [3]}, eagle3.ArgumentTypeError),
    ({"prompt": []}, eagle3.InvalidArgumentError),
    ({"prompt": [1.5]}, eagle3.ArgumentTypeError),
    ({"prompt": [300]}, eagle3.InvalidArgumentError),
    ({"prompt": np.zeros(600, np.int32)}, eagle3.InvalidArgumentError),
])
def test_generate_argument_errors(chain_session, kwargs, error):
    kwargs = {"prompt": [1, 2], "max_new_tokens": 5, **kwargs}
    with pytest.raises(error):
        chain_session.generate(**kwargs)
    assert chain_session.generate([1, 2], 3).stats.n_generated == 3  # the session still works


def test_generate_refuses_to_overwrite_live_logits_views(chain_session):
    tctx = chain_session.target
    tctx.decode(eagle3.Batch.from_tokens([1, 2], seq_id=3, n_seq_max=4))
    view = tctx.logits(-1)
    with pytest.raises(eagle3.SessionStateError, match="views"):
        chain_session.generate([1], 3)
    del view
    chain_session.generate([1], 3)


def test_a_batch_decoded_before_generate_cannot_be_processed_after(chain_session):
    tctx = chain_session.target
    batch = eagle3.Batch.from_tokens([1, 2], seq_id=3, n_seq_max=4)
    tctx.decode(batch)
    chain_session.generate([4], 3)
    with pytest.raises(eagle3.SessionStateError):
        chain_session.process(batch)


def test_closed_sessions_refuse_to_generate(chain_session):
    chain_session.close()
    with pytest.raises(eagle3.ClosedError):
        chain_session.generate([1], 3)


def test_auto_draft_length_falls_back_to_plain_decoding_when_drafts_are_rejected(models):
    # a random draft is almost never accepted: every draft length costs more than it yields
    target, draft = models["random"]
    with eagle3.Context(target, n_ctx=512, n_seq_max=2) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_seq=2, n_draft_max=6) as session:
        prompts = [[5, 6, 7], list(range(20, 40))]
        g = session.generate(prompts[0], 96, n_draft_max="auto")
        assert g.tokens.tolist() == greedy(target, prompts[0], 96)
        assert 0 < g.stats.n_plain_rounds < g.stats.n_rounds
        # the lengths it chose: a few short drafts, then none (plain rounds and probes)
        lengths = g.stats.draft_lengths
        assert lengths.sum() == g.stats.n_seq_rounds and lengths[0] >= g.stats.n_plain_rounds
        assert lengths[1:].sum() == g.stats.n_draft_calls
        batch = session.generate_batch(prompts, 96, n_draft_max="auto")
        assert [t.tokens.tolist() for t in batch] == [greedy(target, p, 96) for p in prompts]
        assert batch.stats.n_plain_rounds > 0
        # the session is still usable for speculation afterwards
        assert session.generate(prompts[1], 32, n_draft_max=3).tokens.tolist() == greedy(target, prompts[1], 32)


@pytest.mark.parametrize("pair", ["random", "chain"])
def test_a_per_call_draft_limit_drafts_and_costs_no_more_than_it(models, pair):
    # p_min=0: every round drafts up to its limit; the draft context counts what it decodes
    target, draft = models[pair]
    with eagle3.Context(target, n_ctx=512) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=8, p_min=0.0) as session:
        per_round = {}
        for limit in (8, 2):
            before = dctx.tokens_decoded
            st = session.generate([5, 6, 7], 64, n_draft_max=limit).stats
            assert st.n_drafted <= limit * st.n_draft_calls
            assert st.draft_lengths.sum() == st.n_seq_rounds and not st.draft_lengths[limit + 1:].any()
            # each round: the draft steps, plus process of the verified tokens (at most limit + 1)
            per_round[limit] = (dctx.tokens_decoded - before) / st.n_rounds
            assert per_round[limit] <= 2 * limit + 2
        assert per_round[2] < per_round[8] - 3


def test_draft_limits_respect_the_sessions_n_min(models):
    # drafts shorter than n_min are dropped by llama.cpp: a lower limit could only waste draft steps
    target, draft = models["chain"]
    with eagle3.Context(target, n_ctx=512) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=6, n_min=3) as session:
        with pytest.raises(eagle3.InvalidArgumentError, match="n_min"):
            session.generate([5, 6, 7], 16, n_draft_max=2)
        for _ in range(3):
            g = session.generate([5, 6, 7], 48, n_draft_max="auto")
            assert g.tokens.tolist() == greedy(target, [5, 6, 7], 48)
            assert not g.stats.draft_lengths[1:3].any()
