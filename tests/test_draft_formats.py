"""Every EAGLE-3 checkpoint format converts to what it means, or is refused in one line.

For each tool's layout (tests/draft_checkpoints.py) a tiny random draft is saved, converted
with ``eagle3 convert``, and run by llama.cpp on the target's real hidden states; its logits
at the first and second draft steps must match the draft's forward pass in PyTorch, fed the
same target's hidden states at the layers the checkpoint means. A draft converted with the
wrong layers, a norm left out or a state fed back wrong would differ.
"""

from __future__ import annotations

import numpy as np
import pytest

import eagle3

torch = pytest.importorskip("torch", reason="conversion needs the train extra: pip install '.[train]'")
pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from draft_checkpoints import ReferenceDraft, Shape, Variant, save, write_hf_target  # noqa: E402
from eagle3.convert import ConversionError, convert  # noqa: E402

N_LAYER = 8  # llama.cpp's default layers for it: inputs of 2, 4 and 5

CASES = {  # name: (tool, variant, target layers as llama.cpp counts them (None: the config names none), shape)
    "eagle-trainer": ("eagle", Variant(), None, Shape()),
    "specforge": ("specforge", Variant(), [1, 4, 6], Shape()),
    "specforge-eagle3.1": ("specforge", Variant(fc_norm=True, norm_output=True), [2, 5, 7], Shape()),
    "speculators": ("speculators", Variant(norm_before_residual=True, own_embeddings=True), [1, 3, 6], Shape()),
    "speculators-qwen3-layer": ("speculators", Variant(norm_before_residual=True, qk_norm=True), [2, 4, 7],
                                Shape(head_dim=24)),
    "speculators-norm-before-fc": ("speculators", Variant(norm_before_fc=True, norm_output=True), [3, 5, 6],
                                   Shape()),
    "speculators-fc-norm": ("speculators", Variant(fc_norm=True), [2, 4, 5], Shape()),
    "modelopt": ("modelopt", Variant(), [1, 4, 7], Shape(draft_vocab=None)),
    "angelslim": ("angelslim", Variant(), [2, 3, 6], Shape()),
    "specforge-without-ids": ("specforge", Variant(), None, Shape()),
}
PROMPTS = ("def f3(x):\n    return", "def f12(x):")


@pytest.fixture(scope="module")
def hf_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    return root, write_hf_target(root, N_LAYER)


def _llama_cpp_draft_logits(target_gguf, draft_gguf, prompt, n_steps):
    """The draft's logits at step ``n_steps`` after the prompt, the token the target chose
    after it, and the tokens the draft drafted."""
    with eagle3.Model(target_gguf) as tm, eagle3.Model(draft_gguf) as dm, eagle3.Context(tm) as tc, \
            eagle3.Context(dm, other=tc) as dc, \
            eagle3.Eagle3Session(tc, dc, n_draft_max=n_steps, p_min=0.0) as session:
        tokens = tm.tokenize(prompt)
        batch = eagle3.Batch.from_tokens(tokens)
        tc.decode(batch)
        session.process(batch)
        id_last = tc.argmax(-1)
        drafted = session.draft(0, len(tokens), id_last).tolist()
        assert len(drafted) == n_steps
        return session.draft_logits(), tokens, id_last, drafted


@torch.no_grad()
def _reference_logits(draft, target, layers, tokens, id_last, drafted):
    """The draft's logits at steps 1 and 2, by its own definition."""
    hidden = target(input_ids=torch.from_numpy(tokens.astype(np.int64))[None], output_hidden_states=True)
    features = torch.cat([hidden.hidden_states[i][0] for i in layers], -1)  # (inputs of those layers)
    emb_table = target.model.embed_tokens.weight
    n = len(tokens)
    fed = torch.tensor([*tokens[1:].tolist(), id_last])
    step1, state, cache = draft.step(draft.embed(fed, emb_table), draft.fuse(features), torch.arange(n))
    step2, _, _ = draft.step(draft.embed(torch.tensor(drafted[:1]), emb_table), state[-1:], torch.tensor([n]),
                             cache)
    return step1[-1].numpy(), step2[0].numpy()


# llama.cpp keeps the KV cache in f16: logits of about unit size agree to ~1e-3
ATOL = 5e-3


def _difference(ours, theirs) -> float:
    assert np.array_equal(np.isfinite(ours), np.isfinite(theirs)), "the draft vocabularies differ"
    finite = np.isfinite(theirs)
    return float(np.max(np.abs(ours[finite] - theirs[finite])))


@pytest.mark.parametrize("case", list(CASES))
def test_a_converted_draft_computes_what_its_checkpoint_means(hf_target, tmp_path, case, caplog):
    root, target = hf_target
    tool, variant, layers, shape = CASES[case]
    draft = ReferenceDraft(shape, variant, seed=len(case))
    save(draft, tmp_path / "draft", tool, layers, N_LAYER)
    with caplog.at_level("WARNING", logger="eagle3"):
        target_gguf, draft_gguf, report = convert(root / "target", tmp_path / "draft", tmp_path, outtype="f32",
                                                  progress=False)
    meant = layers or [2, N_LAYER // 2, N_LAYER - 3]
    assert report.ok, str(report)
    assert report.facts["draft target_layers"] == meant
    assert any("names no target layers" in r.getMessage() for r in caplog.records) == (layers is None)
    # the same draft reading each layer's output instead (the convention slip the ids invite)
    slipped = [min(i + 1, N_LAYER - 1) for i in meant]
    for prompt in PROMPTS:
        step1, tokens, id_last, _ = _llama_cpp_draft_logits(target_gguf, draft_gguf, prompt, 1)
        step2, _, _, drafted = _llama_cpp_draft_logits(target_gguf, draft_gguf, prompt, 2)
        ref1, ref2 = _reference_logits(draft, target, meant, tokens, id_last, drafted)
        assert _difference(step1, ref1) < ATOL and _difference(step2, ref2) < ATOL
        wrong1, _ = _reference_logits(draft, target, slipped, tokens, id_last, drafted)
        assert _difference(step1, wrong1) > 10 * ATOL  # (so the check above can fail)
    # and it generates: speculation keeps the target's greedy output
    with eagle3.Model(target_gguf) as tm, eagle3.Model(draft_gguf) as dm, eagle3.Context(tm) as tc, \
            eagle3.Context(dm, other=tc) as dc, eagle3.Eagle3Session(tc, dc, n_draft_max=3) as session:
        prompt = tm.tokenize(PROMPTS[0])
        assert session.generate(prompt, 16).tokens.tolist() == tc.generate(prompt, 16).tokens.tolist()


def test_target_layers_given_by_the_caller_win(hf_target, tmp_path):
    root, _ = hf_target
    save(ReferenceDraft(Shape(), Variant()), tmp_path / "draft", "specforge", None, N_LAYER)
    _, _, report = convert(root / "target", tmp_path / "draft", tmp_path, outtype="f32", target_layers=[1, 2, 8],
                           progress=False)
    assert report.facts["draft target_layers"] == [1, 2, 8] and "the caller" in report.facts["draft format"]


REFUSED = {  # name: (tool, change to config.json, extra tensor, words the one-line message must hold)
    "two-draft-layers": ("specforge", {"num_hidden_layers": 2}, None, "num_hidden_layers"),
    "attention-bias": ("modelopt", {"attention_bias": True}, None, "attention_bias"),
    "a-bias-tensor": ("eagle", {}, "midlayer.self_attn.q_proj.bias", "midlayer.self_attn.q_proj.bias"),
    "both-fc-norms": ("speculators", {"fc_norm": True, "norm_before_fc": True}, None, "fc_norm"),
    "parallel-drafting": ("modelopt", {"eagle_config": {"parallel_draft_step": 3}}, None, "parallel_draft_step"),
    "four-layers": ("speculators", {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}, None, "exactly 3"),
    "no-target-features": ("modelopt", {"eagle_config": {"use_aux_hidden_state": False}}, None,
                           "use_aux_hidden_state"),
    "mla-layer": ("specforge", {"architectures": ["Eagle3DeepseekV2ForCausalLM"]}, None, "MLA"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_llama_cpp_cannot_run_is_refused_in_one_line(hf_target, tmp_path, case, capsys):
    import json

    from eagle3.cli import main
    from safetensors.torch import load_file, save_file

    root, _ = hf_target
    tool, change, tensor, words = REFUSED[case]
    directory = tmp_path / "draft"
    save(ReferenceDraft(Shape(), Variant()), directory, tool, [2, 4, 5], N_LAYER)
    config = json.loads((directory / "config.json").read_text())
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) and key in config else value
    (directory / "config.json").write_text(json.dumps(config))
    if tensor:
        tensors = load_file(str(directory / "model.safetensors"))
        save_file({**tensors, tensor: torch.zeros(4)}, str(directory / "model.safetensors"))
    with pytest.raises(ConversionError, match="llama.cpp cannot run") as e:
        convert(root / "target", directory, tmp_path, progress=False)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert main(["convert", str(root / "target"), str(directory), "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*eagle3*.gguf"))  # refused before anything was converted
