"""The multi-token kernels: a pass over k tokens loads each weight row once for
up to four tokens (more for some types: see MULTI_TOKEN_TYPES) instead of
once per token, and every token still gets bit for bit the logits it gets decoded
alone, on the shapes real models have: widths of 576 (rows that K-quants cannot
hold, where the quantizer falls back to q5_0/q8_0), 896 and 1536, tied embeddings,
and the quantizer's mixes."""

from __future__ import annotations

import ctypes
import logging
import math
import platform
from pathlib import Path

import numpy as np
import pytest

import eagle3
from eagle3 import _build_config
from eagle3.testing import TargetSpec, write_dequantized, write_target

exact = pytest.mark.skipif(not _build_config.BATCH_INVARIANT,
                           reason="built without eagle3's batch-invariant ggml patches")

# One or two layers with the widths of SmolLM2-135M (576, tied), Qwen2.5-0.5B
# (896, tied) and Qwen2.5-1.5B (1536).
SHAPES = {
    "576-tied": TargetSpec(n_layer=2, n_embd=576, n_head=9, n_head_kv=3, n_ff=1536, n_vocab=640, tied=True, seed=31),
    "896-tied": TargetSpec(n_layer=1, n_embd=896, n_head=14, n_head_kv=2, n_ff=1152, n_vocab=520, tied=True, seed=32),
    "1536": TargetSpec(n_layer=1, n_embd=1536, n_head=12, n_head_kv=2, n_ff=2048, n_vocab=384, seed=33),
}
TYPES = ["Q4_K_M", "Q4_1", "Q4_0", "Q5_0", "Q6_K", "IQ4_NL", "Q5_K_M", "Q8_0", "F16", "F32",
         "Q2_K", "Q3_K_S", "Q3_K_M", "Q5_1", "IQ4_XS", "BF16"]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """quantized(spec, file_type): the path of spec's model in file_type (F32: as
    written), written once for the module: every case of a model reads one file."""
    directory = tmp_path_factory.mktemp("quantized")
    sources: dict[TargetSpec, Path] = {}

    def model_file(spec: TargetSpec, file_type: str) -> Path:
        if spec not in sources:
            sources[spec] = write_target(directory / f"model{len(sources)}.gguf", spec)
        if file_type == "F32":
            return sources[spec]
        path = sources[spec].with_name(f"{sources[spec].stem}-{file_type}.gguf")
        if not path.exists():
            eagle3.quantize(sources[spec], path, file_type)
        return path

    return model_file


def _check_passes(model, sizes, n_threads: int, rng) -> None:
    tokens = rng.integers(3, model.n_vocab, sum(sizes)).astype(np.int32)
    kw = dict(n_ctx=2048, n_batch=1024, n_threads=n_threads)
    with eagle3.Context(model, **kw) as together, eagle3.Context(model, **kw) as alone:
        at = 0
        for k in sizes:
            together.decode(eagle3.Batch.from_tokens(tokens[at:at + k], pos0=at, output="all"))
            for i in range(k):
                alone.decode(eagle3.Batch.from_tokens(tokens[at + i:at + i + 1], pos0=at + i))
                np.testing.assert_array_equal(together.logits(i), alone.logits(0),
                                              err_msg=f"token {i} of a {k}-token pass at cache length {at}")
            at += k


def _check_matches_dequantized(path, n_threads: int) -> None:
    """The quantized model's logits are those of its weights, dequantized to f32
    by gguf-py's numpy code, within the rounding of the activations to 8 bits
    (about 1% of a logit; the quantization itself, against the f32 source, is 4-40%):
    a wrongly unpacked weight, in every pass alike, would not be."""
    reference = Path(path).with_suffix(".f32.gguf")
    if not reference.exists():
        write_dequantized(path, reference)
    tokens = np.arange(7, 47, dtype=np.int32)
    logits = {}
    for name in (reference, path):
        with eagle3.Model(name) as model, eagle3.Context(model, n_ctx=64, n_threads=n_threads) as ctx:
            ctx.decode(eagle3.Batch.from_tokens(tokens, output="all"))
            logits[name] = np.stack([ctx.logits(i) for i in range(len(tokens))])
    error = np.median(np.abs(logits[path] - logits[reference]))
    assert error < 0.03 * np.median(np.abs(logits[reference])), error


@exact
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("file_type", TYPES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_real_shapes_give_a_token_its_one_token_logits_in_passes_of_1_to_64(quantized, shape, file_type,
                                                                               n_threads):
    with eagle3.Model(quantized(SHAPES[shape], file_type)) as model:
        sizes = [*range(1, 17), 32, 64] if n_threads == 2 else [1, 2, 3, 4, 5, 7, 9, 16, 32]
        _check_passes(model, sizes, n_threads, np.random.default_rng(len(file_type) + n_threads))


@exact
@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q4_1", "Q8_0"])
def test_a_512_token_pass_gives_each_token_its_one_token_logits(quantized, file_type):
    with eagle3.Model(quantized(SHAPES["576-tied"], file_type)) as model:
        _check_passes(model, [512], 2, np.random.default_rng(5))


# Repacked q4_0, iq4_nl and q4_K weights come in blocks of 8 rows; with AMX a
# tile takes two blocks side by side, and a share with an odd count of blocks
# ends with a lone one: 1544 feed-forward rows are 193 blocks.
ODD_BLOCKS = TargetSpec(n_layer=1, n_embd=512, n_head=8, n_head_kv=2, n_ff=1544, n_vocab=384, seed=36)


@exact
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("file_type", ["Q4_0", "Q4_K_M", "IQ4_NL"])
def test_an_odd_count_of_repacked_blocks_gives_each_token_its_one_token_logits(quantized, file_type, n_threads):
    path = quantized(ODD_BLOCKS, file_type)
    with eagle3.Model(path) as model:
        assert model.tensors["blk.0.ffn_up.weight"].type.lower() == ("q4_k" if file_type == "Q4_K_M" else file_type.lower())
        _check_passes(model, [1, 2, 5, 9, 13, 16, 32], n_threads, np.random.default_rng(n_threads))


# With AVX512-VNNI, q5_K and iq4_xs chunks (q6_K: of 5 tokens or more, 4 on
# Zen 4) take 16 rows at a time, shorter q6_K ones two (with AVX2 alone, q2_K, q3_K, q5_K and
# q6_K chunks of a few tokens or more: 8 rows): 1544 feed-forward rows leave a
# partial tile of rows in every thread's share, 66 tokens are a chunk of 64 and
# one of 2, and 512 tokens eight chunks; every token still gets its one-token
# logits, and those are the model's.
@exact
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("file_type, weight_type", [("Q5_K_M", "q5_k"), ("Q6_K", "q6_k"), ("Q3_K_S", "q3_k"),
                                                    ("Q2_K", "q2_k"), ("IQ4_XS", "iq4_xs")])
def test_k_quant_tiles_of_rows_give_each_token_its_one_token_logits(quantized, file_type, weight_type, n_threads):
    path = quantized(ODD_BLOCKS, file_type)
    with eagle3.Model(path) as model:
        assert model.tensors["blk.0.ffn_up.weight"].type.lower() == weight_type
        sizes = [1, 2, 3, 4, 8, 9, 16, 66, 1] + ([512] if n_threads == 2 else [5])
        _check_passes(model, sizes, n_threads, np.random.default_rng(40 + n_threads))
    _check_matches_dequantized(path, n_threads)


# With AVX512-VNNI every q8_0 and q4_1 product (q5_0 and q5_1 with VBMI too)
# takes 16 rows at a time, two blocks (the others: eight) of them unpacked at
# once, in sums of their own (with AVX2 alone, q4_1, q5_0 and q5_1: 8 rows,
# eight blocks at once): rows of 17 and 47 blocks end on a lone block (the
# others: a partial group), 641 output rows on a partial tile of rows, 66 tokens
# are chunks of 64 and 2. Every token gets its one-token logits, and those are
# the model's: its weights' as gguf-py dequantizes them (a wrongly unpacked
# weight would not give them).
ODD_WIDTHS = TargetSpec(n_layer=1, n_embd=544, n_head=8, n_head_kv=2, n_ff=1504, n_vocab=641, tied=True, seed=37)


@exact
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("file_type", ["Q8_0", "Q5_0", "Q4_1", "Q5_1"])
def test_small_blocks_in_tiles_of_rows_give_each_token_its_one_token_logits(quantized, file_type, n_threads):
    path = quantized(ODD_WIDTHS, file_type)
    with eagle3.Model(path) as model:
        assert model.tensors["blk.0.ffn_down.weight"].type == file_type.lower()
        sizes = [1, 2, 3, 5, 8, 9, 16, 17, 66, 1] + ([512] if n_threads == 2 else [4])
        _check_passes(model, sizes, n_threads, np.random.default_rng(50 + n_threads))
    _check_matches_dequantized(path, n_threads)


# q4_1, q5_0, q5_1 and q8_0 take two rows at a time for up to four tokens (with
# AVX512-VNNI for up to 16, in 512-bit vectors), f16 for up to 16, row i of a
# thread's share with row i + half; a share of odd length leaves its middle row
# alone. 641 output rows are such a share with one thread and, 320/321, with two.
ODD_ROWS = TargetSpec(n_layer=1, n_embd=576, n_head=9, n_head_kv=3, n_ff=1536, n_vocab=641, tied=True, seed=34)


@exact
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("file_type", ["Q8_0", "Q4_1", "Q5_0", "Q5_1", "F16"])
def test_a_share_of_odd_length_gives_its_lone_row_the_same_logits(quantized, file_type, n_threads):
    with eagle3.Model(quantized(ODD_ROWS, file_type)) as model:
        assert model.n_vocab == 641
        _check_passes(model, [1, 2, 3, 4, 5, 6, 9, 16, 1, 3], n_threads, np.random.default_rng(n_threads))


# Types with a multi-token kernel on this build's CPU path: whether ggml repacks
# them (a repacked matrix needs rows in groups of 8), and how many tokens share
# one load of a row.
MULTI_TOKEN_TYPES = {"q4_0": (True, 8), "q4_k": (True, 8), "iq4_nl": (True, 8), "q4_1": (False, 5), "q8_0": (False, 5),
                     "q5_0": (False, 5), "q5_1": (False, 5), "q2_k": (False, 4), "q3_k": (False, 4),
                     "q5_k": (False, 8), "q6_k": (False, 8), "iq4_xs": (False, 4)}
# In passes of up to 16 tokens f32 takes one row with 6 tokens at a time with
# AVX-512 (32 vector registers); f16 and bf16, and f32 on AVX2, two rows with 6
# tokens (AVX-512: 9); on AVX-512 without AVX512-BF16, bf16 keeps tinyBLAS.
_AVX512 = "AVX512 = 1" in eagle3.system_info()
_TWO_STREAM_TOKENS = 9 if _AVX512 else 6
MULTI_TOKEN_TYPES.update({"f32": (False, 6), "f16": (False, _TWO_STREAM_TOKENS), "bf16": (False, _TWO_STREAM_TOKENS)})
if _AVX512 and "AVX512_BF16 = 1" not in eagle3.system_info():
    del MULTI_TOKEN_TYPES["bf16"]


def _amx_tiles_granted() -> bool:
    """Whether this process may use Intel AMX int8 tiles: the CPU reports them
    and the kernel grants them (arch_prctl), as ggml's repacked kernels check."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    if "amx_tile" not in flags or "amx_int8" not in flags:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA


# With AMX tiles, in builds without AVX512-VNNI (whose kernels ran every pass
# size faster), repacked q4_0 and iq4_nl take passes of 9 or more tokens, and
# q4_K passes of 16 or more, through tiles of up to 16 tokens.
_AMX = _amx_tiles_granted() and "AVX512_VNNI = 1" not in eagle3.system_info()
_AMX_FROM = {"q4_0": 9, "iq4_nl": 9, "q4_k": 16}


# With AVX512-VNNI (and BW, which every CPU with VNNI has), q5_0, q5_1 and
# q6_K passes that no tile takes (below) take two rows per 512-bit vector with
# up to 8 tokens.
_WIDE_TYPES = ("q5_0", "q5_1", "q6_k") if _AVX512 and "AVX512_VNNI = 1" in eagle3.system_info() else ()
# There repacked q4_K takes two groups of eight rows with up to 6 tokens.
if _WIDE_TYPES:
    MULTI_TOKEN_TYPES["q4_k"] = (True, 6)

# Every pass over q8_0, q4_1, q5_K and iq4_xs (and over q5_0 and q5_1 where the
# build has AVX512-VBMI and VBMI2), and passes of 5 tokens or more over q6_K,
# take 16 rows per 512-bit vector there, each row loaded once for up to 64
# tokens. (On AMD's Zen 4 q6_K takes them from 4 tokens; a pass of 4 loads each
# row once through either kernel, so the counts below do not tell them apart.)
_TILE_FROM = {"q8_0": 1, "q4_1": 1, "q5_k": 1, "iq4_xs": 1, "q6_k": 5} if _WIDE_TYPES else {}
if _WIDE_TYPES and all(f"AVX512_{isa} = 1" in eagle3.system_info() for isa in ("VBMI", "VBMI2")):
    _TILE_FROM.update({"q5_0": 1, "q5_1": 1})
# Without AVX512-VNNI, builds with AVX2, FMA and F16C take every pass over q4_1,
# q5_0 and q5_1, and passes of 3 tokens or more over q5_K (q6_K and q2_K: 4,
# q3_K: 2), 8 rows at a time, each row loaded once for up to 64 tokens.
if not _WIDE_TYPES and all(f"{isa} = 1" in eagle3.system_info() for isa in ("AVX2", "FMA", "F16C")):
    _TILE_FROM.update({"q4_1": 1, "q5_0": 1, "q5_1": 1, "q5_k": 3, "q6_k": 4, "q3_k": 2, "q2_k": 4})


# There q5_K, q6_K and iq4_xs matrices whose rows come in groups of 16 are
# repacked at load into blocks of 16 rows, which every pass takes, each row
# loaded once for up to 8 tokens (other matrices of these types keep the
# kernels above).
_K_BLOCKS_OF_16 = ("q5_k", "q6_k", "iq4_xs") if _WIDE_TYPES else ()
for _t in _K_BLOCKS_OF_16:
    MULTI_TOKEN_TYPES[f"{_t} in blocks of 16"] = (True, 8)
# So are the matrices of the types the tiles above take for every pass, and
# q4_0's (whose others keep the repacked kernel of 8 rows), for the same tiles
# without their transposes: passes of 2-16 tokens take their rows 8 tokens at a
# time (each token's sums in registers; the test's passes are all of these
# sizes), longer ones up to 64.
_LANES16 = tuple(t for t in ("q8_0", "q4_1", "q5_0", "q5_1") if _TILE_FROM.get(t) == 1) if _WIDE_TYPES else ()
_LANES16 += ("q4_0",) if _WIDE_TYPES else ()
for _t in _LANES16:
    MULTI_TOKEN_TYPES[f"{_t} in blocks of 16"] = (True, 8)
_REPACKED_16 = _K_BLOCKS_OF_16 + _LANES16


def _group(ggml_type: str, k: int) -> int:
    """How many of a pass's k tokens share one load of a weight row."""
    if _AMX and k >= _AMX_FROM.get(ggml_type, k + 1):
        return 16
    if k >= _TILE_FROM.get(ggml_type, k + 1):
        return 64
    if ggml_type in _WIDE_TYPES:
        return 8
    return MULTI_TOKEN_TYPES[ggml_type][1]


def _multi_token_rows(model) -> dict[str, int]:
    """Weight rows one token's pass multiplies through a multi-token kernel, by type."""
    rows: dict[str, int] = {}
    tied = "output.weight" not in model.tensors
    for name, info in model.tensors.items():
        used = name.startswith("blk.") or name == "output.weight" or (tied and name == "token_embd.weight")
        ggml_type = info.type.lower()
        if ggml_type in _REPACKED_16 and info.shape[1] % 16 == 0:
            ggml_type += " in blocks of 16"
        repacked, _ = MULTI_TOKEN_TYPES.get(ggml_type, (None, 0))
        if used and len(info.shape) == 2 and repacked is not None and not (repacked and info.shape[1] % 8):
            rows[ggml_type] = rows.get(ggml_type, 0) + info.shape[1]
    return rows


@exact
@pytest.mark.skipif(eagle3.multi_token_counts() is None, reason="this build has no multi-token kernels")
@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q5_K_M", "Q4_1", "Q5_0", "Q6_K", "Q4_0", "IQ4_NL", "F16", "F32",
                                       "Q2_K", "Q3_K_S", "Q3_K_M", "Q5_1", "IQ4_XS", "BF16", "Q8_0"])
def test_a_pass_of_k_tokens_loads_each_weight_row_once_per_group_of_tokens(quantized, file_type):
    if file_type == "BF16" and "bf16" not in MULTI_TOKEN_TYPES:
        pytest.skip("bf16 has no multi-token kernel on AVX-512 builds without AVX512-BF16")
    with eagle3.Model(quantized(SHAPES["1536"], file_type)) as model, \
            eagle3.Context(model, n_ctx=256, n_batch=64, n_threads=2) as ctx:
        rows = _multi_token_rows(model)
        assert rows
        ctx.decode(eagle3.Batch.from_tokens([5, 6, 7]))
        at = 3
        for k in (1, 2, 3, 4, 5, 8, 13, 16):
            before = eagle3.multi_token_counts()
            ctx.decode(eagle3.Batch.from_tokens(np.arange(10, 10 + k, dtype=np.int32), pos0=at, output="all"))
            products, row_loads = (a - b for a, b in zip(eagle3.multi_token_counts(), before))
            assert products == k * sum(rows.values()), f"{k} tokens"
            assert row_loads == sum(math.ceil(k / _group(t, k)) * n for t, n in rows.items()), f"{k} tokens"
            at += k


# The types the tiles of 16 rows take for every pass (q8_0, q4_1, and q5_0 and
# q5_1 with VBMI) are repacked there too, into blocks of 16 rows the same tiles
# read without transposing them; their rows are loaded as often as before.
_BLOCKS_OF_16 = (*_K_BLOCKS_OF_16, *(t for t in ("q8_0", "q4_1", "q5_0", "q5_1") if _WIDE_TYPES and _TILE_FROM.get(t) == 1))


# Repacked into blocks of 16 rows, rows give each token the bits the kernels
# that read the file's own layout give it (repack=False): the same integer per
# block, the same float steps.
@exact
@pytest.mark.parametrize("file_type", ["Q6_K", "Q5_K_M", "IQ4_XS", "Q8_0", "Q4_1", "Q5_0", "Q5_1"])
def test_blocks_of_16_rows_give_the_bits_of_the_files_layout(quantized, file_type, caplog):
    path = quantized(SHAPES["1536"], file_type)
    tokens = np.arange(7, 16, dtype=np.int32)
    logits = {}
    for repack in (True, False):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="eagle3"), eagle3.Model(path, repack=repack) as model, \
                eagle3.Context(model, n_ctx=64, n_threads=2) as ctx:
            repacked = "_16x4" in caplog.text
            if not any(info.type.lower() in _BLOCKS_OF_16 for info in model.tensors.values()):
                pytest.skip(f"this build does not repack {file_type}'s types into blocks of 16 rows")
            # llama.cpp logs each repacked tensor ("repack tensor blk.0.attn_q.weight with q6_K_16x4")
            assert bool(repacked) == repack, caplog.text[-2000:]
            ctx.decode(eagle3.Batch.from_tokens(tokens[:1]))
            ctx.decode(eagle3.Batch.from_tokens(tokens[1:], pos0=1, output="all"))
            logits[repack] = np.stack([ctx.logits(i) for i in range(len(tokens) - 1)])
    np.testing.assert_array_equal(logits[True], logits[False])


# Experts' matrices (mul_mat_id) take the repacked layouts' kernels too, a
# token at a time: a mixture-of-experts model in the types that are repacked
# gives each token of a pass its one-token logits, and those are within
# rounding of the logits it gives in the file's layout (whose experts take
# vec_dot, with bits of its own for some types).
@exact
@pytest.mark.parametrize("file_type", ["Q6_K", "Q8_0", "Q4_0"])
def test_experts_in_repacked_layouts_give_each_token_its_one_token_logits(tmp_path, file_type):
    from arch_files import write as write_arch

    source = tmp_path / "moe.gguf"
    write_arch(source, "qwen3moe", {"E": 256, "H": 4, "HKV": 2, "FF": 256, "NEXP": 4, "NUSED": 2, "FFEXP": 256,
                                    "V": 96})
    path = tmp_path / f"moe-{file_type}.gguf"
    eagle3.quantize(source, path, file_type)
    tokens = np.arange(3, 12, dtype=np.int32)
    logits = {}
    for repack in (True, False):
        with eagle3.Model(path, repack=repack) as model:
            assert model.tensors["blk.0.ffn_down_exps.weight"].type.lower() == file_type.lower()
            _check_passes(model, [1, 2, 5, 9], 2, np.random.default_rng(7))
            with eagle3.Context(model, n_ctx=64, n_threads=2) as ctx:
                ctx.decode(eagle3.Batch.from_tokens(tokens, output="all"))
                logits[repack] = np.stack([ctx.logits(i) for i in range(len(tokens))])
    scale = np.median(np.abs(logits[False]))
    assert np.median(np.abs(logits[True] - logits[False])) < 1e-3 * scale


# Float weights sum a row in vectors of 8 or 16 values and its last values one
# by one: a feed-forward width of 100 leaves 4 of them in every row of
# ffn_down, for one token (f16: tokens as they are) and for several (f16:
# tokens widened to f32 first).
LEFTOVERS = TargetSpec(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=100, n_vocab=300, tied=True, seed=35)


@exact
@pytest.mark.parametrize("file_type", ["F16", "F32", "BF16"])
def test_rows_with_leftover_values_give_a_token_its_one_token_logits(quantized, file_type):
    with eagle3.Model(quantized(LEFTOVERS, file_type)) as model:
        assert model.tensors["blk.0.ffn_down.weight"].type == file_type.lower()
        _check_passes(model, [1, 2, 3, 7, 16, 32], 2, np.random.default_rng(6))
