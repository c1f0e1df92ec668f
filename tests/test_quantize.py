"""eagle3.quantize: llama.cpp's own quantizer, with eagle3's checks in front."""

from __future__ import annotations

import os

import numpy as np
import pytest

import eagle3
from eagle3.testing import TargetSpec, write_target

WIDE = TargetSpec(n_layer=1, n_embd=256, n_head=4, n_head_kv=4, n_ff=256, n_vocab=256, seed=2)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return write_target(tmp_path_factory.mktemp("q") / "wide.gguf", WIDE)


@pytest.mark.parametrize("file_type, pure, types", [
    ("Q8_0", True, {"q8_0"}), ("q4_k_m", True, {"q4_K"}), ("IQ4_XS", True, {"iq4_xs"}),
    ("Q4_K_M", False, {"q4_K", "q6_K"}),  # the mix keeps some matrices at q6_K
])
def test_quantized_models_load_and_decode(wide, tmp_path, file_type, pure, types):
    out = tmp_path / "q.gguf"
    eagle3.quantize(wide, out, file_type, pure=pure, threads=1)
    with eagle3.Model(out) as model, eagle3.Context(model, n_ctx=64) as ctx:
        matrices = {t.type for name, t in model.tensors.items() if len(t.shape) == 2}
        assert matrices == types
        ctx.decode(eagle3.Batch.from_tokens([3, 4, 5]))
        assert np.isfinite(ctx.logits(-1)).all()


def test_bad_arguments_raise_eagle3_errors(wide, tmp_path):
    with pytest.raises(eagle3.InvalidArgumentError, match="Q4_K_M"):
        eagle3.quantize(wide, tmp_path / "q.gguf", "Q4_K_X")
    with pytest.raises(eagle3.ArgumentTypeError):
        eagle3.quantize(wide, tmp_path / "q.gguf", 15)
    with pytest.raises(eagle3.InvalidArgumentError, match="differ"):
        eagle3.quantize(wide, wide, "Q8_0")
    with pytest.raises(eagle3.InvalidArgumentError, match="folder"):
        eagle3.quantize(wide, tmp_path / "missing" / "q.gguf", "Q8_0")
    with pytest.raises(eagle3.ModelLoadError, match="no such file"):
        eagle3.quantize(tmp_path / "none.gguf", tmp_path / "q.gguf", "Q8_0")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(eagle3.ModelLoadError):
        eagle3.quantize(junk, tmp_path / "q.gguf", "Q8_0")
    with pytest.raises(eagle3.InvalidArgumentError):
        eagle3.quantize(wide, tmp_path / "q.gguf", "Q8_0", threads=-1)


def test_a_vocab_only_model_tokenizes_and_reports_no_layers(wide):
    with eagle3.Model(wide, vocab_only=True) as model:
        assert model.n_layer == 0 and model.n_head == 0 and model.n_head_kv == 0
        assert model.tokenize("hello").dtype == np.int32


def test_a_failed_quantization_leaves_dst_as_it_was(wide, tmp_path):
    q8 = tmp_path / "q8.gguf"
    eagle3.quantize(wide, q8, "Q8_0", threads=1)
    dst = tmp_path / "earlier.gguf"
    dst.write_bytes(b"an earlier file")
    with pytest.raises(eagle3.ModelLoadError, match="requantiz"):
        eagle3.quantize(q8, dst, "Q4_0", threads=1)  # requantizing is refused by default
    assert dst.read_bytes() == b"an earlier file"
    with pytest.raises(eagle3.ModelLoadError, match="requantiz"):
        eagle3.quantize(q8, tmp_path / "new.gguf", "Q4_0", threads=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier.gguf", "q8.gguf"]


def test_allow_requantize_quantizes_a_quantized_model(wide, tmp_path):
    q8 = tmp_path / "q8.gguf"
    eagle3.quantize(wide, q8, "Q8_0", threads=1)
    eagle3.quantize(q8, tmp_path / "q4.gguf", "Q4_0", threads=1, allow_requantize=True)
    _, _, tensors = eagle3.read_gguf(tmp_path / "q4.gguf")
    assert tensors["blk.0.ffn_up.weight"].type == "q4_0"
    with eagle3.Model(tmp_path / "q4.gguf") as model, eagle3.Context(model, n_ctx=64) as ctx:
        ctx.decode(eagle3.Batch.from_tokens(model.tokenize("hello")))
        assert np.isfinite(ctx.logits(-1)).all()


def test_the_written_file_gets_the_permissions_of_any_new_file(wide, tmp_path):
    old = os.umask(0o022)
    try:
        eagle3.quantize(wide, tmp_path / "q.gguf", "Q8_0", threads=1)
    finally:
        os.umask(old)
    assert (tmp_path / "q.gguf").stat().st_mode & 0o777 == 0o644
