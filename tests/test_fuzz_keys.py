"""Semantic fuzzing of the keys llama.cpp's loader and tokenizer read.

For each key the pinned loader reads for a llama or qwen3 target, its tokenizer and an
EAGLE-3 draft, files are written with the key missing, out of range, of the wrong
type and inconsistent with the rest; a worker process loads and uses each one (model,
tokenize, context, decode; for drafts a whole session). Every outcome must be success
or an eagle3 exception: a file that aborted would end the worker.
"""

from __future__ import annotations

import pytest

from gguf_edit import T, as_qwen3, rewrite
from test_fuzz_gguf import worker  # noqa: F401 (the same worker fixture)

# the keys of llm_load_hparams (general ones and llama's), llama_vocab::load and eagle3's
TARGET_KEYS = [
    "context_length", "embedding_length", "embedding_length_out", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "attention.causal", "attention.sliding_window", "pooling_type",
    "rope.dimension_count", "rope.freq_base", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.original_context_length", "rope.scaling.finetuned", "expert_count", "expert_used_count",
    "expert_shared_count", "expert_group_count", "expert_group_used_count", "nextn_predict_layers",
    "vocab_size", "logit_scale",
]
TOKENIZER_KEYS = [
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
]
DRAFT_KEYS = ["eagle3.target_hidden_size", "eagle3.norm_before_residual", "eagle3.norm_before_fc",
              "eagle3.block_count", "eagle3.embedding_length", "eagle3.attention.head_count",
              "eagle3.feed_forward_length", "eagle3.vocab_size"]

VALUES = [
    ("zero", 0, T.UINT32), ("one", 1, T.UINT32), ("int32-max", 2**31 - 1, T.UINT32),
    ("uint32-max", 2**32 - 1, T.UINT32), ("minus-one", -1, T.INT32), ("float", 1.5, T.FLOAT32),
    ("nan", float("nan"), T.FLOAT32), ("string", "7", T.STRING), ("bool", True, T.BOOL),
    ("array", [1, 2], T.ARRAY),
]
STRING_VALUES = {  # keys whose values are names
    "tokenizer.ggml.model": ["llama", "gpt2", "bert", "t5", "rwkv", "none", "no_vocab", "bogus", ""],
    "tokenizer.ggml.pre": ["default", "llama3", "qwen2", "bogus", ""],
    "rope.scaling.type": ["none", "linear", "yarn", "longrope", "bogus"],
}


def _cases(keys: list[str], prefix: str):
    for key in keys:
        name = f"{prefix}{key}" if not key.startswith(("tokenizer.", "eagle3.")) else key
        yield name, None, None  # missing
        for label, value, gguf_type in VALUES:
            yield name, label, (value, gguf_type)
        for value in STRING_VALUES.get(key, []):
            yield name, f"name-{value or 'empty'}", (value, T.STRING)


TARGET_CASES = list(_cases(TARGET_KEYS, "{arch}.")) + list(_cases(TOKENIZER_KEYS, "")) + [
    ("tokenizer.ggml.model", f"name-{v or 'empty'}", (v, T.STRING)) for v in STRING_VALUES["tokenizer.ggml.model"]
] + [("tokenizer.ggml.pre", f"name-{v or 'empty'}", (v, T.STRING)) for v in STRING_VALUES["tokenizer.ggml.pre"]]
DRAFT_CASES = list(_cases(DRAFT_KEYS, ""))


def _kv(value):
    if value is None:
        return {}
    v, gguf_type = value
    return (v, T.ARRAY, T.INT32) if gguf_type == T.ARRAY else (v, gguf_type)


def _run(worker, source, tmp_path, key, label, value):
    out = tmp_path / "case.gguf"
    if value is None:
        rewrite(source, out, drop_kv=[key])
    else:
        rewrite(source, out, set_kv={key: _kv(value)})
    reply = worker.run(out)
    assert reply == "ok" or reply.startswith("error "), f"{key} = {label}: {reply}"


@pytest.fixture(scope="module")
def targets(tiny_pair, tmp_path_factory):
    """arch -> a target of that architecture (the tiny pair's, rewritten)."""
    return {"llama": tiny_pair[0], "qwen3": as_qwen3(tiny_pair[0], tmp_path_factory.mktemp("qwen3") / "t.gguf")}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("key, label, value", TARGET_CASES,
                         ids=[f"{k.replace('{arch}.', '')}={lbl}" for k, lbl, _ in TARGET_CASES])
def test_target_keys(worker, targets, tmp_path, arch, key, label, value):
    _run(worker, targets[arch], tmp_path, key.format(arch=arch), label, value)


@pytest.mark.parametrize("key, label, value", DRAFT_CASES, ids=[f"{k}={lbl}" for k, lbl, _ in DRAFT_CASES])
def test_draft_keys(worker, tiny_pair, tmp_path, key, label, value):
    _run(worker, tiny_pair[1], tmp_path, key, label, value)


TOKEN_ID_KEYS = ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                 "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eot_token_id"]


@pytest.mark.parametrize("key", TOKEN_ID_KEYS)
@pytest.mark.parametrize("offset", [0, 1, 1000])
def test_special_token_ids_past_the_vocabulary(worker, tiny_pair, tmp_path, key, offset):
    import eagle3

    n_vocab = len(eagle3.read_gguf(tiny_pair[0])[0]["tokenizer.ggml.tokens"])
    _run(worker, tiny_pair[0], tmp_path, key, f"n_vocab+{offset}", (n_vocab + offset, T.UINT32))


@pytest.mark.parametrize("key, length", [("tokenizer.ggml.scores", 3), ("tokenizer.ggml.token_type", 3)])
def test_tokenizer_arrays_of_the_wrong_length(worker, tiny_pair, tmp_path, key, length):
    value = ([0.5] * length, T.ARRAY, T.FLOAT32) if key.endswith("scores") else ([1] * length, T.ARRAY, T.INT32)
    out = tmp_path / "case.gguf"
    rewrite(tiny_pair[0], out, set_kv={key: value})
    reply = worker.run(out)
    assert reply == "ok" or reply.startswith("error "), reply
