"""llama.cpp's sampler chain in plain and speculative generation: logit bias, penalties,
typical-p, grammars and JSON schemas, log-probabilities, the per-round trace, and chat
templates. Seeded "match" verification and greedy decoding stay token for token the same
with and without speculation, whatever the chain holds."""

from __future__ import annotations

import json

import numpy as np
import pytest

import eagle3
from eagle3 import shipped
from gguf_edit import CHATML, T, rewrite

CHAINS = {
    "typical": dict(temperature=0.9, typical_p=0.8),
    "penalties": dict(temperature=0.8, repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.3,
                      penalty_last_n=16),
    "bias": dict(temperature=1.0, top_k=40, logit_bias={3: 2.0, 7: -np.inf, 11: -1.5}),
    "greedy-with-penalties": dict(presence_penalty=5.0, penalty_last_n=-1),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_match_verification_is_plain_sampling_token_for_token(chain_session, name):
    session = chain_session
    tctx = session.target
    for seed, prompt in enumerate([[5, 6, 7], [9, 9], [1, 2, 3, 4]]):
        spec = session.generate(prompt, 40, seed=seed, verify="match", **CHAINS[name])
        plain = tctx.generate(prompt, 40, seed=seed, **CHAINS[name])
        assert spec.tokens.tolist() == plain.tokens.tolist()
    assert session.generation_stats.n_accepted > 0  # (the drafts took part)


def test_logit_bias_bans_and_favours(chain_session):
    tctx = chain_session.target
    free = tctx.generate([5, 6, 7], 24).tokens
    banned = tctx.generate([5, 6, 7], 24, logit_bias={int(t): -np.inf for t in free}).tokens
    assert not set(banned.tolist()) & set(free.tolist())
    assert set(tctx.generate([5, 6, 7], 8, logit_bias={42: 1e4}).tokens.tolist()) == {42}


def test_a_presence_penalty_keeps_tokens_from_coming_back(chain_session):
    tctx = chain_session.target
    prompt = [5, 6, 7]
    tokens = tctx.generate(prompt, 40, presence_penalty=1e4, penalty_last_n=-1).tokens.tolist()
    assert len(set(tokens + prompt)) == len(tokens + prompt)
    # over a window of 8 only the last 8 are kept away
    tokens = tctx.generate(prompt, 200, presence_penalty=1e4, penalty_last_n=8).tokens.tolist()
    window = prompt + tokens
    assert all(window[i] not in window[max(0, i - 8):i] for i in range(3, len(window)))


def test_logprobs_are_the_targets_log_softmax_and_equal_with_speculation(chain_session):
    session = chain_session
    tctx = session.target
    prompt = [5, 6, 7]
    plain = tctx.generate(prompt, 16, logprobs=4)
    tctx.clear()
    tctx.decode(eagle3.Batch.from_tokens(prompt))
    logits = np.array(tctx.logits(-1), np.float64)
    log_softmax = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    assert plain.logprobs.dtype == np.float32 and plain.logprobs.shape == (16,)
    assert plain.top_tokens.shape == plain.top_logprobs.shape == (16, 4)
    assert plain.top_tokens[0, 0] == plain.tokens[0] == int(np.argmax(logits))  # (greedy)
    np.testing.assert_allclose(plain.logprobs[0], log_softmax[plain.tokens[0]], atol=1e-5)
    np.testing.assert_allclose(plain.top_logprobs[0], np.sort(log_softmax)[::-1][:4], atol=1e-5)
    spec = session.generate(prompt, 16, logprobs=4)  # (greedy: exact whatever the verification)
    assert spec.tokens.tolist() == plain.tokens.tolist()
    np.testing.assert_allclose(spec.logprobs, plain.logprobs, atol=1e-5)
    np.testing.assert_array_equal(spec.top_tokens, plain.top_tokens)


def test_logprobs_after_truncation_are_over_what_is_left(chain_session):
    session = chain_session
    g = session.generate([5, 6, 7], 20, temperature=0.8, top_k=3, seed=1, logprobs=5)
    assert np.all(g.logprobs <= 0) and np.all(g.top_tokens[:, 3:] == -1)
    assert np.all(np.isneginf(g.top_logprobs[:, 3:]))
    np.testing.assert_allclose(np.exp(g.top_logprobs[:, :3]).sum(1), 1.0, atol=1e-5)
    rows = np.arange(len(g.tokens))
    assert np.all((g.top_tokens == g.tokens[:, None]).any(1))
    mine = np.array([g.top_logprobs[i, list(g.top_tokens[i]).index(t)] for i, t in zip(rows, g.tokens)])
    np.testing.assert_allclose(mine, g.logprobs, atol=1e-6)


@pytest.mark.parametrize("verify", ["match", "rejection"])
def test_the_trace_accounts_for_every_token(chain_session, verify):
    session = chain_session
    g = session.generate([5, 6, 7], 60, temperature=0.7, seed=3, verify=verify, trace=True)
    tr = g.trace
    n = len(tr["round"])
    assert n > 0 and np.all(np.diff(tr["round"]) > 0)
    assert tr["drafted"].shape == tr["draft_p"].shape == (n, session.n_draft_max)
    assert np.all((0 <= tr["n_accepted"]) & (tr["n_accepted"] <= tr["n_drafted"]))
    # one token at the prompt, then each round's accepted drafts and one of the target's
    assert 1 + int((tr["n_accepted"] + 1).sum()) >= len(g.tokens) > int((tr["n_accepted"] + 1)[:-1].sum())
    at = 1
    for row in range(n):
        k, kept = tr["n_drafted"][row], tr["n_accepted"][row]
        assert np.all(tr["drafted"][row, k:] == -1) and np.all(tr["drafted"][row, :k] >= 0)
        assert np.all((tr["draft_p"][row, :k] > 0) & (tr["draft_p"][row, :k] <= 1))
        assert np.all(np.isnan(tr["draft_p"][row, k:]))
        # the accepted drafts are the tokens emitted there
        emitted = g.tokens[at:at + kept]
        assert emitted.tolist() == tr["drafted"][row, :len(emitted)].tolist()
        at += kept + 1
    assert g.trace["t_verify_s"].min() > 0
    assert session.generate([5, 6, 7], 8).trace is None


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "count"]}


@pytest.fixture(scope="module")
def shipped_session():
    t, d = shipped.toy_pair()
    with eagle3.Model(t) as tm, eagle3.Model(d) as dm, eagle3.Context(tm) as tc, \
            eagle3.Context(dm, other=tc) as dc, eagle3.Eagle3Session(tc, dc, n_draft_max=4) as session:
        yield tc, session


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.8, seed=5, verify="match"),
                                      dict(temperature=0.8, seed=5, verify="rejection")])
def test_json_schema_output_parses_and_follows_the_schema(shipped_session, sampling):
    tctx, session = shipped_session
    for prompt in ("config = ", "def f(x):"):
        g = session.generate(prompt, 120, json_schema=SCHEMA, **sampling)
        assert g.finish_reason == "stop", g.text
        value = json.loads(g.text)
        assert set(value) == {"name", "count"} and isinstance(value["name"], str) and len(value["name"]) <= 10
        assert isinstance(value["count"], int) and 0 <= value["count"] <= 99
        if sampling.get("verify") != "rejection":  # and with speculation it is what plain decoding gives
            assert g.tokens.tolist() == tctx.generate(prompt, 120, json_schema=SCHEMA, **sampling).tokens.tolist()


def test_a_gbnf_grammar_constrains_every_token(shipped_session):
    _, session = shipped_session
    grammar = 'root ::= "x = " [0-9]+ ("," " "? [0-9]+)* "\\n"'
    g = session.generate("def f():\n    return", 40, grammar=grammar, temperature=0.9, seed=2)
    assert g.finish_reason == "stop"
    import re

    assert re.fullmatch(r"x = [0-9]+(, ?[0-9]+)*\n", g.text), g.text


@pytest.mark.parametrize("grammar, words", [("root ::= [a-", "grammar"), ("root ::= (", "grammar"),
                                             ('root ::= "a" undefined', "grammar"), ("x ::= \"a\"", "grammar")])
def test_a_grammar_that_does_not_parse_is_refused(shipped_session, grammar, words):
    _, session = shipped_session
    with pytest.raises(eagle3.InvalidArgumentError, match=words):
        session.generate("x", 4, grammar=grammar)
    assert session.generate("x", 4).tokens.size  # (nothing changed)


def test_sampling_argument_errors(chain_session):
    session = chain_session
    for kwargs, error in [(dict(logit_bias=[1, 2]), eagle3.ArgumentTypeError),
                          (dict(logit_bias={10**6: 1.0}), eagle3.InvalidArgumentError),
                          (dict(logit_bias={1: np.nan}), eagle3.InvalidArgumentError),
                          (dict(typical_p=0.0), eagle3.InvalidArgumentError),
                          (dict(repeat_penalty=0.0), eagle3.InvalidArgumentError),
                          (dict(penalty_last_n=-2), eagle3.InvalidArgumentError),
                          (dict(logprobs=-1), eagle3.InvalidArgumentError),
                          (dict(trace=1), eagle3.ArgumentTypeError),
                          (dict(grammar="root ::= \"a\"", json_schema={}), eagle3.InvalidArgumentError),
                          (dict(json_schema="{}"), eagle3.ArgumentTypeError),
                          (dict(json_schema={"type": "nothing-known"}), eagle3.InvalidArgumentError)]:
        with pytest.raises(error):
            session.generate([1, 2], 4, **kwargs)


def test_a_chat_template_from_the_gguf(tiny_pair, tmp_path):
    target, _ = tiny_pair
    path = rewrite(target, tmp_path / "chat.gguf", set_kv={"tokenizer.chat_template": (CHATML, T.STRING)})
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    with eagle3.Model(path) as model:
        assert model.chat_template == CHATML
        assert model.apply_chat_template(messages) == \
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        assert model.apply_chat_template(messages[1:], add_generation_prompt=False) == \
            "<|im_start|>user\nhi<|im_end|>\n"
        assert model.chat_tokens(messages).dtype == np.int32
        with pytest.raises(eagle3.ArgumentTypeError):
            model.apply_chat_template([{"role": "user"}])
        with pytest.raises(eagle3.InvalidArgumentError, match="template"):
            model.apply_chat_template(messages, template="{% for m in messages %}{{ m.content }")
    with eagle3.Model(target) as model:
        assert model.chat_template is None
        with pytest.raises(eagle3.InvalidArgumentError, match="no chat template"):
            model.apply_chat_template(messages)
        assert model.apply_chat_template(messages, template=CHATML).endswith("<|im_start|>assistant\n")


HANGS_UNPATCHED = r"""
import sys, eagle3
from eagle3 import shipped
with eagle3.Model(shipped.toy_pair()[0]) as m, eagle3.Context(m) as c:
    for kwargs in (dict(grammar='root ::= "x" [a-z]{5,2}'),
                   dict(json_schema={"type": "string", "minLength": 5, "maxLength": 2})):
        try:
            c.generate("x", 4, **kwargs)
            print("generated")
        except eagle3.InvalidArgumentError:
            print("refused")
"""


def test_repetitions_whose_maximum_is_below_their_minimum_are_refused_not_looped_on():
    from conftest import run_python

    result = run_python(HANGS_UNPATCHED, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["refused"] * 2
