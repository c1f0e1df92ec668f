"""Models, tokenization and batches."""

from __future__ import annotations

import numpy as np
import pytest

import eagle3


def test_model_properties(models):
    target, draft = models["random-d2t"]
    assert (target.n_layer, target.n_embd, target.n_vocab, target.n_head, target.n_head_kv) == (5, 48, 256, 6, 3)
    assert target.architecture == "llama" and draft.architecture == "eagle3"
    meta = draft.metadata
    assert list(meta["eagle3.target_layers"]) == [0, 2, 4]
    assert meta["eagle3.target_hidden_size"] == 48
    assert draft.metadata_types["eagle3.target_layers"] == "array[int32]"
    assert draft.tensors["d2t"][:2] == ((128,), "i64")
    assert target.tensors["token_embd.weight"][:2] == ((48, 256), "f32")
    assert "llama" in repr(target)


def test_tokenize_roundtrip(tiny_models):
    target, _ = tiny_models
    tokens = target.tokenize("hello world, speculative decoding")
    assert tokens.dtype == np.int32 and tokens.ndim == 1 and len(tokens) == 7  # 5-byte chunks
    assert np.all((tokens >= 0) & (tokens < target.n_vocab))
    assert target.detokenize(tokens) == "".join(f"{t:x}" for t in tokens)  # the test vocabulary
    assert target.tokenize("") .size == 0
    assert not target.is_eog(0) and not target.is_eog(-5)
    with pytest.raises(ValueError):
        target.detokenize([target.n_vocab])
    with pytest.raises(TypeError):
        target.tokenize(b"bytes")


@pytest.mark.parametrize("name, content", [
    ("missing.gguf", None),
    (".", None),
    ("empty.gguf", b""),
    ("junk.gguf", b"not a gguf file at all" * 10),
    ("magic-only.gguf", b"GGUF"),
])
def test_bad_model_files_raise(tmp_path, name, content):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(eagle3.ModelLoadError):
        eagle3.Model(path)


def test_batch_add_and_views():
    batch = eagle3.Batch(8, n_seq_max=2)
    assert len(batch) == 0 and batch.capacity == 8
    assert batch.add(5, 0, 0, False) == 0
    assert batch.add(6, 1, [0, 1], True) == 1
    assert batch.tokens.tolist() == [5, 6]
    assert batch.positions.tolist() == [0, 1]
    assert batch.outputs.tolist() == [False, True]
    assert batch.seq_ids.tolist() == [0, 0]
    assert batch.entry_seq_ids(1) == [0, 1]
    for view in (batch.tokens, batch.positions, batch.outputs, batch.seq_ids):
        assert not view.flags.writeable
    batch.clear()
    assert len(batch) == 0


def test_batch_from_arrays_without_python_loops():
    tokens = np.arange(100, 150, dtype=np.int64)
    batch = eagle3.Batch.from_tokens(tokens, pos0=7, seq_id=0)
    assert batch.tokens.tolist() == tokens.tolist()
    assert batch.positions.tolist() == list(range(7, 57))
    assert batch.outputs.sum() == 1 and batch.outputs[-1]
    b2 = eagle3.Batch(10, n_seq_max=3)
    b2.add_arrays([1, 2, 3], [0, 0, 0], [0, 1, 2], outputs=np.array([True, False, True]))
    assert b2.seq_ids.tolist() == [0, 1, 2] and b2.outputs.tolist() == [True, False, True]
    b2.add_sequence([4, 5], pos0=1, seq_id=1, output="all")
    assert b2.outputs.tolist()[-2:] == [True, True]


@pytest.mark.parametrize("call, error", [
    (lambda b: b.add(1, 0, 2), eagle3.BatchError),
    (lambda b: b.add(1, 0, [0, 0]), eagle3.BatchError),
    (lambda b: b.add(1, 0, []), eagle3.BatchError),
    (lambda b: b.add_sequence(np.zeros(5, np.int32)), eagle3.BatchError),
    (lambda b: b.add_sequence([1.5, 2.0]), TypeError),
    (lambda b: b.add_sequence([[1, 2]]), ValueError),
    (lambda b: b.add_sequence([2**40]), ValueError),
    (lambda b: b.add_sequence([1, 2], output="some"), eagle3.BatchError),
    (lambda b: b.add_arrays([1, 2], [0], 0), eagle3.BatchError),
])
def test_batch_errors(call, error):
    batch = eagle3.Batch(4, n_seq_max=2)
    with pytest.raises(error):
        call(batch)
    assert len(batch) == 0


def test_batch_full():
    batch = eagle3.Batch(2)
    batch.add(1, 0)
    batch.add(2, 1)
    with pytest.raises(eagle3.BatchError, match="full"):
        batch.add(3, 2)
    with pytest.raises(eagle3.BatchError):
        eagle3.Batch(0)
