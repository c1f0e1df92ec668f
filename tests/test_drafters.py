"""Draft-model and n-gram sessions: llama.cpp's other drafters, through the same engine.

Every drafter's greedy output equals the target's own greedy output; n-gram drafts are
taken from the token history (a prompt the output repeats is drafted and accepted);
parameters are checked with llama.cpp's ranges; a draft model's vocabulary is checked
the way llama.cpp checks it; n-gram cache files are read before llama.cpp's loader
(which asserts) sees them; and sampled output follows the target's distribution.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

import eagle3
from eagle3.testing import TargetSpec, chain_map, write_target
from conftest import PAIRS, expect_exception
from helpers import prompts as random_prompts
from test_sampling_distribution import homogeneity_p

METHODS = {
    "simple": dict(size_n=2, size_m=6),
    "simple-defaults": {},
    "map-k": dict(size_n=2, size_m=6),
    "map-k4v": dict(size_n=3, size_m=5, min_hits=1),
    "mod": dict(n_match=3, mod_n_min=1, mod_n_max=8),
    "cache": {},
}


def _method(name: str) -> str:
    return name.removesuffix("-defaults")


@pytest.fixture(scope="module")
def chain(models):
    """The chain target (its greedy successor of token t is next[t]) and that map."""
    target, _ = models["chain"]
    return target, chain_map(PAIRS["chain"][0])


@pytest.fixture(scope="module")
def draft_models(tmp_path_factory):
    """Small models of the chain target's vocabulary: one with its chain (a good draft),
    one with another chain and 40 more tokens (a poor draft whose tokens the target may
    lack), one whose vocabulary is too large to fit, and a flat one for sampling."""
    directory = tmp_path_factory.mktemp("drafts")
    t = PAIRS["chain"][0]
    specs = {
        "good": TargetSpec(n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, weights="chain", seed=t.seed),
        "wider": TargetSpec(n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, n_vocab=t.n_vocab + 40,
                            weights="chain", seed=21),
        "foreign": TargetSpec(n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, n_vocab=t.n_vocab + 200, seed=22),
        # the chain of the chain-soft target, with a flat distribution of its own
        "soft": TargetSpec(n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, weights="chain", output_scale=0.1,
                           seed=PAIRS["chain-soft"][0].seed),
    }
    loaded = {name: eagle3.Model(write_target(directory / f"{name}.gguf", spec)) for name, spec in specs.items()}
    yield loaded
    for model in loaded.values():
        model.close()


def _walk(nxt, start: int, n: int) -> list[int]:
    out = [start]
    while len(out) < n:
        out.append(int(nxt[out[-1]]))
    return out


def grounded_prompts(nxt) -> list[np.ndarray]:
    """Prompts whose greedy continuation repeats their own text: a walk of the chain, then
    its first tokens again (what an edit or a quote of the input looks like)."""
    return [np.array(_walk(nxt, s, 40) + _walk(nxt, s, 5), np.int32) for s in (3, 50, 111)]


def _plain(ctx, prompt, n):
    return ctx.generate(prompt, n).tokens


@pytest.mark.parametrize("name", list(METHODS))
def test_ngram_greedy_output_is_the_targets_and_grounded_drafts_are_accepted(chain, name):
    target, nxt = chain
    prompts = grounded_prompts(nxt) + random_prompts(target.n_vocab, 3, seed=4)
    with eagle3.Context(target, n_ctx=256) as tctx, \
            eagle3.NgramSession(tctx, _method(name), n_draft_max=8, **METHODS[name]) as session:
        for prompt in prompts:
            g = session.generate(prompt, 48)
            np.testing.assert_array_equal(g.tokens, _plain(tctx, prompt, 48), err_msg=f"{name}: {prompt[:6]}")
        grounded = session.generate(grounded_prompts(nxt)[0], 32)
    if name != "simple-defaults":  # (llama.cpp's defaults look for 12-token matches)
        # the output repeats the prompt: the drafts come from it and the target keeps them
        assert grounded.stats.n_accepted >= 16, grounded.stats
        assert grounded.stats.n_rounds <= 16, grounded.stats


@pytest.mark.parametrize("name", ["simple", "map-k", "mod", "cache"])
def test_ngram_batches_keep_one_history_per_sequence(chain, name):
    target, nxt = chain
    prompts = grounded_prompts(nxt)
    with eagle3.Context(target, n_ctx=512, n_seq_max=3) as tctx, \
            eagle3.NgramSession(tctx, _method(name), n_seq=3, n_draft_max=6, **METHODS[name]) as session:
        batch = session.generate_batch(prompts, 30)
        for prompt, g in zip(prompts, batch):
            np.testing.assert_array_equal(g.tokens, _plain(tctx, prompt, 30))
        assert batch.stats.n_accepted >= 30


def test_ngram_auto_length_and_the_stream_give_the_same_tokens(chain):
    target, nxt = chain
    prompt = grounded_prompts(nxt)[1]
    with eagle3.Context(target, n_ctx=256) as tctx, \
            eagle3.NgramSession(tctx, "simple", n_draft_max=12, size_n=2, size_m=12) as session:
        plain = _plain(tctx, prompt, 40)
        auto = session.generate(prompt, 40, n_draft_max="auto", trace=True, logprobs=2)
        np.testing.assert_array_equal(auto.tokens, plain)
        assert auto.logprobs.shape == (40,) and auto.top_logprobs.shape == (40, 2)
        assert np.all(np.isnan(auto.trace["draft_p"]))  # an n-gram has no probabilities
        assert list(session.stream(prompt, 40)) == list(plain)
        assert session.stats()["n_accepted"] > 0


def test_ngram_step_by_step(chain):
    """The low-level loop: process every target decode, draft from the history, accept."""
    target, nxt = chain
    prompt = grounded_prompts(nxt)[0]
    with eagle3.Context(target, n_ctx=256) as tctx, \
            eagle3.NgramSession(tctx, "simple", n_draft_max=4, size_n=2, size_m=4) as session:
        assert session.draft_ctx is None and not session.need_embd_pre_norm
        batch = eagle3.Batch.from_tokens(prompt)
        tctx.decode(batch)
        session.process(batch)
        session.begin(0, prompt)
        last, n_past, accepted = tctx.argmax(), len(prompt), 0
        drafted = session.draft(0, n_past, last)
        assert len(drafted) == 4
        step = eagle3.Batch.from_tokens(np.concatenate([[last], drafted]).astype(np.int32), pos0=n_past,
                                        output="all")
        tctx.decode(step)
        session.process(step)
        while accepted < len(drafted) and tctx.argmax(accepted) == drafted[accepted]:
            accepted += 1
        session.accept(0, accepted)
        assert accepted == 4
        with pytest.raises(eagle3.SessionStateError):
            session.draft_logits()


@pytest.mark.parametrize("params, bad", [
    (dict(size_n=0), "size_n"), (dict(size_m=1025), "size_m"), (dict(min_hits=0), "min_hits"),
    (dict(n_match=0), "n_match"), (dict(mod_n_min=-1), "mod_n_min"), (dict(mod_n_max=2000), "mod_n_max"),
])
def test_ngram_parameters_out_of_range_are_refused(chain, params, bad):
    target, _ = chain
    method = "mod" if bad.startswith(("n_match", "mod")) else "map-k"
    with eagle3.Context(target, n_ctx=64) as tctx:
        with pytest.raises(eagle3.InvalidConfigError, match=bad):
            eagle3.NgramSession(tctx, method, **params)
        with eagle3.NgramSession(tctx, method) as session:  # the context is as it was
            assert session.generate([1, 2, 3], 4).tokens.shape == (4,)


def test_ngram_parameters_belong_to_their_method(chain):
    target, _ = chain
    with eagle3.Context(target, n_ctx=64) as tctx:
        with pytest.raises(eagle3.InvalidArgumentError, match="method"):
            eagle3.NgramSession(tctx, "lookup")
        with pytest.raises(eagle3.InvalidArgumentError, match="n_match"):
            eagle3.NgramSession(tctx, "simple", n_match=4)
        with pytest.raises(eagle3.ArgumentTypeError):
            eagle3.NgramSession(tctx, "cache", lookup_cache_static=3)
        with pytest.raises(eagle3.InvalidConfigError):
            eagle3.NgramSession(tctx, "simple", n_draft_max=0)
        with pytest.raises(eagle3.ArgumentTypeError):
            eagle3.NgramSession("not a context")
        # a verify batch of 1 + n_draft_max tokens must fit n_batch
        with pytest.raises(eagle3.SessionInitError, match="n_batch"):
            eagle3.NgramSession(tctx, "simple", n_draft_max=64)


def _cache_file(path, records) -> str:
    """An n-gram cache file in llama.cpp's format: per record 4 tokens (-1 pads), a count
    n and n (token, count) pairs."""
    with open(path, "wb") as f:
        for ngram, pairs in records:
            f.write(struct.pack("<4i", *(list(ngram) + [-1] * (4 - len(ngram)))))
            f.write(struct.pack("<i", len(pairs)))
            for token, count in pairs:
                f.write(struct.pack("<2i", token, count))
    return str(path)


def test_ngram_cache_files(chain, tmp_path):
    target, nxt = chain
    # a static cache of 2-grams along the chain: it proposes the chain's next token
    records = [((a, int(nxt[a])), [(int(nxt[int(nxt[a])]), 5)]) for a in range(target.n_vocab)]
    good = _cache_file(tmp_path / "good.bin", records)
    prompt = np.array([17, int(nxt[17])], np.int32)
    with eagle3.Context(target, n_ctx=128) as tctx:
        with eagle3.NgramSession(tctx, "cache", n_draft_max=8, lookup_cache_static=good) as session:
            g = session.generate(prompt, 24)
            np.testing.assert_array_equal(g.tokens, _plain(tctx, prompt, 24))
            assert g.stats.n_accepted > 0  # drafted from the file: the history alone has no repeats
        with eagle3.NgramSession(tctx, "cache", lookup_cache_static=_cache_file(tmp_path / "empty.bin", [])):
            pass


@pytest.mark.parametrize("kind", ["truncated", "token", "count", "missing", "directory"])
def test_bad_ngram_cache_files_raise_and_never_abort(chain, tmp_path, kind):
    target, _ = chain
    path = tmp_path / "cache.bin"
    if kind == "truncated":
        _cache_file(path, [((1, 2), [(3, 1), (4, 2)])])
        path.write_bytes(path.read_bytes()[:-3])
    elif kind == "token":
        _cache_file(path, [((1, 2), [(target.n_vocab + 5, 1)])])
    elif kind == "count":
        _cache_file(path, [((1, 2), [(3, 0)])])
    elif kind == "directory":
        path.mkdir()
    code = (f"import eagle3\nm = eagle3.Model({str(target.path)!r})\nc = eagle3.Context(m, n_ctx=64)\n"
            f"eagle3.NgramSession(c, 'cache', lookup_cache_dynamic={str(path)!r})")
    message = expect_exception(code, "SessionInitError")
    assert "cache" in message


def test_ngram_cache_starts_over_with_each_generation(chain):
    """A second generation's history is the cache's, however long the first one was."""
    target, nxt = chain
    long_prompt = np.array(random_prompts(target.n_vocab, 1, seed=9)[0].tolist() * 8, np.int32)
    grounded = grounded_prompts(nxt)[2]
    with eagle3.Context(target, n_ctx=512) as tctx:
        with eagle3.NgramSession(tctx, "cache", n_draft_max=8) as fresh:
            expected = fresh.generate(grounded, 24).stats.n_accepted
        with eagle3.NgramSession(tctx, "cache", n_draft_max=8) as reused:
            reused.generate(long_prompt, 24)
            assert reused.generate(grounded, 24).stats.n_accepted == expected > 0


def test_draft_model_greedy_output_is_the_targets(chain, draft_models):
    target, nxt = chain
    prompts = grounded_prompts(nxt) + random_prompts(target.n_vocab, 3, seed=5)
    for name in ("good", "wider"):
        with eagle3.Context(target, n_ctx=256) as tctx, \
                eagle3.Context(draft_models[name], n_ctx=256, n_threads=1) as dctx, \
                eagle3.DraftSession(tctx, dctx, n_draft_max=4) as session:
            for prompt in prompts:
                np.testing.assert_array_equal(session.generate(prompt, 32).tokens, _plain(tctx, prompt, 32),
                                              err_msg=name)
            stats = session.generation_stats
            if name == "good":  # the draft knows the target's chain
                assert stats.acceptance_rate > 0.9, stats


def test_draft_model_batches_and_rejection_trace(chain, draft_models):
    target, nxt = chain
    prompts = grounded_prompts(nxt)
    with eagle3.Context(target, n_ctx=256, n_seq_max=3) as tctx, \
            eagle3.Context(draft_models["good"], n_ctx=256, n_seq_max=3) as dctx, \
            eagle3.DraftSession(tctx, dctx, n_seq=3, n_draft_max=3) as session:
        for prompt, g in zip(prompts, session.generate_batch(prompts, 20)):
            np.testing.assert_array_equal(g.tokens, _plain(tctx, prompt, 20))
        g = session.generate(prompts[0], 12, temperature=0.9, seed=3, verify="rejection", trace=True)
        drafted = g.trace["n_drafted"]
        assert drafted.sum() > 0
        probs = g.trace["draft_p"][g.trace["drafted"] >= 0]
        assert np.all((probs > 0) & (probs <= 1))  # the draft's probability of each drafted token


def test_draft_model_pairs_that_do_not_fit(chain, draft_models, models):
    target, _ = chain
    with eagle3.Context(target, n_ctx=256) as tctx:
        with eagle3.Context(draft_models["foreign"], n_ctx=256) as dctx:
            with pytest.raises(eagle3.IncompatiblePairError, match="vocabulary") as info:
                eagle3.DraftSession(tctx, dctx)
            assert info.value.report.codes == ["vocabulary"] and info.value.kind == "draft"
            assert not eagle3.check_draft_model(target, draft_models["foreign"]).ok
        assert eagle3.check_draft_model(target, draft_models["good"]).ok
        with eagle3.Context(models["chain"][1], other=tctx) as eagle_ctx:
            with pytest.raises(eagle3.IncompatiblePairError, match="EAGLE-3"):
                eagle3.DraftSession(tctx, eagle_ctx)
        with eagle3.Context(draft_models["good"], n_ctx=128) as small:
            with pytest.raises(eagle3.SessionInitError, match="n_ctx"):
                eagle3.DraftSession(tctx, small)
        with eagle3.Context(draft_models["good"], n_ctx=256, n_seq_max=2) as two:
            with pytest.raises(eagle3.SessionInitError, match="n_seq"):
                eagle3.DraftSession(tctx, two)
        with pytest.raises(eagle3.SessionInitError):
            eagle3.DraftSession(tctx, tctx)
        # refused sessions leave the target usable
        assert tctx.generate([1, 2], 3).tokens.shape == (3,)


def test_closing_the_draft_context_closes_the_session(chain, draft_models):
    target, _ = chain
    tctx = eagle3.Context(target, n_ctx=128)
    dctx = eagle3.Context(draft_models["good"], n_ctx=128)
    session = eagle3.DraftSession(tctx, dctx)
    ngram = eagle3.NgramSession(tctx, "simple")
    dctx.close()
    assert session.closed and not ngram.closed
    tctx.close()
    assert ngram.closed
    with pytest.raises(eagle3.ClosedError):
        ngram.generate([1, 2], 2)


@pytest.mark.parametrize("drafter", ["ngram", "draft"])
def test_sampled_output_follows_the_targets_distribution(models, draft_models, drafter):
    """Rejection verification: a draft model's tokens are drawn from its own q and kept with
    probability min(1, p/q); an n-gram's proposal x is deterministic (q = 1 at x), so it is
    kept with probability p(x) and a rejection draws from p without x."""
    target, _ = models["chain-soft"]
    nxt = chain_map(PAIRS["chain-soft"][0])
    prompts = [np.array(_walk(nxt, s, 10) + _walk(nxt, s, 3), np.int32) for s in (5, 9, 40, 77)]
    n_samples, position = 2000, 2
    with eagle3.Context(target, n_ctx=64, n_seq_max=4) as tctx:
        if drafter == "ngram":
            session = eagle3.NgramSession(tctx, "simple", n_seq=4, n_draft_max=3, size_n=2, size_m=3)
        else:
            dctx = eagle3.Context(draft_models["soft"], n_ctx=64, n_seq_max=4)
            session = eagle3.DraftSession(tctx, dctx, n_seq=4, n_draft_max=3)

        def sample(generate, first_seed):
            out = []
            for call in range(n_samples // 4):
                batch = generate(prompts, position + 1, temperature=1.0, seed=first_seed + 4 * call)
                out.extend(int(g.tokens[position]) for g in batch)
            return np.array(out)

        speculative = sample(lambda *a, **k: session.generate_batch(*a, verify="rejection", **k), 0)
        stats = session.generation_stats
        plain = sample(tctx.generate_batch, 10**9)
        session.close()
    assert stats.n_drafted > n_samples // 2 and 0.1 < stats.acceptance_rate < 0.95, stats
    p_same = homogeneity_p(speculative, plain)
    assert p_same > 1e-3, f"{drafter}: speculative and plain sampling differ (p = {p_same:.2e})"


def test_a_start_refused_or_failed_after_changing_the_contexts(chain, tmp_path):
    """A start the checks refuse changes nothing (a stream in progress goes on); one that
    fails once it has changed the contexts ends the stream in progress."""
    import gguf
    from gguf_edit import rewrite

    target, _ = chain
    reader = gguf.GGUFReader(str(target.path))
    embd = np.array(next(t for t in reader.tensors if t.name == "token_embd.weight").data, np.float32)
    embd[7] = np.nan  # token 7 poisons every logit after it
    poisoned = rewrite(target.path, tmp_path / "poisoned.gguf", set_tensors={"token_embd.weight": embd})
    with eagle3.Model(poisoned) as model, eagle3.Context(model, n_ctx=128) as tctx, \
            eagle3.NgramSession(tctx, "simple", n_draft_max=4, size_n=2, size_m=4) as session:
        stream = session.stream([1, 2, 3], 16)
        first = next(stream)
        # refused by the checks: every token banned, or a grammar with no first token
        with pytest.raises(eagle3.InvalidArgumentError, match="no first token"):
            session.generate([4, 5], 4, temperature=1.0, logit_bias={t: -np.inf for t in range(model.n_vocab)})
        with pytest.raises(eagle3.InvalidArgumentError, match="no first token"):
            session.generate([4, 5], 4, grammar='root ::= "\\u00e9\\u00e9"')
        rest = list(stream)  # the stream went on
        assert [first, *rest] == session.generate([1, 2, 3], 16).tokens.tolist()

        stream = session.stream([1, 2, 3], 16)
        next(stream)
        with pytest.raises(eagle3.DecodeError, match="NaN"):
            session.generate([1, 7, 2], 4)  # fails at its first token, after decoding its prompt
        with pytest.raises(eagle3.SessionStateError):
            next(stream)
        assert session.generate([1, 2, 3], 4).tokens.shape == (4,)  # and the session goes on
