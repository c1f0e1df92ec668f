"""MTP sessions: the target's own NextN heads draft; greedy output stays exact."""

from __future__ import annotations

import pytest

import eagle3
from eagle3.testing import MtpSpec, write_mtp_target
from helpers import greedy, prompts, speculative

N_NEW = 24

MTP_MODELS = {
    "random": MtpSpec(),
    "chain": MtpSpec(weights="chain", noise=0.14, seed=0),
    "chain-2heads": MtpSpec(n_layer=3, nextn=2, n_embd=32, n_head=2, n_head_kv=1, weights="chain", noise=0.02,
                            seed=2),
}


@pytest.fixture(scope="module")
def mtp_models(model_dir):
    loaded = {name: eagle3.Model(write_mtp_target(model_dir / f"mtp-{name}.gguf", spec))
              for name, spec in MTP_MODELS.items()}
    yield loaded
    for model in loaded.values():
        model.close()


def test_mtp_model_loads_its_heads(mtp_models):
    model = mtp_models["chain-2heads"]
    assert model.load_mtp
    assert model.n_layer == 3
    assert model.n_layer_nextn == 2


@pytest.mark.parametrize("name", list(MTP_MODELS))
@pytest.mark.parametrize("n_draft_max", [1, 3, 8])
@pytest.mark.parametrize("p_min", [0.0, 0.5])
def test_mtp_speculative_equals_greedy(mtp_models, name, n_draft_max, p_min):
    model = mtp_models[name]
    cases = prompts(model.n_vocab, count=8, seed=1)
    expected = [greedy(model, p, N_NEW) for p in cases]
    with eagle3.Context(model, n_ctx=512) as tctx, eagle3.Context(model, ctx_type="mtp") as mctx:
        with eagle3.MtpSession(tctx, mctx, n_draft_max=n_draft_max, p_min=p_min) as session:
            for prompt, ref in zip(cases, expected):
                tctx.clear()
                mctx.clear()
                assert speculative(session, tctx, prompt, N_NEW) == ref
            stats = session.stats()
    if name.startswith("chain") and p_min == 0.0:
        assert stats["mean_accepted_length"] > 1.2
    if name == "chain-2heads":
        # one trained head per draft step: drafts never exceed the head count
        assert stats["n_drafted"] <= 2 * stats["n_draft_calls"]


def test_mtp_context_needs_nextn_layers(models):
    target, _ = models["random"]
    with pytest.raises(eagle3.ContextError, match="NextN"):
        eagle3.Context(target, ctx_type="mtp")


def test_mtp_session_needs_an_mtp_context(mtp_models):
    model = mtp_models["random"]
    with eagle3.Context(model) as tctx, eagle3.Context(model) as other:
        with pytest.raises(eagle3.SessionInitError, match="ctx_type='mtp'"):
            eagle3.MtpSession(tctx, other)
