"""Files that pass the GGUF reader but would make llama.cpp's loader or tokenizer abort.

Each case loads (and uses) the file in its own interpreter: an abort would show as a
signal, not as the eagle3 exception the case expects.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import expect_exception
from gguf_edit import T, as_qwen3, rewrite

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


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("n_rot", [0, 8, 32])
def test_rope_that_does_not_rotate_whole_heads_is_refused_where_the_graph_needs_it(pair_paths, tmp_path, arch, n_rot):
    target, _ = pair_paths["random"]  # heads of 16 dimensions
    if arch == "qwen3":
        target = as_qwen3(target, tmp_path / "qwen3.gguf")
    path = rewrite(target, tmp_path / "rot.gguf", set_kv={f"{arch}.rope.dimension_count": (n_rot, T.UINT32)})
    assert "rope.dimension_count" in expect_exception(USE, "ModelLoadError", str(path), "abc")


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
    with pytest.raises(eagle3.ArgumentTypeError):
        eagle3.Model(target, repack=0)


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


def _with_weights(src, dst, fill):
    """``src`` with every weight matrix (float tensors of two or more dimensions) passed through ``fill``."""
    from gguf_edit import gguf

    reader = gguf.GGUFReader(str(src))
    changed = {t.name: fill(np.array(t.data)) for t in reader.tensors
               if len(t.shape) >= 2 and np.array(t.data).dtype.kind == "f"}
    assert changed
    return rewrite(src, dst, set_tensors=changed)


def _poison(value):
    def fill(w):
        w = w.copy()
        w.flat[:: max(1, w.size // 7)] = value
        return w
    return fill


GENERATE_EACH_WAY = """
m = eagle3.Model(sys.argv[1]); d = eagle3.Model(sys.argv[2])
t = eagle3.Context(m); dc = eagle3.Context(d, other=t)
s = eagle3.Eagle3Session(t, dc, n_draft_max=3)
def step_by_step():
    t.clear()
    t.decode(eagle3.Batch.from_tokens([1, 2, 3]))
    t.argmax(-1)

for call in (lambda: t.generate([1, 2, 3], 8), lambda: s.generate([1, 2, 3], 8),
             lambda: s.generate([1, 2, 3], 8, temperature=0.8, seed=1), step_by_step):
    try:
        call()
    except eagle3.DecodeError as e:
        print("DecodeError", e)
s.generate([1, 2, 3], 8)
"""


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_target_with_nan_or_inf_weights_raises_instead_of_generating_garbage(pair_paths, tmp_path, value):
    target, draft = pair_paths["random"]
    path = _with_weights(target, tmp_path / "poisoned.gguf", _poison(value))
    out = expect_exception(GENERATE_EACH_WAY, "DecodeError", str(path), str(draft))
    # every way of generating says so, and a next call fails the same way (no state error)
    assert out.count("DecodeError") == 4 + 1 and out.count("NaN or +inf") == 5


def test_a_model_with_all_zero_weights_is_warned_about(pair_paths, tmp_path, caplog):
    import eagle3

    target, draft = pair_paths["random"]
    zero = _with_weights(target, tmp_path / "zero.gguf", np.zeros_like)
    zero_draft = _with_weights(draft, tmp_path / "zero-draft.gguf", np.zeros_like)
    with eagle3.Model(zero) as tm, eagle3.Model(zero_draft) as dm, caplog.at_level("WARNING", logger="eagle3"):
        with eagle3.Context(tm) as tc, eagle3.Context(dm, other=tc):
            tc.generate([1, 2, 3], 4)
    warned = [r.getMessage() for r in caplog.records if "weights look unset" in r.getMessage()]
    assert len(warned) == 2 and str(zero) in warned[0] and str(zero_draft) in warned[1]
    caplog.clear()
    with eagle3.Model(target) as tm, caplog.at_level("WARNING", logger="eagle3"):
        eagle3.Context(tm).close()
    assert not caplog.records
