"""eagle3.convert: a tiny Hugging Face target and EAGLE-3 draft, made here, to GGUF and back to work."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import eagle3
from helpers import greedy

torch = pytest.importorskip("torch", reason="conversion needs the train extra: pip install '.[train]'")
transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

from eagle3.train.head import DraftConfig, Eagle3Draft, save  # noqa: E402

from eagle3.convert import ConversionError, convert  # noqa: E402
from draft_checkpoints import write_hf_target  # noqa: E402

V = 320


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    target = write_hf_target(root, n_layer=4, vocab=V)
    cfg = DraftConfig(hidden_size=64, target_hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=V, draft_vocab_size=150, aux_layers=(1, 2, 3))
    draft = Eagle3Draft(cfg, torch.arange(0, 300, 2))
    save(draft, root / "draft")
    return root, target


def test_convert_a_pair_end_to_end(hf_pair, tmp_path):
    root, hf_target = hf_pair
    target_gguf, draft_gguf, report = convert(root / "target", root / "draft", tmp_path, outtype="f32",
                                              name="tiny", progress=False)
    assert report.ok, str(report)
    assert report.facts["draft target_layers"] == [1, 2, 3] and report.facts["draft d2t"] == 150
    with eagle3.Model(target_gguf) as tm, eagle3.Model(draft_gguf) as dm:
        assert (tm.architecture, dm.architecture) == ("llama", "eagle3")
        prompt = tm.tokenize("def f3(x):")
        with eagle3.Context(tm) as ctx:  # the same numbers as the Hugging Face model
            ctx.decode(eagle3.Batch.from_tokens(prompt, output="all"))
            ours = np.stack([np.array(ctx.logits(i)) for i in range(len(prompt))])
        with torch.no_grad():
            theirs = hf_target(input_ids=torch.from_numpy(prompt.astype(np.int64))[None]).logits[0].numpy()
        np.testing.assert_allclose(ours, theirs, atol=1e-3)
        with eagle3.Context(tm) as tctx, eagle3.Context(dm, other=tctx) as dctx, \
                eagle3.Eagle3Session(tctx, dctx, n_draft_max=4) as session:
            assert session.generate(prompt, 20).tokens.tolist() == greedy(tm, prompt, 20)


def test_convert_quantized_target_only(hf_pair, tmp_path):
    root, _ = hf_pair
    target_gguf, draft_gguf, report = convert(root / "target", out_dir=tmp_path, outtype="q8_0", progress=False)
    assert draft_gguf is None and report is None
    assert eagle3.read_gguf(target_gguf)[2]["blk.0.attn_q.weight"].type == "q8_0"


def test_convert_errors(hf_pair, tmp_path):
    root, _ = hf_pair
    with pytest.raises(ConversionError, match="not a folder"):
        convert(tmp_path / "missing", progress=False)
    with pytest.raises(ConversionError, match="config.json"):
        convert(tmp_path, progress=False)
    with pytest.raises(ConversionError, match="not an EAGLE-3 draft"):
        convert(root / "target", root / "target", tmp_path, progress=False)  # a target is not a draft
    with pytest.raises(ConversionError, match="outtype"):
        convert(root / "target", outtype="q2", progress=False)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"architectures": ["NoSuchModel"], "num_hidden_layers": 1}')
    with pytest.raises(ConversionError, match="converter failed") as e:
        convert(broken, out_dir=tmp_path, progress=False)
    assert "\n" not in str(e.value) and "Traceback" not in str(e.value)  # its last word, in one line


def test_convert_command_line(hf_pair, tmp_path, capsys):
    from eagle3.cli import main

    root, _ = hf_pair
    assert main(["convert", str(root / "target"), str(root / "draft"), "-o", str(tmp_path), "--outtype", "f16"]) == 0
    out = capsys.readouterr().out
    assert "compatible: yes" in out and (tmp_path / "target-eagle3-f16.gguf").exists()
