"""Broken pairs and bad calls end in an eagle3 exception, never in an abort.

Each case runs in its own interpreter: if llama.cpp aborted, the test would
see a signal instead of the expected exception, and the suite would go on.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import expect_exception
from eagle3.testing import DraftSpec, TargetSpec, write_eagle3_draft, write_target
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
                             "IncompatiblePairError"),
        "d2t-int32": (rewrite(d2t_draft, d / "d2t-i32.gguf", set_tensors={"d2t": np.arange(100, dtype=np.int32)}),
                      "IncompatiblePairError"),
        "block-count-2": (rewrite(draft, d / "b2.gguf", set_kv={"eagle3.block_count": (2, T.UINT32)}),
                          "ModelLoadError"),
        "block-count-0": (rewrite(draft, d / "b0.gguf", set_kv={"eagle3.block_count": (0, T.UINT32)}),
                          "ModelLoadError"),
        "llama-as-draft": (target, "SessionInitError"),
    }
    return {name: (target, path, exc) for name, (path, exc) in cases.items()}


@pytest.mark.parametrize("case", ["layer-above-n_layer", "layer-negative", "layer-equal-n_layer", "two-layers",
                                  "no-layers", "hidden-size", "vocab", "borrowed-width", "d2t-without-output",
                                  "d2t-out-of-range", "d2t-int32", "block-count-2", "block-count-0",
                                  "llama-as-draft"])
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
