"""Files of the architectures eagle3 can draft for (and their relatives) whose values would
make llama.cpp abort while making a context or at the first decode: each is refused at load
with a ModelLoadError naming what is wrong, and the well-formed file of each architecture
loads and decodes, with flash attention on and off. Each case runs in its own interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from arch_files import T, write
from conftest import expect_exception, run_python
from gguf_edit import rewrite

DECODE = """
m = eagle3.Model(sys.argv[1])
with eagle3.Context(m, flash_attn=sys.argv[2] == "1") as c:
    c.decode(eagle3.Batch.from_tokens(list(range(8))))
    c.logits(-1)
"""

MOE = {"NEXP": 4, "NUSED": 2}
GPT_OSS = {**MOE, "ROT": 16, "DK": 16, "DV": 16}
WELL_FORMED = {
    "llama": {}, "qwen3": {}, "qwen3moe": MOE, "minimax-m2": MOE, "gpt-oss": GPT_OSS, "gemma4": {"DKS": 16},
}

REFUSED = {  # name: (arch, parameters, words of the message)
    "kv-heads-not-dividing": ("llama", {"H": 4, "HKV": 3}, "must divide"),
    "kv-heads-per-layer": ("llama", {"HKV": [2, 4]}, "differ between layers"),
    "key-not-value": ("llama", {"DK": 16, "DV": 8}, "value_length"),
    "qwen3-key-not-value": ("qwen3", {"DK": 16, "DV": 8}, "value_length"),
    "qwen3-partial-rope": ("qwen3", {"ROT": 8}, "whole heads"),
    "qwen3moe-kv-heads-not-dividing": ("qwen3moe", {**MOE, "H": 4, "HKV": 3}, "must divide"),
    "expert-used-negative": ("llama", {**MOE, "FFEXP": 64,
                                       "extra_kv": {"expert_used_count": ([-1, 2], T.ARRAY, T.INT32)}},
                             "expert_used_count"),
    "expert-used-zero-in-layer-0": ("llama", {**MOE, "FFEXP": 64,
                                              "extra_kv": {"expert_used_count": ([0, 2], T.ARRAY, T.UINT32)}},
                                    "expert_used_count"),
    "minimax-no-gating": ("minimax-m2", {**MOE, "drop_kv": ["expert_gating_func"]}, "expert_gating_func"),
    "minimax-unknown-gating": ("minimax-m2", {**MOE, "extra_kv": {"expert_gating_func": (9, T.UINT32)}},
                               "expert_gating_func"),
    "minimax-rope-over-head": ("minimax-m2", {**MOE, "ROT": 32}, "rope.dimension_count"),
    "minimax-rope-odd": ("minimax-m2", {**MOE, "ROT": 7}, "rope.dimension_count"),
    "gpt-oss-head-not-rope": ("gpt-oss", {**GPT_OSS, "DK": 8, "DV": 8}, "rope.dimension_count"),
    "gpt-oss-rope-odd": ("gpt-oss", {**GPT_OSS, "ROT": 15, "DK": 15, "DV": 15}, "even"),
    "gpt-oss-no-sliding-layer": ("gpt-oss", {**GPT_OSS, "extra_kv": {
        "attention.sliding_window_pattern": (1, T.UINT32)}}, "sliding"),
    "gpt-oss-f16-sinks": ("gpt-oss", {**GPT_OSS, "tensor_type": {"blk.0.attn_sinks.weight": np.float16}}, "f32"),
    "gemma4-no-sliding-layer": ("gemma4", {"DKS": 16, "extra_kv": {
        "attention.sliding_window_pattern": ([False, False], T.ARRAY, T.BOOL)}}, "sliding"),
    "gemma4-one-full-layer": ("gemma4", {"L": 1, "DKS": 16, "extra_kv": {
        "attention.sliding_window_pattern": ([False], T.ARRAY, T.BOOL)}}, "sliding"),
    "gemma4-key-not-value": ("gemma4", {"DK": 32, "DV": 16, "DKS": 16}, "value_length"),
    "gemma4-kv-heads-not-dividing": ("gemma4", {"DKS": 16, "H": 4, "HKV": 3}, "must divide"),
    "gemma4-sliding-rope-over-head": ("gemma4", {"DK": 32, "DV": 32, "DKS": 16, "ROT": 32},
                                      "rope.dimension_count_swa"),
    "gemma4-f16-rope-freqs": ("gemma4", {"DKS": 16, "tensor_type": {"rope_freqs.weight": np.float16}}, "f32"),
    "gemma4-too-few-own-caches": ("gemma4", {"L": 3, "DKS": 16, "extra_kv": {
        "attention.shared_kv_layers": (2, T.UINT32)}}, "shared_kv_layers"),
    "gemma4-nothing-to-share": ("gemma4", {"L": 3, "DKS": 16, "extra_kv": {
        "attention.sliding_window_pattern": ([False, True, True], T.ARRAY, T.BOOL),
        "attention.shared_kv_layers": (1, T.UINT32)}}, "shared_kv_layers"),
}


@pytest.mark.parametrize("flash_attn", ["0", "1"])
@pytest.mark.parametrize("arch", sorted(WELL_FORMED))
def test_a_well_formed_file_of_each_architecture_decodes(tmp_path, arch, flash_attn):
    path = tmp_path / f"{arch}.gguf"
    write(path, arch, WELL_FORMED[arch])
    result = run_python("import sys, eagle3\n" + DECODE, str(path), flash_attn)
    assert result.returncode == 0, result.stderr[-3000:]


# grouped-query attention, 4 query heads per K/V head; gpt-oss's sinks differ per head
GROUPED_HEADS = {"llama": {"H": 8, "HKV": 2},
                 "gpt-oss": {**GPT_OSS, "H": 8, "HKV": 2, "SINKS": [-2.0, -1.0, 0.0, 1.0, 2.5, 0.5, -0.5, 1.5]}}


@pytest.mark.parametrize("arch", sorted(GROUPED_HEADS))
def test_flash_attention_keeps_each_query_head_its_own_in_shared_tiles(tmp_path, arch):
    """Flash attention's tiles take the rows of all the query heads that read one K/V
    head: each row keeps its head's sink and mask, so the logits are close to those
    without flash attention, and a pass of k tokens gives each token its one-token
    logits bit for bit."""
    import eagle3

    path = tmp_path / f"{arch}.gguf"
    write(path, arch, GROUPED_HEADS[arch])
    tokens = np.random.default_rng(3).integers(0, 64, 40).astype(np.int32)
    with eagle3.Model(path) as model:
        logits = {}
        for flash_attn in (False, True):
            with eagle3.Context(model, n_ctx=128, flash_attn=flash_attn) as ctx:
                ctx.decode(eagle3.Batch.from_tokens(tokens, output="all"))
                logits[flash_attn] = np.stack([ctx.logits(i) for i in range(len(tokens))])
        np.testing.assert_allclose(logits[True], logits[False], rtol=1e-3, atol=1e-3 * np.abs(logits[False]).max())
        with eagle3.Context(model, n_ctx=128, flash_attn=True) as alone:
            for i, token in enumerate(tokens):
                alone.decode(eagle3.Batch.from_tokens([token], pos0=i))
                np.testing.assert_array_equal(alone.logits(0), logits[True][i], err_msg=f"token {i}")


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_values_that_would_abort_are_refused_at_load(tmp_path, case):
    arch, params, words = REFUSED[case]
    path = tmp_path / f"{case}.gguf"
    write(path, arch, params)
    message = expect_exception(DECODE, "ModelLoadError", str(path), "1")
    assert words in message


DRAFT_ALONE = {  # an EAGLE-3 draft with its own embeddings and head, used without a target
    "rope-over-head": {"set_kv": {"eagle3.rope.dimension_count": (32, T.UINT32)}},
    "rope-odd": {"set_kv": {"eagle3.rope.dimension_count": (15, T.UINT32)}},
    "key-not-value": {"set_kv": {"eagle3.attention.key_length": (8, T.UINT32),
                                 "eagle3.attention.value_length": (16, T.UINT32)}},
    "d2t-int32": {"set_tensors": {"d2t": np.arange(48, dtype=np.int32)}},
    "d2t-out-of-range": {"set_tensors": {"d2t": np.arange(48, dtype=np.int64) + 1000}},
    "embeddings-short-of-the-vocabulary": {"set_tensors": {"token_embd.weight": np.ones((4, 64), np.float32)}},
    "two-blocks": {"set_kv": {"eagle3.block_count": (2, T.UINT32)}},
}


@pytest.mark.parametrize("case", sorted(DRAFT_ALONE))
def test_a_draft_that_would_abort_even_alone_is_refused_at_load(tmp_path, case):
    from eagle3.testing import DraftSpec, TargetSpec, write_pair

    _, draft = write_pair(tmp_path, TargetSpec(), DraftSpec(own_embeddings=True, d2t=48), name="own")
    path = rewrite(draft, tmp_path / f"{case}.gguf", **DRAFT_ALONE[case])
    expect_exception(DECODE, "ModelLoadError", str(path), "1")
