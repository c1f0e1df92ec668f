"""Facts eagle3 states once and every other layer follows: the sampling options (C's
``e3_sampling`` and :class:`eagle3.SamplingParams`) and the counters (``E3_COUNTER_FIELDS``
and :class:`eagle3.GenerationStats`)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

import eagle3
from eagle3 import cli, sampling
from eagle3.stats import GenerationStats

SRC = Path(__file__).resolve().parent.parent / "src" / "eagle3"
needs_source = pytest.mark.skipif(not (SRC / "shim").is_dir(), reason="needs the source tree")


def _c_struct_fields(text: str, name: str) -> list[str]:
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return [m.group(1) for m in re.finditer(r"(\w+)\s*;", body)]


def _pxd_struct_fields(name: str) -> list[str]:
    text = (SRC / "_shim.pxd").read_text()
    body = re.search(r"ctypedef struct %s:\n((?:        .*\n)+)" % name, text).group(1)
    return [line.split()[-1].lstrip("*") for line in body.splitlines() if line.strip()]


@needs_source
def test_sampling_params_mirror_the_c_struct_field_for_field():
    c_fields = _c_struct_fields((SRC / "shim" / "eagle3_engine.h").read_text(), "e3_sampling")
    assert _pxd_struct_fields("e3_sampling") == c_fields
    # a C array and its length are one Python field
    assert list(sampling.FIELDS) == [f for f in c_fields if f != "n_logit_bias"]
    assert "n_logit_bias" in c_fields
    # and the extension fills every one of them from a SamplingParams
    extension = "".join(path.read_text() for path in SRC.glob("_core*.p*"))
    filled = re.findall(r"self\.req\.sampling\.(\w+) =", extension)
    assert sorted(filled) == sorted(c_fields)


@needs_source
def test_the_counters_are_listed_once():
    text = (SRC / "shim" / "eagle3_shim.h").read_text()
    listed = re.findall(r"X\((?:int64_t|double),\s*(\w+)\)", text)
    assert len(listed) == len(set(listed)) > 10
    assert _pxd_struct_fields("e3_counters") == listed
    histograms = {"accepted_per_position", "draft_lengths"}
    assert [f.name for f in dataclasses.fields(GenerationStats) if f.name not in histograms] == listed
    # nothing else spells the list out again
    util = (SRC / "shim" / "shim_util.hpp").read_text()
    assert "E3_COUNTER_FIELDS" in util and "c.n_prompt +=" not in util


def test_the_command_line_has_one_option_per_sampling_field(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    text = capsys.readouterr().out
    for name in sampling.FIELDS:
        assert "--" + name.replace("_", "-") in text


def test_sampling_params_check_types_and_names():
    p = eagle3.SamplingParams(temperature=1, top_k=np.int64(5), logit_bias={3: -1, np.int32(4): float("-inf")})
    assert p.temperature == 1.0 and isinstance(p.temperature, float) and p.top_k == 5
    assert p.logit_bias == ((3, -1.0), (4, float("-inf")))
    assert p.replace(seed=7) == dataclasses.replace(p, seed=7) and p.seed is None
    hash(p)  # frozen, and its fields are hashable
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5
    for bad in (dict(temperature="hot"), dict(top_k=1.5), dict(top_k=True), dict(logit_bias=[1, 2]),
                dict(logit_bias="x"), dict(grammar=3), dict(seed=-1), dict(seed=2**64), dict(penalty_last_n=None)):
        with pytest.raises((eagle3.ArgumentTypeError, eagle3.InvalidArgumentError)):
            eagle3.SamplingParams(**bad)
    with pytest.raises(eagle3.InvalidArgumentError, match="verify"):
        eagle3.SamplingParams(verify="maybe")
    with pytest.raises(eagle3.ArgumentTypeError, match="unknown sampling option.*temprature"):
        p.replace(temprature=1.0)


def test_generate_takes_sampling_params_and_keyword_overrides(chain_session):
    params = eagle3.SamplingParams(temperature=0.9, top_k=40, seed=5)
    by_params = chain_session.generate("ab", 24, params)
    by_keywords = chain_session.generate("ab", 24, temperature=0.9, top_k=40, seed=5)
    assert np.array_equal(by_params.tokens, by_keywords.tokens)
    # a keyword overrides the params' field; the params object is unchanged
    greedy = chain_session.generate("ab", 24, params, temperature=0.0)
    assert np.array_equal(greedy.tokens, chain_session.generate("ab", 24).tokens)
    assert params.temperature == 0.9
    batch = chain_session.generate_batch(["ab", "ab"], 24, params)
    assert np.array_equal(batch[0].tokens, by_params.tokens)  # sequence i draws from seed + i
    streamed = list(chain_session.stream("ab", 24, params))
    assert streamed == by_params.tokens.tolist()
    plain = chain_session.target.generate("ab", 24, params.replace(verify="match"))
    assert len(plain.tokens) == 24
    with pytest.raises(eagle3.ArgumentTypeError, match="SamplingParams"):
        chain_session.generate("ab", 4, {"temperature": 1.0})
    with pytest.raises(eagle3.ArgumentTypeError, match="unknown sampling option"):
        chain_session.generate("ab", 4, temprature=1.0)
    with pytest.raises(eagle3.InvalidArgumentError):
        chain_session.generate("ab", 4, params, top_p=-1.0)  # a range: the engine's


def test_the_command_line_builds_sampling_params(monkeypatch, chain_pair, capsys, tmp_path):
    seen = []
    real = eagle3.Eagle3Session.generate

    def spy(self, prompt, n, sampling=None, **kwargs):
        seen.append(sampling)
        return real(self, prompt, n, sampling, **kwargs)

    monkeypatch.setattr(eagle3.Eagle3Session, "generate", spy)
    target, draft = chain_pair
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= "a"+\n')
    rc = cli.main(["generate", "ab", "-n", "4", "--target", str(target), "--draft", str(draft), "--no-chat", "--temperature", "0.5", "--typical-p", "0.9", "--penalty-last-n", "8",
                   "--logit-bias", "5=-inf", "--logit-bias", "6=1.5", "--grammar", str(grammar), "--seed", "3",
                   "--verify", "match", "--n-draft-max", "2", "--json"])
    assert rc == 0
    json.loads(capsys.readouterr().out)
    (params,) = seen
    assert params == eagle3.SamplingParams(temperature=0.5, typical_p=0.9, penalty_last_n=8,
                                           logit_bias={5: float("-inf"), 6: 1.5}, grammar='root ::= "a"+\n',
                                           seed=3, verify="match")
