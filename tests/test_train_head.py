"""eagle3.train_head: an EAGLE-3 head distilled from a GGUF target, end to end."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import eagle3
from eagle3.testing import TargetSpec, write_target

torch = pytest.importorskip("torch", reason="train_head needs the train extra: pip install '.[train]'")

from eagle3.train import fit  # noqa: E402
from eagle3.train.head import DraftConfig, Eagle3Draft  # noqa: E402

# a target whose greedy next token is a fixed function of the current one: a head can learn it exactly
CHAIN = TargetSpec(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_vocab=256, weights="chain", seed=21)
QUICK = dict(tokens=3000, max_new_tokens=48, epochs=25, batch_tokens=512, lr=3e-3, draft_vocab_size=200,
             held_out=4, threads=1, progress=False)


def _prompts(n, vocab, seed=0, length=6):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, length).astype(np.int32) for _ in range(n)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target = write_target(root / "chain.gguf", CHAIN)
    report = eagle3.train_head(target, root / "head.gguf", _prompts(60, CHAIN.n_vocab), **QUICK)
    return target, report


def _torch_head(work):
    state = torch.load(work / "checkpoint.pt", weights_only=False)
    cfg = dict(state["recipe"]["cfg"])
    cfg["aux_layers"] = tuple(cfg["aux_layers"])
    head = Eagle3Draft(DraftConfig(**cfg), state["head"]["d2t"])
    head.load_state_dict(state["head"])
    return head.eval()


def test_the_head_learns_the_target_and_llama_cpp_runs_it(trained):
    target, report = trained
    assert report.head.is_file()
    assert report.held_out_tau >= 3.0, report  # of at most 5 at n_draft_max 4
    assert report.held_out_agreement[0] >= 0.8
    assert report.draft_vocab_size == 200 and report.steps > 0 and report.answer_tokens >= 2000
    assert eagle3.check_pair(target, report.head).ok
    with eagle3.Model(target) as tm, eagle3.Model(report.head) as dm:
        assert dm.architecture == "eagle3"
        assert dm.metadata["eagle3.target_layers"].tolist() == report.target_layers
        assert dm.tensors["d2t"].shape[0] == 200 and "token_embd.weight" not in dm.tensors
        # the tokenizer is the target's: the same text, the same ids
        assert np.array_equal(dm.tokenize("tok_3 tok_17"), tm.tokenize("tok_3 tok_17"))
        # lossless: greedy speculation with the head equals plain greedy decoding
        prompt = _prompts(1, CHAIN.n_vocab, seed=99)[0]
        with eagle3.Context(tm, n_ctx=256) as tctx, eagle3.Context(dm, other=tctx) as dctx, \
                eagle3.Eagle3Session(tctx, dctx, n_draft_max=4) as s:
            spec = s.generate(prompt, 64)
            plain = tctx.generate(prompt, 64)
        np.testing.assert_array_equal(spec.tokens, plain.tokens)
        assert spec.stats.mean_accepted_length >= 3.0


def test_the_gguf_head_computes_what_torch_trained(trained):
    """llama.cpp's drafts equal the torch head's greedy choices on the same target features."""
    target, report = trained
    head = _torch_head(report.head.with_name(report.head.name + ".work"))
    from eagle3.train.export import target_matrix

    emb = torch.from_numpy(target_matrix(target, ("token_embd.weight",)))
    compared = 0
    with eagle3.Model(target) as tm, eagle3.Model(report.head) as dm:
        for prompt in _prompts(6, CHAIN.n_vocab, seed=7, length=11):
            with eagle3.Context(tm, n_ctx=128) as tctx, eagle3.Context(dm, other=tctx) as dctx, \
                    eagle3.Eagle3Session(tctx, dctx, n_draft_max=4) as s:
                g = s.generate(prompt, 8, trace=True)
            drafted = g.trace["drafted"][0]
            drafted = drafted[drafted >= 0]
            with eagle3.Context(tm, n_ctx=128) as ctx:
                ctx.capture_layer_inputs(report.target_layers)
                ctx.decode(eagle3.Batch.from_tokens(prompt))
                feats = ctx.layer_inputs(report.target_layers)
            n = len(prompt)
            features = torch.from_numpy(feats.transpose(1, 0, 2).reshape(1, n, -1).copy())
            # step j at the last prompt position reads the target's token, then the draft's own
            chain = np.concatenate([prompt, g.tokens[:1], drafted]).astype(np.int64)
            steps = len(drafted)
            tokens = np.zeros((steps, n), np.int64)
            for j in range(steps):
                tokens[j] = chain[1 + j:1 + j + n]
            with torch.no_grad():
                logits = head.forward_ttt(emb[torch.from_numpy(tokens)][None], features, steps)
            for j in range(steps):
                row = logits[j][0, n - 1]
                draft_id = int(np.searchsorted(head.d2t.numpy(), drafted[j]))
                assert head.d2t[draft_id] == drafted[j]
                # llama.cpp's choice is torch's up to the rounding of f16 weights
                assert float(row.max() - row[draft_id]) < 1e-2 * max(1.0, float(row.abs().max()))
                compared += 1
    assert compared >= 12


def test_a_finished_run_exports_again_in_q8_0_without_training(trained, tmp_path):
    target, report = trained
    work = report.head.with_name(report.head.name + ".work")
    stamp = (work / "checkpoint.pt").stat().st_mtime_ns
    q8 = eagle3.train_head(target, tmp_path / "q8.gguf", _prompts(60, CHAIN.n_vocab), work_dir=work,
                           outtype="q8_0", **QUICK)
    assert (work / "checkpoint.pt").stat().st_mtime_ns == stamp  # nothing was trained again
    with eagle3.Model(q8.head) as m:
        assert m.tensors["blk.0.ffn_up.weight"].type == "q8_0"
        assert m.tensors["blk.0.attn_norm.weight"].type == "f32"
    assert q8.held_out_tau >= report.held_out_tau - 0.3
    assert q8.head.stat().st_size < 0.7 * report.head.stat().st_size


def test_an_interrupted_run_resumes_to_the_same_head(tmp_path, monkeypatch):
    target = write_target(tmp_path / "t.gguf", CHAIN)
    prompts = _prompts(30, CHAIN.n_vocab, seed=3)
    args = dict(QUICK, tokens=600, epochs=6, checkpoint_every=3)
    whole = eagle3.train_head(target, tmp_path / "a.gguf", prompts, **args)

    calls = {"n": 0}
    real = fit.Trainer.losses

    def stop_at_eight(self, batch):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return real(self, batch)

    monkeypatch.setattr(fit.Trainer, "losses", stop_at_eight)
    with pytest.raises(KeyboardInterrupt):
        eagle3.train_head(target, tmp_path / "b.gguf", prompts, **args)
    assert not (tmp_path / "b.gguf").exists()
    work = tmp_path / "b.gguf.work"
    data = {p: p.stat().st_mtime_ns for p in work.rglob("*.npz")}
    assert data
    monkeypatch.setattr(fit.Trainer, "losses", real)
    resumed = eagle3.train_head(target, tmp_path / "b.gguf", prompts, **args)
    assert {p: p.stat().st_mtime_ns for p in work.rglob("*.npz")} == data  # the data was reused
    assert resumed.steps == whole.steps
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    saved = json.loads((work / "report.json").read_text())
    assert saved["held_out_tau"] == pytest.approx(resumed.held_out_tau)


def test_a_run_over_more_prompts_computes_only_the_new_ones(tmp_path):
    target = write_target(tmp_path / "t.gguf", CHAIN)
    first, more = _prompts(30, CHAIN.n_vocab, seed=4), _prompts(20, CHAIN.n_vocab, seed=5)
    args = dict(QUICK, epochs=3)
    eagle3.train_head(target, tmp_path / "a.gguf", first, **args)
    work = tmp_path / "a.gguf.work"
    before = {p: p.stat().st_mtime_ns for p in work.rglob("*.npz")}
    # the new prompts first and the old ones reordered: what is known is found by its tokens
    prompts = more + first[::-1]
    grown = eagle3.train_head(target, tmp_path / "b.gguf", prompts, work_dir=work, **args)
    after = {p: p.stat().st_mtime_ns for p in work.rglob("*.npz")}
    assert all(after[p] == t for p, t in before.items())
    added = {p.parent.name: 0 for p in after}
    for p in after.keys() - before.keys():
        added[p.parent.name] += len(np.load(p)["keys"])
    assert added == {"answers": 20, "features": 20}
    fresh = eagle3.train_head(target, tmp_path / "c.gguf", prompts, **args)
    assert (tmp_path / "b.gguf").read_bytes() == (tmp_path / "c.gguf").read_bytes()
    assert grown.answer_tokens == fresh.answer_tokens and grown.held_out_tau == fresh.held_out_tau


def test_prompts_the_target_writes_itself_join_the_given_ones(tmp_path):
    from gguf_edit import as_chat_model

    flat = write_target(tmp_path / "flat.gguf", TargetSpec(n_vocab=64, output_scale=0.05, seed=3))
    target = as_chat_model(flat, tmp_path / "t.gguf", eos=7)
    given = _prompts(10, 64, seed=6)
    args = dict(QUICK, max_new_tokens=16, draft_vocab_size=48, epochs=1, held_out=2)
    report = eagle3.train_head(target, tmp_path / "h.gguf", given, self_prompts=4, **args)
    own = json.loads((tmp_path / "h.gguf.work" / "self-prompts.json").read_text())["prompts"]
    assert own == eagle3.train.self_prompts(target, 4, threads=1, progress=False)
    assert report.train_examples == 10 + 4 - 2
    # asking for fewer reuses them: nothing is written again
    stamp = (tmp_path / "h.gguf.work" / "self-prompts.json").stat().st_mtime_ns
    eagle3.train_head(target, tmp_path / "h2.gguf", given, self_prompts=3, work_dir=tmp_path / "h.gguf.work", **args)
    assert (tmp_path / "h.gguf.work" / "self-prompts.json").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("shape", ["tied-48x5", "qwen2"])
def test_other_target_shapes_and_architectures(tmp_path, shape):
    if shape == "qwen2":
        from gguf_edit import as_qwen2

        spec = CHAIN
        target = as_qwen2(write_target(tmp_path / "llama.gguf", spec), tmp_path / "t.gguf")
    else:
        spec = TargetSpec(n_layer=5, n_embd=48, n_head=6, n_head_kv=3, n_ff=96, n_vocab=300, tied=True, seed=4)
        target = write_target(tmp_path / "t.gguf", spec)
    report = eagle3.train_head(target, tmp_path / "h.gguf", _prompts(16, spec.n_vocab, seed=2),
                               **{**QUICK, "tokens": 300, "epochs": 2, "draft_vocab_size": 64})
    assert eagle3.check_pair(target, report.head).ok
    assert report.draft_vocab_size == 64 and 0 <= max(report.target_layers) < spec.n_layer
    assert np.isfinite(report.held_out_loss).all()
    # the head drafts on this architecture, and greedy speculation stays the target's own output
    prompt = _prompts(1, spec.n_vocab, seed=11)[0]
    with eagle3.Model(target) as tm, eagle3.Model(report.head) as dm, eagle3.Context(tm, n_ctx=128) as tctx, \
            eagle3.Context(dm, other=tctx) as dctx, eagle3.Eagle3Session(tctx, dctx, n_draft_max=3) as s:
        spec_out = s.generate(prompt, 24)
        plain = tctx.generate(prompt, 24)
    np.testing.assert_array_equal(spec_out.tokens, plain.tokens)
    assert spec_out.stats.n_drafted > 0


def test_bad_requests_are_refused_before_any_work(tmp_path):
    target = write_target(tmp_path / "t.gguf", CHAIN)
    ok = _prompts(12, CHAIN.n_vocab)
    out = tmp_path / "h.gguf"
    cases = [
        (dict(prompts=[np.array([1, 2, CHAIN.n_vocab], np.int32)] + ok), eagle3.InvalidArgumentError, "vocabulary"),
        (dict(prompts=[np.zeros((2, 2), np.int32)] + ok), eagle3.InvalidArgumentError, "1-D"),
        (dict(prompts=ok[:4]), eagle3.InvalidArgumentError, "held_out"),
        (dict(prompts=ok, layers=[0, 1, CHAIN.n_layer]), eagle3.InvalidArgumentError, "layers"),
        (dict(prompts=ok, layers=[0, 1]), eagle3.InvalidArgumentError, "layers"),
        (dict(prompts=ok, tokens=0), eagle3.InvalidArgumentError, "tokens"),
        (dict(prompts=ok, self_prompts=-1), eagle3.InvalidArgumentError, "self_prompts"),
        (dict(prompts=ok, ttt_steps=2.5), eagle3.ArgumentTypeError, "ttt_steps"),
        (dict(prompts=ok, outtype="q4_0"), eagle3.InvalidArgumentError, "outtype"),
        (dict(prompts=ok, teacher="gpu"), eagle3.InvalidArgumentError, "teacher"),
    ]
    for kwargs, exc, words in cases:
        with pytest.raises(exc, match=words):
            eagle3.train_head(target, out, **{**QUICK, **kwargs})
    assert not out.exists()
    # a work folder made with other settings is not silently mixed in
    eagle3.train_head(target, out, ok, **{**QUICK, "tokens": 50, "epochs": 1})
    with pytest.raises(eagle3.InvalidArgumentError, match="other settings"):
        eagle3.train_head(target, tmp_path / "h.gguf", ok, **{**QUICK, "tokens": 50, "epochs": 1, "top_k": 8})
    with pytest.raises(eagle3.InvalidArgumentError, match="teacher"):  # (its data differs by the rounding)
        eagle3.train_head(target, tmp_path / "h.gguf", ok, **{**QUICK, "tokens": 50, "epochs": 1, "teacher": "torch"})


def test_the_torch_teacher_makes_the_engines_answers_and_a_head_as_good(trained, tmp_path):
    target, engine_report = trained
    prompts = _prompts(60, CHAIN.n_vocab)
    report = eagle3.train_head(target, tmp_path / "head.gguf", prompts, **{**QUICK, "teacher": "torch", "n_seq": 16})
    assert eagle3.check_pair(target, report.head).ok
    assert report.held_out_tau >= 3.0, report
    assert report.answer_tokens == engine_report.answer_tokens
    # the answers are the engine's own greedy answers, token for token
    from eagle3.train.data import _Store

    mine, engine = _Store(tmp_path / "head.gguf.work" / "answers", "answers"), \
        _Store(engine_report.head.with_name("head.gguf.work") / "answers", "answers")
    assert len(mine.items) >= 40
    for key, item in mine.items.items():
        np.testing.assert_array_equal(item["tokens"], engine[key]["tokens"])


def test_a_target_whose_hidden_states_cannot_be_read_is_refused(pair_paths, tmp_path):
    _, draft = pair_paths["random-own-embd"]  # an eagle3 model is no target
    with pytest.raises(eagle3.InvalidArgumentError, match="cannot read hidden states"):
        eagle3.train_head(draft, tmp_path / "h.gguf", _prompts(12, 300), **QUICK)


def test_without_pytorch_the_error_says_what_to_install(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(eagle3.Eagle3Error, match=r"eagle3\[train\]"):
        eagle3.train_head(tmp_path / "missing.gguf", tmp_path / "h.gguf")


def test_cli_train_head(tmp_path, capsys):
    from eagle3.cli import main

    target = write_target(tmp_path / "t.gguf", CHAIN)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([p.tolist() for p in _prompts(12, CHAIN.n_vocab)]))
    rc = main(["train-head", str(target), "-o", str(tmp_path / "h.gguf"), "--prompts", str(prompts),
               "--tokens", "100", "--epochs", "1", "--max-new-tokens", "16", "--draft-vocab", "64",
               "--held-out", "2", "--threads", "2", "--teacher", "torch", "--n-seq", "4"])
    assert rc == 0
    assert json.loads((tmp_path / "h.gguf.work" / "data.json").read_text())["teacher"] == "torch"
    assert "held-out tau" in capsys.readouterr().out
    assert eagle3.check_pair(target, tmp_path / "h.gguf").ok
    shutil.rmtree(tmp_path / "h.gguf.work")
