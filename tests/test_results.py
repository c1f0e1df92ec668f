"""Results that add up: tiny temperatures sample the top token, text joins its prompt, stop strings are checked."""

from __future__ import annotations

import numpy as np
import pytest

import eagle3
from eagle3 import shipped
from helpers import greedy


@pytest.mark.parametrize("temperature", [1e-6, 1e-4, 1e-3, 0.01, 0.02])
@pytest.mark.parametrize("truncation", [{}, {"top_k": 5}, {"top_p": 0.9}, {"min_p": 0.05}])
def test_tiny_temperatures_sample_the_greedy_tokens(chain_session, temperature, truncation):
    model = chain_session.target.model
    for prompt in ([5, 6, 7], [200, 3]):
        want = greedy(model, prompt, 30)
        got = chain_session.generate(prompt, 30, temperature=temperature, seed=3, verify="match", **truncation)
        assert got.tokens.tolist() == want
        plain = chain_session.target.generate(prompt, 30, temperature=temperature, seed=3, **truncation)
        assert plain.tokens.tolist() == want


@pytest.fixture(scope="module")
def shipped_session():
    target_path, draft_path = shipped.toy_pair()
    with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, eagle3.Context(tm, n_seq_max=2) as tctx, \
            eagle3.Context(dm, other=tctx) as dctx, eagle3.Eagle3Session(tctx, dctx, n_seq=2, n_draft_max=4) as session:
        yield session


@pytest.mark.parametrize("prompt", ["class Foo:\n    def", "import os\nimport", "x = [1, 2,", "def f(a, b):\n"])
def test_the_text_is_what_the_tokens_add_to_the_prompt(shipped_session, prompt):
    model = shipped_session.target.model
    prompt_tokens = model.tokenize(prompt)
    for g in (shipped_session.generate(prompt, 16), shipped_session.target.generate(prompt, 16),
              shipped_session.generate_batch([prompt, prompt + " x"], 16)[0]):
        joined = model.detokenize(np.concatenate([prompt_tokens, g.tokens]))
        assert model.detokenize(prompt_tokens) + g.text == joined
    stream = shipped_session.stream(prompt, 16)
    list(stream)
    assert model.detokenize(prompt_tokens) + stream.generation.text == \
        model.detokenize(np.concatenate([prompt_tokens, stream.generation.tokens]))


def test_the_text_keeps_the_space_before_a_word(shipped_session):
    # the model continues "def" with a name: its first token starts with a space
    g = shipped_session.generate("class Foo:\n    def", 4)
    assert g.text.startswith(" ") and not g.text.startswith("  ")


def test_a_stop_string_cuts_the_joined_text(shipped_session):
    full = shipped_session.generate("import os\nimport", 24)
    stop = full.text.strip()[2:5]
    g = shipped_session.generate("import os\nimport", 24, stop_strings=[stop])
    assert g.finish_reason == "stop" and stop not in g.text and full.text.startswith(g.text)


@pytest.mark.parametrize("stop_strings, error", [([""], eagle3.InvalidArgumentError),
                                                 (["ok", ""], eagle3.InvalidArgumentError),
                                                 ("abc", eagle3.ArgumentTypeError),
                                                 ({"abc"}, eagle3.ArgumentTypeError),
                                                 (["a", 1], eagle3.ArgumentTypeError),
                                                 (None, eagle3.ArgumentTypeError)])
def test_bad_stop_strings_are_refused(chain_session, stop_strings, error):
    with pytest.raises(error):
        chain_session.generate([5, 6, 7], 5, stop_strings=stop_strings)
    with pytest.raises(error):
        chain_session.target.generate([5, 6, 7], 5, stop_strings=stop_strings)
    assert chain_session.generate([5, 6, 7], 5).finish_reason == "length"


@pytest.mark.parametrize("prompt", ["class Foo:\n    def", "# héllo wörld, ünïcode: ", "x = 'é"])
def test_streamed_text_is_the_generations_text_in_whole_characters(shipped_session, prompt):
    stream = shipped_session.stream(prompt, 40, text=True)
    pieces = list(stream)
    assert all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == stream.generation.text
    assert not any(p.endswith("\ufffd") for p in pieces[:-1])
    with pytest.raises(eagle3.ArgumentTypeError):
        shipped_session.stream(prompt, 4, text="yes")


def test_the_end_of_the_context_logs_no_warning(chain_session, caplog):
    with caplog.at_level("WARNING", logger="eagle3"):
        g = chain_session.generate([5, 6, 7], 100000)
        plain = chain_session.target.generate([5, 6, 7], 100000)
    assert g.finish_reason == plain.finish_reason == "context"
    assert not [r for r in caplog.records if r.levelno >= 30]


def test_the_step_by_step_loop_runs_twice_once_both_caches_are_emptied(models):
    from helpers import speculative

    target, draft = models["chain"]
    with eagle3.Context(target) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=4) as session:
        for prompt in ([5, 6, 7], [9, 8], [5, 6, 7]):
            tctx.seq_rm(0)
            dctx.seq_rm(0)
            assert speculative(session, tctx, prompt, 30) == greedy(target, prompt, 30)
