"""Broken pairs and bad calls end in an eagle3 exception, never in an abort.

Each case runs in its own interpreter: if llama.cpp aborted, the test would
see a signal instead of the expected exception, and the suite would go on.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import expect_exception
from eagle3.testing import DraftSpec, MtpSpec, TargetSpec, write_eagle3_draft, write_mtp_target
from gguf_edit import T, rewrite

# The user's whole path: load, make contexts, create the session, decode, process, draft.
SESSION = """
tm = eagle3.Model(sys.argv[1]); dm = eagle3.Model(sys.argv[2])
tc = eagle3.Context(tm); dc = eagle3.Context(dm, other=tc)
s = eagle3.Eagle3Session(tc, dc, n_draft_max=3)
b = eagle3.Batch.from_tokens([1, 2, 3]); tc.decode(b); s.process(b)
s.draft(0, 3, tc.argmax(-1))
"""


@pytest.fixture(scope="module")
def broken(model_dir, tiny_pair):
    """name -> (target path, broken draft path, expected exception)."""
    target, draft = tiny_pair
    d = model_dir / "broken"
    d.mkdir(exist_ok=True)
    layers = lambda ids: {"eagle3.target_layers": (ids, T.ARRAY, T.INT32)}  # noqa: E731
    d2t_draft = write_eagle3_draft(d / "d2t.gguf", TargetSpec(), DraftSpec(d2t=100))
    cases = {
        "layer-above-n_layer": (rewrite(draft, d / "l9.gguf", set_kv=layers([0, 1, 9])), "IncompatiblePairError"),
        "layer-negative": (rewrite(draft, d / "lneg.gguf", set_kv=layers([-1, 1, 2])), "IncompatiblePairError"),
        "layer-equal-n_layer": (rewrite(draft, d / "l4.gguf", set_kv=layers([1, 2, 4])), "IncompatiblePairError"),
        "two-layers": (rewrite(draft, d / "l2.gguf", set_kv=layers([1, 2])), "ModelLoadError"),
        "no-layers": (rewrite(draft, d / "l0.gguf", drop_kv=["eagle3.target_layers"]), "ModelLoadError"),
        "hidden-size": (write_eagle3_draft(d / "h48.gguf", TargetSpec(n_embd=48, n_head=4, n_head_kv=2),
                                           DraftSpec(n_embd=64, own_embeddings=True)), "IncompatiblePairError"),
        "vocab": (write_eagle3_draft(d / "v200.gguf", TargetSpec(n_vocab=200)), "IncompatiblePairError"),
        "borrowed-width": (rewrite(write_eagle3_draft(d / "w48src.gguf", TargetSpec(n_embd=48, n_head=4, n_head_kv=2),
                                                      DraftSpec(n_embd=48, own_output=True)),
                                   d / "w48.gguf", set_kv={"eagle3.target_hidden_size": (64, T.UINT32)},
                                   set_tensors={"fc.weight": np.zeros((48, 192), np.float32)}),
                           "IncompatiblePairError"),
        "d2t-without-output": (rewrite(d2t_draft, d / "d2t-noout.gguf", drop_tensors=["output.weight"]),
                               "IncompatiblePairError"),
        "d2t-out-of-range": (rewrite(d2t_draft, d / "d2t-range.gguf",
                                     set_tensors={"d2t": np.arange(100, dtype=np.int64) * 9}),
                             "ModelLoadError"),  # (the draft's graph would abort even alone)
        "d2t-int32": (rewrite(d2t_draft, d / "d2t-i32.gguf", set_tensors={"d2t": np.arange(100, dtype=np.int32)}),
                      "ModelLoadError"),
        "block-count-2": (rewrite(draft, d / "b2.gguf", set_kv={"eagle3.block_count": (2, T.UINT32)}),
                          "ModelLoadError"),
        "block-count-0": (rewrite(draft, d / "b0.gguf", set_kv={"eagle3.block_count": (0, T.UINT32)}),
                          "ModelLoadError"),
        "llama-as-draft": (target, "SessionInitError"),
        "head-dims": (rewrite(draft, d / "kv.gguf", set_kv={"eagle3.attention.key_length": (16, T.UINT32),
                                                           "eagle3.attention.value_length": (8, T.UINT32)},
                              set_tensors={"blk.0.attn_v.weight": np.zeros((32, 128), np.float32)}),
                      "ModelLoadError"),
        "negative-epsilon": (rewrite(draft, d / "eps.gguf", set_kv={
            "eagle3.attention.layer_norm_rms_epsilon": (-1.0, T.FLOAT32)}), "ModelLoadError"),
    }
    return {name: (target, path, exc) for name, (path, exc) in cases.items()}


@pytest.mark.parametrize("case", ["layer-above-n_layer", "layer-negative", "layer-equal-n_layer", "two-layers",
                                  "no-layers", "hidden-size", "vocab", "borrowed-width", "d2t-without-output",
                                  "d2t-out-of-range", "d2t-int32", "block-count-2", "block-count-0",
                                  "llama-as-draft", "head-dims", "negative-epsilon"])
def test_broken_pair(broken, case):
    target, draft, exc = broken[case]
    expect_exception(SESSION, exc, str(target), str(draft))


CALLS = {
    "n_seq=0": ("s = eagle3.Eagle3Session(tc, dc, n_seq=0)", "InvalidConfigError"),
    "n_draft_max=0": ("s = eagle3.Eagle3Session(tc, dc, n_draft_max=0)", "InvalidConfigError"),
    "draft seq out of range": ("s = eagle3.Eagle3Session(tc, dc); s.draft(5, 0, 1)", "BadSeqIdError"),
    "process seq beyond n_seq": ("""
s = eagle3.Eagle3Session(tc, dc, n_seq=1)
b = eagle3.Batch(4, n_seq_max=2); b.add_sequence([1, 2], 0, 1); tc.decode(b); s.process(b)""", "BadSeqIdError"),
    "process before decode": ("s = eagle3.Eagle3Session(tc, dc); s.process(eagle3.Batch.from_tokens([1]))",
                              "SessionStateError"),
    "process a batch decoded before the session": ("""
b = eagle3.Batch.from_tokens([1, 2]); tc.decode(b)
s = eagle3.Eagle3Session(tc, dc); s.process(b)""", "SessionStateError"),
    "accept more than drafted": ("""
s = eagle3.Eagle3Session(tc, dc, n_draft_max=2)
b = eagle3.Batch.from_tokens([1, 2]); tc.decode(b); s.process(b)
d = s.draft(0, 2, 3); s.accept(0, len(d) + 1)""", "InvalidArgumentError"),
    "accept before any draft": ("s = eagle3.Eagle3Session(tc, dc); s.accept(0, 1)", "SessionStateError"),
    "batch over n_batch": ("tc.decode(eagle3.Batch.from_tokens(list(range(600))))", "DecodeError"),
    "token outside the vocabulary": ("tc.decode(eagle3.Batch.from_tokens([1, 99999]))", "DecodeError"),
    "logits of a non-output row": ("tc.decode(eagle3.Batch.from_tokens([1, 2])); tc.logits(0)",
                                   "InvalidIndexError"),
    "seq_rm beyond n_seq_max": ("tc.seq_rm(4, 0)", "BadSeqIdError"),
    "draft context without other": ("eagle3.Context(dm)", "ContextError"),
    "mtp context on a model without NextN": ("eagle3.Context(tm, ctx_type='mtp')", "ContextError"),
    "draft id_last outside the vocabulary": ("""
s = eagle3.Eagle3Session(tc, dc)
b = eagle3.Batch.from_tokens([1, 2]); tc.decode(b); s.process(b); s.draft(0, 2, -4)""", "InvalidArgumentError"),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_bad_call(tiny_pair, call):
    code, exc = CALLS[call]
    setup = ("tm = eagle3.Model(sys.argv[1]); dm = eagle3.Model(sys.argv[2])\n"
             "tc = eagle3.Context(tm, n_ctx=512, n_batch=512)\n")
    if "Context(dm)" not in code:
        setup += "dc = eagle3.Context(dm, other=tc)\n"
    expect_exception(setup + code.strip(), exc, str(tiny_pair[0]), str(tiny_pair[1]))


@pytest.fixture(scope="module")
def broken_targets(model_dir, tiny_pair):
    """name -> (broken target path, expected exception) for a whole-session run with the tiny draft."""
    target = tiny_pair[0]
    d = model_dir / "broken-targets"
    d.mkdir(exist_ok=True)
    data = target.read_bytes()
    flipped = bytearray(data)
    flipped[9] ^= 0xFF  # the tensor count
    cases = {
        "missing": (d / "nope.gguf", "ModelLoadError"),
        "directory": (d, "ModelLoadError"),
        "empty": (d / "empty.gguf", "ModelLoadError"),
        "wrong-magic": (d / "magic.gguf", "ModelLoadError"),
        "truncated-header": (d / "trunc-header.gguf", "ModelLoadError"),
        "truncated-data": (d / "trunc-data.gguf", "ModelLoadError"),
        "bit-flipped-count": (d / "flipped.gguf", "ModelLoadError"),
        "unknown-architecture": (rewrite(target, d / "arch.gguf", set_kv={"general.architecture": ("nope", T.STRING)}),
                                 "ModelLoadError"),
        "block-count-600": (rewrite(target, d / "b600.gguf", set_kv={"llama.block_count": (600, T.UINT32)}),
                            "ModelLoadError"),
        "nextn-above-blocks": (rewrite(target, d / "nextn.gguf", set_kv={"llama.nextn_predict_layers": (9, T.UINT32)}),
                               "ModelLoadError"),
        "duplicate-tokens": (rewrite(target, d / "dup.gguf",
                                     set_kv={"tokenizer.ggml.tokens": (["t"] * 256, T.ARRAY, T.STRING)}),
                             "ModelLoadError"),
        "nan-epsilon": (rewrite(target, d / "nan.gguf",
                                set_kv={"llama.attention.layer_norm_rms_epsilon": (float("nan"), T.FLOAT32)}),
                        "ModelLoadError"),
        "not-an-eagle3-target": (write_mtp_target(d / "hy.gguf", MtpSpec()), "IncompatiblePairError"),
    }
    (d / "empty.gguf").write_bytes(b"")
    (d / "magic.gguf").write_bytes(b"GGUX" + data[4:])
    (d / "trunc-header.gguf").write_bytes(data[:200])
    (d / "trunc-data.gguf").write_bytes(data[:len(data) - 1000])
    (d / "flipped.gguf").write_bytes(bytes(flipped))
    return {name: (str(path), exc) for name, (path, exc) in cases.items()}


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "wrong-magic", "truncated-header",
                                  "truncated-data", "bit-flipped-count", "unknown-architecture", "block-count-600",
                                  "nextn-above-blocks", "duplicate-tokens", "nan-epsilon", "not-an-eagle3-target"])
def test_broken_target(broken_targets, tiny_pair, case):
    path, exc = broken_targets[case]
    expect_exception(SESSION, exc, path, str(tiny_pair[1]))


MORE_CALLS = {
    "a draft context with a smaller n_batch": ("""
tc = eagle3.Context(tm, n_ctx=512, n_batch=256); dc = eagle3.Context(dm, other=tc, n_batch=64)
eagle3.Eagle3Session(tc, dc)""", "SessionInitError"),
    "drafting twice without accept": ("""
tc = eagle3.Context(tm); dc = eagle3.Context(dm, other=tc); s = eagle3.Eagle3Session(tc, dc)
b = eagle3.Batch.from_tokens([1, 2]); tc.decode(b); s.process(b)
s.draft(0, 2, 3); s.draft(0, 2, 4); s.accept(0, 9)""", "InvalidArgumentError"),
    "a verify batch that does not fit n_batch": ("""
tc = eagle3.Context(tm, n_ctx=512, n_batch=8); dc = eagle3.Context(dm, other=tc)
eagle3.Eagle3Session(tc, dc, n_draft_max=8)""", "SessionInitError"),
    "tokenize without a vocabulary": ("""
m = eagle3.Model(sys.argv[3]); m.tokenize("hello")""", "InvalidArgumentError"),
    "an MTP context over a model loaded without its heads": ("""
m = eagle3.Model(sys.argv[4], load_mtp=False); eagle3.Context(m, ctx_type="mtp")""", "ContextError"),
    "MTP heads of another width": ("""
a = eagle3.Model(sys.argv[4]); b = eagle3.Model(sys.argv[5])
eagle3.MtpSession(eagle3.Context(a), eagle3.Context(b, ctx_type="mtp"))""", "SessionInitError"),
    "a closed target context": ("""
tc = eagle3.Context(tm); dc = eagle3.Context(dm, other=tc); tc.close(); eagle3.Eagle3Session(tc, dc)""",
                                "ClosedError"),
    "an eagle3 model as an MTP model": ("eagle3.Context(dm, ctx_type='mtp')", "ContextError"),
}


@pytest.fixture(scope="module")
def extra_models(model_dir, tiny_pair):
    d = model_dir / "extra"
    d.mkdir(exist_ok=True)
    no_vocab = rewrite(tiny_pair[0], d / "novocab.gguf", set_kv={"tokenizer.ggml.model": ("none", T.STRING)},
                       drop_kv=["tokenizer.ggml.tokens", "tokenizer.ggml.scores"])
    mtp = write_mtp_target(d / "mtp64.gguf", MtpSpec())
    mtp32 = write_mtp_target(d / "mtp32.gguf", MtpSpec(n_embd=32, n_head=2, n_head_kv=1))
    return [str(no_vocab), str(mtp), str(mtp32)]


@pytest.mark.parametrize("call", list(MORE_CALLS))
def test_more_bad_calls(tiny_pair, extra_models, call):
    code, exc = MORE_CALLS[call]
    setup = "tm = eagle3.Model(sys.argv[1]); dm = eagle3.Model(sys.argv[2])\n"
    expect_exception(setup + code.strip(), exc, str(tiny_pair[0]), str(tiny_pair[1]), *extra_models)


@pytest.mark.parametrize("change, code", [
    ({"set_tensors": {"blk.0.attn_q.weight": np.zeros((96, 128), np.float32)}}, "draft-tensor-shape"),
    ({"set_tensors": {"blk.0.ffn_down.weight": np.zeros((64, 96), np.float32)}}, "draft-tensor-shape"),
    ({"drop_tensors": ["blk.0.ffn_gate.weight"]}, "draft-tensor-missing"),
    ({"set_tensors": {"blk.0.attn_q.bias": np.zeros(64, np.float32)}}, "draft-tensor-unknown"),
    ({"set_kv": {"eagle3.fc_norm": (True, T.BOOL)}}, "draft-tensor-missing"),  # (its enc.output_norm)
])
def test_check_pair_compares_every_draft_tensor_with_its_keys(tiny_pair, tmp_path, change, code):
    import eagle3

    target, draft = tiny_pair
    path = rewrite(draft, tmp_path / "draft.gguf", **change)
    report = eagle3.check_pair(target, path)
    assert code in report.codes, str(report)
    assert eagle3.check_pair(target, draft).ok
