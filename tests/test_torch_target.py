"""TorchTarget: the target's forward in PyTorch computes what the engine computes from the same GGUF."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import eagle3
from eagle3.testing import TargetSpec, write_target

torch = pytest.importorskip("torch", reason="the train extra: pip install '.[train]'")

from eagle3.train import data as _data  # noqa: E402
from eagle3.train import export  # noqa: E402
from eagle3.train.head import DraftConfig, Eagle3Draft  # noqa: E402
from eagle3.train.torch_target import TorchTarget  # noqa: E402
from gguf_edit import as_qwen2, as_qwen3  # noqa: E402

SPECS = {
    "llama": TargetSpec(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_vocab=256, seed=5),
    "llama-tied-48x5": TargetSpec(n_layer=5, n_embd=48, n_head=6, n_head_kv=3, n_ff=96, n_vocab=300, tied=True,
                                  seed=6),
    "qwen2": TargetSpec(n_layer=3, n_embd=64, n_head=4, n_head_kv=1, n_vocab=256, seed=7),
    "qwen3": TargetSpec(n_layer=3, n_embd=64, n_head=8, n_head_kv=4, n_vocab=256, seed=8),
}


@pytest.fixture(scope="module", params=list(SPECS))
def target(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tt")
    spec = SPECS[request.param]
    path = write_target(folder / "llama.gguf", spec)
    if request.param in ("qwen2", "qwen3"):
        path = (as_qwen2 if request.param == "qwen2" else as_qwen3)(path, folder / "t.gguf")
    return path, spec


def _engine_features(path, tokens, layers, top_k=8):
    with eagle3.Model(path) as m, eagle3.Context(m, n_ctx=len(tokens), n_batch=len(tokens)) as ctx:
        ctx.capture_layer_inputs(layers)
        return _data._one(ctx, tokens, layers, top_k)


def _layers(spec):
    return (1, spec.n_layer // 2, spec.n_layer - 1)


def test_layer_inputs_and_logits_match_the_engine(target):
    path, spec = target
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, spec.n_vocab, n).astype(np.int32) for n in (37, 5, 21)]
    feats, ids, top = TorchTarget.from_gguf(path).features(seqs, _layers(spec), 8, batch_tokens=48)
    assert feats.dtype == torch.float16 and feats.shape == (sum(map(len, seqs)), 3 * spec.n_embd)
    at = 0
    for s in seqs:  # each sequence alone, whatever it was batched with
        ref = _engine_features(path, s, list(_layers(spec)))
        mine = feats[at:at + len(s)].float().numpy()
        np.testing.assert_allclose(mine, ref["features"].astype(np.float32), rtol=2e-2, atol=2e-3)
        assert (ids[at:at + len(s), 0].numpy() == ref["top_ids"][:, 0]).mean() >= 0.95
        np.testing.assert_allclose(top[at:at + len(s), 0].numpy(), ref["top_logits"][:, 0].astype(np.float32),
                                   rtol=1e-2, atol=1e-2)
        at += len(s)


def test_greedy_answers_are_the_engines_with_prompts_of_several_lengths_in_one_batch(tmp_path):
    spec = TargetSpec(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_vocab=256, weights="chain", seed=3)
    path = write_target(tmp_path / "chain.gguf", spec)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, spec.n_vocab, n).astype(np.int32) for n in (3, 11, 7)]
    stop = [int(prompts[0][-1])]  # a token some answer meets: answers end with it
    got = TorchTarget.from_gguf(path).generate(prompts, 20, stop, batch=3)
    with eagle3.Model(path) as m, eagle3.Context(m, n_ctx=64) as ctx:
        for p, g in zip(prompts, got):
            ref = np.asarray(ctx.generate(p, 20).tokens)
            cut = np.flatnonzero(np.isin(ref, stop))
            want = ref[:cut[0] + 1] if len(cut) else ref
            np.testing.assert_array_equal(g, want)


def test_a_quantized_target_matches_within_the_engines_rounding(tmp_path):
    spec = TargetSpec(n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=256, seed=9)
    path = tmp_path / "q.gguf"
    eagle3.quantize(write_target(tmp_path / "f32.gguf", spec), path, "Q4_1", pure=True)
    tokens = np.random.default_rng(4).integers(0, spec.n_vocab, 40).astype(np.int32)
    feats, ids, _ = TorchTarget.from_gguf(path).features([tokens], _layers(spec), 8)
    ref = _engine_features(path, tokens, list(_layers(spec)))
    a, b = feats.float().numpy(), ref["features"].astype(np.float32)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.99
    assert (ids[:, 0].numpy() == ref["top_ids"][:, 0]).mean() >= 0.9


def test_an_architecture_without_a_forward_is_refused(tmp_path):
    from gguf_edit import rewrite

    import gguf

    path = write_target(tmp_path / "t.gguf", TargetSpec())
    other = rewrite(path, tmp_path / "o.gguf", set_kv={"general.architecture": ("gpt2", gguf.GGUFValueType.STRING)})
    with pytest.raises(ValueError, match="gpt2"):
        TorchTarget.from_gguf(other)


def test_a_written_head_reads_back(tmp_path):
    spec = TargetSpec(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_vocab=256, seed=2)
    target = write_target(tmp_path / "t.gguf", spec)
    cfg = DraftConfig(hidden_size=64, target_hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=96, vocab_size=256, draft_vocab_size=64, aux_layers=(1, 2, 3))
    torch.manual_seed(0)
    head = Eagle3Draft(cfg, torch.arange(0, 256, 4))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
    for outtype in export.OUTTYPES:
        first = export.write_head(tmp_path / f"a-{outtype}.gguf", target, head, cfg.max_position_embeddings, outtype)
        back = export.read_head(first)
        assert back.cfg.rms_norm_eps == pytest.approx(cfg.rms_norm_eps)  # (stored as float32)
        assert dataclasses.replace(back.cfg, rms_norm_eps=cfg.rms_norm_eps) == cfg
        assert torch.equal(back.d2t, head.d2t)
        for name, value in head.state_dict().items():
            tol = 1e-2 if outtype == "f16" else 2e-2
            torch.testing.assert_close(back.state_dict()[name].float(), value.float(), rtol=tol, atol=tol * 4)
        again = export.write_head(tmp_path / f"b-{outtype}.gguf", target, back, cfg.max_position_embeddings, outtype)
        assert again.read_bytes() == first.read_bytes()  # (a written head is a fixed point)
