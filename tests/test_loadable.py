"""Files that pass the GGUF reader but would make llama.cpp's loader or tokenizer abort.

Each case loads (and uses) the file in its own interpreter: an abort would show as a
signal, not as the eagle3 exception the case expects.
"""

from __future__ import annotations

import pytest

from conftest import expect_exception
from gguf_edit import T, rewrite

USE = """
m = eagle3.Model(sys.argv[1])
print(m.tokenize(sys.argv[2]))
with eagle3.Context(m) as c:
    c.generate([1, 2, 3], 4)
"""

EXPERT_CASES = {
    # expert_count, expert_used_count (scalar or per layer), group count, groups used
    "used-above-count": ({"expert_count": 4, "expert_used_count": 8}, "ModelLoadError"),
    "none-used": ({"expert_count": 4, "expert_used_count": 0}, "ModelLoadError"),
    "used-missing": ({"expert_count": 4}, "ModelLoadError"),
    "used-without-experts": ({"expert_used_count": 2}, "ModelLoadError"),
    "too-many-experts": ({"expert_count": 100000, "expert_used_count": 2}, "ModelLoadError"),
    "per-layer-used-above-count": ({"expert_count": 4, "expert_used_count": [2, 8]}, "ModelLoadError"),
    "groups-not-dividing": ({"expert_count": 6, "expert_used_count": 2, "expert_group_count": 4,
                             "expert_group_used_count": 1}, "ModelLoadError"),
    "groups-all-used": ({"expert_count": 8, "expert_used_count": 2, "expert_group_count": 4,
                         "expert_group_used_count": 4}, "ModelLoadError"),
    "groups-without-experts": ({"expert_group_count": 2}, "ModelLoadError"),
}


def _kv(arch: str, values: dict) -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, list):
            out[f"{arch}.{key}"] = ([int(v) for v in value], T.ARRAY, T.INT32)
        else:
            out[f"{arch}.{key}"] = (value, T.UINT32)
    return out


@pytest.mark.parametrize("case", sorted(EXPERT_CASES))
def test_inconsistent_expert_counts_are_refused(pair_paths, tmp_path, case):
    target, _ = pair_paths["random"]
    values, exc = EXPERT_CASES[case]
    path = rewrite(target, tmp_path / f"{case}.gguf", set_kv=_kv("llama", values))
    message = expect_exception(USE, exc, str(path), "abc")
    assert "expert" in message


@pytest.mark.parametrize("value", ["bogus", "", "YARN", "linear "])
def test_an_unknown_rope_scaling_type_is_refused(pair_paths, tmp_path, value):
    target, _ = pair_paths["random"]
    path = rewrite(target, tmp_path / "rope.gguf", set_kv={"llama.rope.scaling.type": (value, T.STRING)})
    assert "rope.scaling.type" in expect_exception(USE, "ModelLoadError", str(path), "abc")


@pytest.mark.parametrize("value", ["none", "linear", "yarn"])
def test_a_known_rope_scaling_type_loads(pair_paths, tmp_path, value):
    from conftest import run_python

    target, _ = pair_paths["random"]
    path = rewrite(target, tmp_path / "rope.gguf", set_kv={"llama.rope.scaling.type": (value, T.STRING)})
    result = run_python("import sys, eagle3\n" + USE, str(path), "abc")
    assert result.returncode == 0, result.stderr


def test_a_vocabulary_without_byte_tokens_cannot_tokenize_but_does_not_abort(pair_paths, tmp_path):
    target, _ = pair_paths["random"]
    path = rewrite(target, tmp_path / "spm.gguf", set_kv={"tokenizer.ggml.model": ("llama", T.STRING)})
    message = expect_exception(USE, "InvalidArgumentError", str(path), "é ü ∑ 漢字")
    assert "vocabulary cannot tokenize" in message


def test_a_model_read_into_memory_instead_of_mapped_decodes_the_same(pair_paths):
    import eagle3

    target, _ = pair_paths["chain"]
    outputs = []
    for use_mmap, use_mlock in ((None, False), (False, False), (True, False), (False, True)):
        with eagle3.Model(target, use_mmap=use_mmap, use_mlock=use_mlock) as model, eagle3.Context(model) as ctx:
            outputs.append(ctx.generate([5, 6, 7], 12).tokens.tolist())
    assert all(o == outputs[0] for o in outputs)
    with pytest.raises(eagle3.ArgumentTypeError):
        eagle3.Model(target, use_mmap="no")


@pytest.mark.parametrize("kv, code", [({"llama.attention.causal": (False, T.BOOL)}, "target-not-causal"),
                                      ({"llama.pooling_type": (1, T.UINT32)}, "target-not-causal")])
def test_a_model_that_is_not_a_causal_lm_is_refused_as_a_target_and_warned_about(pair_paths, tmp_path, kv, code,
                                                                                 caplog):
    import eagle3

    target, draft = pair_paths["random"]
    path = rewrite(target, tmp_path / "embedding.gguf", set_kv=kv)
    assert code in eagle3.check_pair(path, draft).codes
    with eagle3.Model(path) as model:
        with caplog.at_level("WARNING", logger="eagle3"):
            eagle3.Context(model).close()
    assert any("cannot generate" in r.getMessage() or "embedding model" in r.getMessage() for r in caplog.records)
    assert eagle3.check_pair(target, draft).ok
