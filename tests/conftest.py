"""Shared fixtures: tiny GGUF models synthesized once per test session."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import eagle3
from eagle3.testing import DraftSpec, TargetSpec, write_pair

# gguf-py reports every file it writes at INFO
logging.getLogger("gguf").setLevel(logging.WARNING)

# Pairs of several shapes. "chain"/"aligned" pairs accept most drafts (and
# reject some), "random" pairs accept almost nothing.
PAIRS = {
    "random": (TargetSpec(), DraftSpec()),
    "random-d2t": (TargetSpec(n_layer=5, n_embd=48, n_head=6, n_head_kv=3, n_ff=96, seed=3),
                   DraftSpec(n_head=2, n_head_kv=1, d2t=128, target_layers=(0, 2, 4), seed=4)),
    "random-own-embd": (TargetSpec(n_layer=3, n_embd=32, n_head=2, n_head_kv=1, n_vocab=300, seed=5),
                        DraftSpec(n_embd=48, n_head=3, n_head_kv=3, own_embeddings=True, seed=6)),
    "chain": (TargetSpec(weights="chain", seed=7), DraftSpec(weights="aligned", agreement=0.7, seed=8)),
    "chain-d2t": (TargetSpec(n_layer=6, n_embd=64, n_head=8, n_head_kv=2, weights="chain", seed=9),
                  DraftSpec(weights="aligned", n_head=8, n_head_kv=8, agreement=0.9, d2t=200, seed=10)),
    # a flatter next-token distribution, for sampling
    "chain-soft": (TargetSpec(weights="chain", output_scale=0.1, seed=11),
                   DraftSpec(weights="aligned", agreement=0.8, seed=12)),
    # and a draft whose own distribution is flat too, for rejection verification
    "chain-soft-q": (TargetSpec(weights="chain", output_scale=0.1, seed=11),
                     DraftSpec(weights="aligned", agreement=0.8, output_scale=0.1, seed=12)),
}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def pair_paths(model_dir):
    """name -> (target path, draft path) for every pair in PAIRS."""
    return {name: write_pair(model_dir, t, d, name=name) for name, (t, d) in PAIRS.items()}


@pytest.fixture(scope="session")
def tiny_pair(pair_paths):
    return pair_paths["random"]


@pytest.fixture(scope="session")
def chain_pair(pair_paths):
    return pair_paths["chain"]


@pytest.fixture(scope="session")
def models(pair_paths):
    """name -> (target Model, draft Model), loaded once."""
    loaded = {name: (eagle3.Model(t), eagle3.Model(d)) for name, (t, d) in pair_paths.items()}
    yield loaded
    for target, draft in loaded.values():
        draft.close()
        target.close()


@pytest.fixture
def tiny_models(models):
    return models["random"]


@pytest.fixture
def spec_setup(tiny_models):
    """A target context, a draft context and a session over the random pair."""
    target, draft = tiny_models
    tctx = eagle3.Context(target, n_ctx=512)
    dctx = eagle3.Context(draft, other=tctx)
    session = eagle3.Eagle3Session(tctx, dctx, n_draft_max=4)
    yield tctx, dctx, session
    tctx.close()


@pytest.fixture
def chain_session(models):
    """A session of 4 sequences over the chain pair (whose drafts are mostly accepted)."""
    target, draft = models["chain"]
    tctx = eagle3.Context(target, n_ctx=512, n_seq_max=4)
    dctx = eagle3.Context(draft, other=tctx)
    session = eagle3.Eagle3Session(tctx, dctx, n_seq=4, n_draft_max=6)
    yield session
    tctx.close()


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter, so that an abort cannot take the suite down."""
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def expect_exception(code: str, exc_name: str, *args: str) -> str:
    """Run ``code`` in a subprocess; it must raise ``eagle3.<exc_name>`` and exit normally.

    The snippet runs inside ``try``; the wrapper prints the exception's
    classes and message, so the test sees a signal (negative return code) as
    a crash. A subclass of ``exc_name`` passes.
    """
    wrapped = ("import sys, eagle3\ntry:\n" + textwrap.indent(textwrap.dedent(code), "    ") +
               "\nexcept eagle3.Eagle3Error as e:\n"
               "    print('RAISED', *[c.__name__ for c in type(e).__mro__], '|', e)\n"
               "else:\n    print('NO EXCEPTION')\n")
    result = run_python(wrapped, *args)
    assert result.returncode == 0, f"crashed with return code {result.returncode}:\n{result.stderr[-3000:]}"
    raised = result.stdout.partition("RAISED ")[2].partition(" | ")[0].split()
    assert exc_name in raised, f"{result.stdout}\n{result.stderr[-3000:]}"
    return result.stdout
