"""Prefix reuse and saved states, for every kind of session.

A generation keeps the prefix of its prompt the caches already hold and decodes only the
rest, and a batch decodes the prefix its prompts share once; either way the output is
the one a fresh session gives. A saved state loads into a fresh session of the same pair
and the next generation goes on exactly as in the session that saved it (the drafter's
own state included: the same drafts are accepted). Bytes that are not such a state raise
StateError, change nothing, and never crash the process.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

import eagle3
from eagle3.testing import MtpSpec, TargetSpec, write_mtp_target, write_target
from conftest import PAIRS, run_python
from helpers import greedy, prompts as random_prompts

KINDS = ["eagle3", "mtp", "draft", "ngram-simple", "ngram-map-k", "ngram-mod"]
NGRAM = {"ngram-simple": ("simple", dict(size_n=2, size_m=6)), "ngram-map-k": ("map-k", dict(size_n=2, size_m=6)),
         "ngram-mod": ("mod", dict(n_match=3, mod_n_min=1, mod_n_max=8))}
# drafters whose state is restored, not rebuilt (ngram-mod's table is shared and rebuilt)
EXACT_DRAFTS = {"eagle3", "mtp", "draft", "ngram-simple"}
SAMPLING = {"greedy": {}, "match": dict(temperature=0.9, top_k=20, seed=11, verify="match")}


@pytest.fixture(scope="module")
def kind_models(models, model_dir):
    """The models of each kind's sessions: (target, draft or None)."""
    chain_target, chain_draft = models["chain"]
    mtp = eagle3.Model(write_mtp_target(model_dir / "state-mtp.gguf", MtpSpec(weights="chain", noise=0.14, seed=0)))
    t = PAIRS["chain"][0]
    small = eagle3.Model(write_target(model_dir / "state-draft.gguf", TargetSpec(
        n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, weights="chain", seed=t.seed)))
    out = {"eagle3": (chain_target, chain_draft), "mtp": (mtp, None), "draft": (chain_target, small)}
    out.update({k: (chain_target, None) for k in NGRAM})
    yield out
    small.close()
    mtp.close()


class Maker:
    """Fresh sessions of one kind over the same models (each with contexts of its own)."""

    def __init__(self, kind, target, draft):
        self.kind, self.target, self.draft = kind, target, draft
        self.contexts = []

    def __call__(self, n_seq=1, n_ctx=512):
        tctx = eagle3.Context(self.target, n_ctx=n_ctx, n_seq_max=n_seq)
        self.contexts.append(tctx)
        if self.kind == "eagle3":
            return eagle3.Eagle3Session(tctx, eagle3.Context(self.draft, other=tctx), n_seq=n_seq, n_draft_max=4)
        if self.kind == "mtp":
            mctx = eagle3.Context(self.target, n_ctx=n_ctx, ctx_type="mtp", n_seq_max=n_seq)
            self.contexts.append(mctx)
            return eagle3.MtpSession(tctx, mctx, n_seq=n_seq, n_draft_max=3)
        if self.kind == "draft":
            dctx = eagle3.Context(self.draft, n_ctx=n_ctx, n_batch=tctx.n_batch, n_seq_max=n_seq)
            self.contexts.append(dctx)
            return eagle3.DraftSession(tctx, dctx, n_seq=n_seq, n_draft_max=4)
        method, params = NGRAM[self.kind]
        return eagle3.NgramSession(tctx, method, n_seq=n_seq, n_draft_max=6, **params)

    def close(self):
        for ctx in reversed(self.contexts):
            ctx.close()


@pytest.fixture(params=KINDS)
def make(request, kind_models):
    maker = Maker(request.param, *kind_models[request.param])
    yield maker
    maker.close()


def _prompt(n_vocab, n=12, seed=0):
    return np.random.default_rng(seed).integers(0, n_vocab, n).astype(np.int32)


def _fresh(make, prompt, n, **kw):
    """What a session that never saw anything generates."""
    return make().generate(prompt, n, **kw)


# -- prefix reuse -------------------------------------------------------------

@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_a_continuation_decodes_only_its_new_tokens(make, sampling):
    kw = SAMPLING[sampling]
    s = make()
    prompt = _prompt(s.target.model.n_vocab, 9, seed=1)
    first = s.generate(prompt, 17, **kw)
    assert first.stats.n_reused == 0 and first.stats.n_prompt == len(prompt)
    full = np.concatenate([prompt, first.tokens])
    went_on = s.generate(full, 23, **kw)
    # the caches hold the prompt and every output token but the last
    assert went_on.stats.n_reused == len(full) - 1 and went_on.stats.n_prompt == len(full)
    ref = _fresh(make, full, 23, **kw)
    assert ref.stats.n_reused == 0
    np.testing.assert_array_equal(went_on.tokens, ref.tokens)
    again = s.generate(full, 23, reuse=False, **kw)
    assert again.stats.n_reused == 0
    np.testing.assert_array_equal(again.tokens, ref.tokens)
    assert s.generation_stats.n_reused == len(full) - 1


def test_a_stop_inside_a_round_leaves_only_what_was_emitted(make):
    # max_new_tokens cuts rounds short: the caches keep the emitted tokens, not the accepted rest
    s = make()
    prompt = _prompt(s.target.model.n_vocab, 7, seed=2)
    full = prompt
    for n in (3, 2, 5, 1, 4):
        g = s.generate(full, n)
        ref = _fresh(make, full, n)
        np.testing.assert_array_equal(g.tokens, ref.tokens)
        assert g.stats.n_reused == (0 if full is prompt else len(full) - 1)
        full = np.concatenate([full, g.tokens])


def test_a_prompt_that_leaves_the_held_tokens_keeps_their_common_prefix(make):
    s = make()
    n_vocab = s.target.model.n_vocab
    prompt = _prompt(n_vocab, 20, seed=3)
    g = s.generate(prompt, 10)
    for cut, n_tail in ((14, 3), (25, 2), (20, 0), (3, 4), (1, 5)):
        base = np.concatenate([prompt, g.tokens])  # the caches hold all of it but its last token
        tail = (base[cut] + 1 + np.arange(n_tail)) % n_vocab  # its first token leaves base
        other = np.concatenate([base[:cut], tail]).astype(np.int32)
        common = cut if n_tail else cut - 1  # (a prompt's last token is always decoded)
        g = s.generate(other, 12)
        np.testing.assert_array_equal(g.tokens, _fresh(make, other, 12).tokens, err_msg=f"cut {cut}")
        # EAGLE-3 decodes the last common token again (the draft pair there holds the next
        # token); MTP goes on only from all that is held
        expect = {"eagle3": max(common - 1, 0), "mtp": 0}.get(make.kind, common)
        assert g.stats.n_reused == expect, (cut, g.stats.n_reused)
        prompt = other


def test_a_batch_decodes_the_prefix_its_prompts_share_once(make):
    s = make(n_seq=3)
    n_vocab = s.target.model.n_vocab
    shared = _prompt(n_vocab, 30, seed=4)
    prompts = [np.concatenate([shared, t]).astype(np.int32) for t in ([1], [2, 3], [4, 5, 6])]
    b = s.generate_batch(prompts, 14)
    assert [g.stats.n_reused for g in b] == [0, 30, 30]
    assert b.stats.n_reused == 60
    for p, g in zip(prompts, b):
        np.testing.assert_array_equal(g.tokens, _fresh(make, p, 14).tokens)
    whole = make(n_seq=3).generate_batch(prompts, 14, reuse=False)  # every prompt decoded whole
    assert [g.stats.n_reused for g in whole] == [0, 0, 0]
    assert [g.tokens.tolist() for g in whole] == [g.tokens.tolist() for g in b]
    # and each sequence then goes on from its own caches
    more = [np.concatenate([p, g.tokens]) for p, g in zip(prompts, b)]
    b2 = s.generate_batch(more, 9)
    assert [g.stats.n_reused for g in b2] == [len(p) - 1 for p in more]
    for p, g in zip(more, b2):
        np.testing.assert_array_equal(g.tokens, _fresh(make, p, 9).tokens)


def test_a_batch_with_the_shared_prefix_held_by_one_sequence_copies_it(make):
    s = make(n_seq=2)
    shared = _prompt(s.target.model.n_vocab, 16, seed=5)
    s.generate(shared, 1)  # sequence 0 now holds the shared prefix, and no more
    prompts = [np.concatenate([shared, [7, 8]]).astype(np.int32), np.concatenate([shared, [9]]).astype(np.int32)]
    b = s.generate_batch(prompts, 10, temperature=0.7, seed=3, verify="match")
    assert [g.stats.n_reused for g in b] == [16, 16]
    for p, g in zip(prompts, b):
        np.testing.assert_array_equal(g.tokens, _fresh(make, p, 10, temperature=0.7, seed=3, verify="match").tokens)


def test_calls_that_change_the_caches_turn_reuse_off(make):
    s = make()
    prompt = _prompt(s.target.model.n_vocab, 10, seed=6)
    g = s.generate(prompt, 8)
    full = np.concatenate([prompt, g.tokens])
    s.target.seq_rm(0, 4)  # the target no longer holds what the session left
    after = s.generate(full, 8)
    assert after.stats.n_reused == 0
    np.testing.assert_array_equal(after.tokens, _fresh(make, full, 8).tokens)
    s.target.generate(full, 3)  # plain decoding on the same context
    assert s.generate(full, 8).stats.n_reused == 0


@pytest.mark.parametrize("kind", ["eagle3", "draft"])
def test_after_auto_goes_plain_the_next_generation_keeps_what_the_drafter_followed(models, kind):
    # random drafts are almost never accepted: n_draft_max="auto" soon decodes plainly, and
    # the EAGLE-3 head or draft model stops following the target; the next generation keeps
    # the prefix it did follow (not nothing) and decodes the rest again
    if kind == "eagle3":
        target, draft = models["random"]
    else:
        target, draft = models["chain"][0], models["random"][0]
    with eagle3.Context(target, n_ctx=512) as tctx:
        if kind == "eagle3":
            dctx = eagle3.Context(draft, other=tctx)
            s = eagle3.Eagle3Session(tctx, dctx, n_draft_max=6)
        else:
            dctx = eagle3.Context(draft, n_ctx=512, n_batch=tctx.n_batch)
            s = eagle3.DraftSession(tctx, dctx, n_draft_max=6)
        with dctx, s:
            prompt = np.arange(20, 60, dtype=np.int32)
            first = s.generate(prompt, 96, n_draft_max="auto")
            assert 0 < first.stats.n_plain_rounds < first.stats.n_rounds
            full = np.concatenate([prompt, first.tokens])
            went_on = s.generate(full, 24, n_draft_max=3)
            assert len(prompt) - 1 <= went_on.stats.n_reused < len(full) - 1
            np.testing.assert_array_equal(went_on.tokens, greedy(target, full, 24))
            # and the drafter follows again: a continuation keeps everything
            full = np.concatenate([full, went_on.tokens])
            assert s.generate(full, 8, n_draft_max=3).stats.n_reused == len(full) - 1


@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_plain_decoding_on_a_context_reuses_its_prefix_too(kind_models, sampling):
    target = kind_models["eagle3"][0]
    kw = SAMPLING[sampling]
    with eagle3.Context(target, n_ctx=512, n_seq_max=2) as ctx, eagle3.Context(target, n_ctx=512) as ref_ctx:
        def fresh(prompt, n):
            ref_ctx.clear()  # a cache that holds nothing
            g = ref_ctx.generate(prompt, n, **kw)
            assert g.stats.n_reused == 0
            return g.tokens

        prompt = _prompt(target.n_vocab, 11, seed=12)
        first = ctx.generate(prompt, 9, **kw)
        assert first.stats.n_reused == 0
        full = np.concatenate([prompt, first.tokens])
        went_on = ctx.generate(full, 12, **kw)
        assert went_on.stats.n_reused == len(full) - 1
        np.testing.assert_array_equal(went_on.tokens, fresh(full, 12))
        # a prompt that leaves the held tokens keeps their common prefix
        other = np.concatenate([full[:7], [3, 1, 4]]).astype(np.int32)
        g = ctx.generate(other, 6, **kw)
        assert g.stats.n_reused == 7
        np.testing.assert_array_equal(g.tokens, fresh(other, 6))
        # a call that changes the cache turns reuse off; reuse=False decodes whole
        ctx.seq_rm(0, 2, -1)
        again = ctx.generate(other, 6, **kw)
        assert again.stats.n_reused == 0
        np.testing.assert_array_equal(again.tokens, g.tokens)
        assert ctx.generate(other, 6, reuse=False, **kw).stats.n_reused == 0
        # a batch after a single prompt: sequence 0 goes on, sequence 1 starts afresh
        more = np.concatenate([other, again.tokens]).astype(np.int32)
        new = _prompt(target.n_vocab, 8, seed=14)
        b = ctx.generate_batch([more, new], 5, **kw)
        assert [x.stats.n_reused for x in b] == [len(more) - 1, 0]
        for p, x in zip((more, new), b):
            np.testing.assert_array_equal(x.tokens, fresh(p, 5))


def test_a_session_and_plain_decoding_on_one_context_do_not_reuse_each_others_caches(make):
    s = make()
    prompt = _prompt(s.target.model.n_vocab, 10, seed=13)
    full = np.concatenate([prompt, s.target.generate(prompt, 6).tokens])
    g = s.generate(full, 8)
    assert g.stats.n_reused == 0  # the session did not see what plain decoding left
    np.testing.assert_array_equal(g.tokens, _fresh(make, full, 8).tokens)
    assert s.target.generate(full, 4).stats.n_reused == 0  # nor plain decoding what the session left


# -- saved states ---------------------------------------------------------------

@pytest.mark.parametrize("sampling", list(SAMPLING))
def test_a_state_loads_into_a_fresh_session_and_goes_on_as_the_original(make, sampling):
    kw = SAMPLING[sampling]
    s = make()
    prompt = _prompt(s.target.model.n_vocab, 11, seed=7)
    first = s.generate(prompt, 19, **kw)
    state = s.save_state()
    assert isinstance(state, bytes)
    full = np.concatenate([prompt, first.tokens])
    expected = s.generate(full, 25, **kw)
    fresh = make()
    fresh.load_state(state)
    got = fresh.generate(full, 25, **kw)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    assert got.stats.n_reused == expected.stats.n_reused == len(full) - 1
    if make.kind in EXACT_DRAFTS:  # the drafter's own state came along: the same drafts
        assert (got.stats.n_drafted, got.stats.n_accepted) == (expected.stats.n_drafted, expected.stats.n_accepted)
    # loading it again (into a session that has moved on) goes back to the saved point
    fresh.load_state(state)
    np.testing.assert_array_equal(fresh.generate(full, 25, **kw).tokens, expected.tokens)


def test_a_state_of_several_sequences(make):
    s = make(n_seq=2)
    n_vocab = s.target.model.n_vocab
    prompts = [_prompt(n_vocab, 9, seed=8), _prompt(n_vocab, 13, seed=9)]
    b = s.generate_batch(prompts, 12)
    state = s.save_state()
    more = [np.concatenate([p, g.tokens]) for p, g in zip(prompts, b)]
    expected = s.generate_batch(more, 10)
    fresh = make(n_seq=2)
    fresh.load_state(state)
    got = fresh.generate_batch(more, 10)
    for e, g, p in zip(expected, got, more):
        np.testing.assert_array_equal(g.tokens, e.tokens)
        assert g.stats.n_reused == len(p) - 1


def test_a_state_saved_before_any_generation_loads(make):
    s = make()
    state = s.save_state()
    fresh = make()
    fresh.load_state(state)
    prompt = _prompt(s.target.model.n_vocab, 6, seed=10)
    g = fresh.generate(prompt, 10)
    assert g.stats.n_reused == 0
    np.testing.assert_array_equal(g.tokens, _fresh(make, prompt, 10).tokens)


def test_a_stream_in_progress_ends_when_a_state_is_loaded(make):
    s = make()
    prompt = _prompt(s.target.model.n_vocab, 6, seed=12)
    s.generate(prompt, 4)
    state = s.save_state()
    stream = s.stream(prompt, 30)
    next(stream)
    s.load_state(state)
    with pytest.raises(eagle3.SessionStateError):
        list(stream)


def _variants(state: bytes) -> dict[str, bytes]:
    n = len(state)
    flip = lambda i: state[:i] + bytes([state[i] ^ 0x40]) + state[i + 1:]  # noqa: E731
    out = {"empty": b"", "one byte": state[:1], "header only": state[:56], "half": state[:n // 2],
           "last byte missing": state[:-1], "trailing byte": state + b"\0", "zeros": bytes(n),
           "magic": flip(0), "version": flip(9), "description length": flip(12), "checksum": flip(30),
           "description": flip(60), "payload start": flip(n // 2), "payload end": flip(n - 1),
           "another format": b"GGUF" + state[4:]}
    return out


def _resealed(state: bytes, mutate) -> bytes:
    """The state with its description or payload changed and its checksum made to match."""
    n_head, n_payload = struct.unpack_from("<IQ", state, 12)
    body = mutate(bytearray(state[56:]), n_head)
    return state[:12] + struct.pack("<IQ", n_head, len(body) - n_head) + hashlib.sha256(body).digest() + bytes(body)


def test_bad_bytes_raise_state_error_and_change_nothing(make):
    s = make()
    prompt = _prompt(s.target.model.n_vocab, 8, seed=13)
    first = s.generate(prompt, 9)
    state = s.save_state()
    full = np.concatenate([prompt, first.tokens])
    for name, bad in _variants(state).items():
        with pytest.raises(eagle3.StateError):
            s.load_state(bad)
        with pytest.raises(eagle3.StateError):
            make().load_state(bad)
    # a description that lies about the payload's parts, with a checksum to match
    def resize_part(body, n_head):
        import json
        d = json.loads(bytes(body[:n_head]))
        d["sizes"][0] -= 1
        d["sizes"][1] += 1
        head = json.dumps(d).encode()
        return bytearray(head) + body[n_head:]
    for bad in (_resealed(state, resize_part), _resealed(state, lambda b, h: b[:h] + b[h + 1:] + b"\0")):
        with pytest.raises(eagle3.StateError):
            s.load_state(bad)
    with pytest.raises(eagle3.ArgumentTypeError):
        s.load_state("not bytes")
    # nothing changed: the session goes on from its own caches
    g = s.generate(full, 12)
    assert g.stats.n_reused == len(full) - 1
    np.testing.assert_array_equal(g.tokens, _fresh(make, full, 12).tokens)


def test_states_of_other_models_sizes_and_kinds_are_refused(make, models, kind_models):
    s = make()
    s.generate(_prompt(s.target.model.n_vocab, 8, seed=14), 5)
    state = s.save_state()
    with pytest.raises(eagle3.StateError, match="n_ctx"):
        make(n_ctx=256).load_state(state)
    with pytest.raises(eagle3.StateError, match="n_seq"):
        make(n_seq=2).load_state(state)
    for kind in KINDS:
        if kind != make.kind:
            other = Maker(kind, *kind_models[kind])
            try:
                with pytest.raises(eagle3.StateError):
                    other().load_state(state)
                with pytest.raises(eagle3.StateError):
                    s.load_state(other().save_state())
            finally:
                other.close()
    # the same shapes with other weights (the "random" pair's target is another model)
    if make.kind != "mtp":
        target, draft = models["chain-soft"]
        foreign = Maker(make.kind, target, draft if make.kind == "eagle3" else make.draft)
        try:
            with pytest.raises(eagle3.StateError, match="another|model|not one"):
                foreign().load_state(state)
        finally:
            foreign.close()


# -- contexts ---------------------------------------------------------------------

def test_context_state_of_a_sequence_and_of_the_whole_context(models):
    target, _ = models["chain"]
    prompt = _prompt(target.n_vocab, 10, seed=15)
    with eagle3.Context(target, n_ctx=256, n_seq_max=2) as ctx, eagle3.Context(target, n_ctx=256, n_seq_max=2) as c2:
        ctx.decode(eagle3.Batch.from_tokens(prompt, seq_id=0, n_seq_max=2))
        expected = np.array(ctx.logits())
        seq_state = ctx.save_state(0)
        whole = ctx.save_state()
        nxt = eagle3.Batch.from_tokens([int(np.argmax(expected))], pos0=len(prompt), seq_id=1, n_seq_max=2)
        # a sequence's state loads into another sequence of another context
        c2.load_state(seq_state, seq_id=1)
        assert c2.seq_pos_max(1) == len(prompt) - 1 and c2.seq_pos_max(0) == -1
        c2.decode(nxt)
        after = np.array(c2.logits())
        ctx.seq_rm(0)
        ctx.load_state(seq_state)  # into the sequence it came from
        ctx.decode(eagle3.Batch.from_tokens([int(np.argmax(expected))], pos0=len(prompt), seq_id=0, n_seq_max=2))
        np.testing.assert_array_equal(np.array(ctx.logits()), after)
        # the whole state, last logits included
        c2.clear()
        c2.load_state(whole)
        assert c2.seq_pos_max(0) == len(prompt) - 1
        with pytest.raises(eagle3.StateError, match="whole"):
            c2.load_state(whole, seq_id=0)
        with pytest.raises(eagle3.BadSeqIdError):
            c2.load_state(seq_state, seq_id=2)
        with pytest.raises(eagle3.BadSeqIdError):
            ctx.save_state(5)
        for bad in _variants(seq_state).values():
            with pytest.raises(eagle3.StateError):
                c2.load_state(bad)
        assert c2.seq_pos_max(0) == len(prompt) - 1  # (refused loads changed nothing)
    with eagle3.Context(target, n_ctx=1024, n_seq_max=2) as bigger:
        with pytest.raises(eagle3.StateError, match="n_ctx"):
            bigger.load_state(seq_state)
    other, _ = models["random"]
    with eagle3.Context(other, n_ctx=256, n_seq_max=2) as foreign:
        with pytest.raises(eagle3.StateError, match="model"):
            foreign.load_state(seq_state)


def test_a_context_state_turns_a_sessions_reuse_off(kind_models):
    maker = Maker("eagle3", *kind_models["eagle3"])
    try:
        s = maker()
        prompt = _prompt(s.target.model.n_vocab, 10, seed=16)
        g = s.generate(prompt, 6)
        saved = s.target.save_state(0)
        s.generate(_prompt(s.target.model.n_vocab, 10, seed=17), 6)
        s.target.load_state(saved)  # the target holds the first prompt again; the draft side does not
        full = np.concatenate([prompt, g.tokens])
        again = s.generate(full, 8)
        assert again.stats.n_reused == 0
        np.testing.assert_array_equal(again.tokens, maker().generate(full, 8).tokens)
    finally:
        maker.close()


# -- fuzzing, in a child process (an abort must fail the test, not end the suite) -----

FUZZ = r"""
import hashlib, struct, sys
import numpy as np
import eagle3
target, draft, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
tm, dm = eagle3.Model(target), eagle3.Model(draft)
tctx = eagle3.Context(tm, n_ctx=256)
session = eagle3.Eagle3Session(tctx, eagle3.Context(dm, other=tctx), n_draft_max=4)
prompt = np.arange(3, 15, dtype=np.int32)
g = session.generate(prompt, 12)
full = np.concatenate([prompt, g.tokens])
state = session.save_state()
ctx_state = tctx.save_state(0)
whole = tctx.save_state()
expected = session.generate(full, 10).tokens
session.load_state(state)
rng = np.random.default_rng(seed)
refused = 0

def reseal(b):
    n_head = struct.unpack_from("<I", b, 12)[0]
    body = bytes(b[56:])
    if len(body) < n_head:
        return bytes(b)
    return bytes(b[:16]) + struct.pack("<Q", len(body) - n_head) + hashlib.sha256(body).digest() + body

for trial in range(300):
    src = [state, ctx_state, whole][trial % 3]
    b = bytearray(src)
    how = rng.integers(4)
    if how == 0:
        b = b[:rng.integers(len(b))]
    elif how == 1:
        for _ in range(rng.integers(1, 8)):
            b[rng.integers(len(b))] ^= 1 << rng.integers(8)
    elif how == 2:
        at = rng.integers(56, len(b))
        b[at:at + 8] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
    else:
        b = b + rng.integers(0, 256, rng.integers(1, 64), dtype=np.uint8).tobytes()
    if rng.integers(2):
        b = bytearray(reseal(b)) if len(b) >= 56 else b  # past the checksum: the parts' own checks
    try:
        if trial % 3 == 0:
            session.load_state(bytes(b))
        else:
            tctx.load_state(bytes(b))
    except eagle3.StateError:
        refused += 1
    except eagle3.Eagle3Error as e:
        print("OTHER", type(e).__name__, e)
        refused += 1
    session.load_state(state)
# after all that the session still works, and goes on as before
assert np.array_equal(session.generate(full, 10).tokens, expected)
print("REFUSED", refused)
"""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzzed_states_never_crash(chain_pair, seed):
    result = run_python(FUZZ, str(chain_pair[0]), str(chain_pair[1]), str(seed), timeout=600)
    assert result.returncode == 0, f"crashed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert "REFUSED" in result.stdout and "OTHER" not in result.stdout, result.stdout[-2000:]
    assert int(result.stdout.split("REFUSED")[1].split()[0]) >= 100
