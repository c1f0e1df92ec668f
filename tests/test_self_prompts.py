"""eagle3.train.self_prompts: chat prompts a target writes from its own chat template."""

from __future__ import annotations

import pytest

import eagle3
from eagle3.testing import TargetSpec, write_target
from eagle3.train import self_prompts
from gguf_edit import as_chat_model, rewrite


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("self-prompts")
    # flat next-token distributions: a sampled turn ends (EOS) after about n_vocab tokens
    plain = write_target(root / "t.gguf", TargetSpec(n_vocab=64, output_scale=0.05, seed=3))
    return as_chat_model(plain, root / "chat.gguf", eos=7)


def test_the_target_writes_distinct_finished_turns(chat_target):
    got = self_prompts(chat_target, 6, max_tokens=400, threads=1, progress=False)
    assert len(got) == 6 and len({p.casefold() for p in got}) == 6
    assert all(p and p == p.strip() and "<|im_start|>" not in p for p in got)
    assert self_prompts(chat_target, 6, max_tokens=400, threads=1, progress=False) == got
    other = self_prompts(chat_target, 6, max_tokens=400, seed=1, threads=1, progress=False)
    assert other != got


def test_turns_the_model_does_not_end_are_not_kept(chat_target):
    # 4 tokens are too few to reach EOS often: what does not end within them is dropped, and the
    # tries stop at 4 n, so fewer than asked come back
    got = self_prompts(chat_target, 8, max_tokens=4, threads=1, progress=False)
    assert len(got) < 8


def test_bad_requests(chat_target, tmp_path):
    plain = rewrite(chat_target, tmp_path / "plain.gguf", drop_kv=("tokenizer.chat_template",))
    with pytest.raises(eagle3.InvalidArgumentError, match="no chat template"):
        self_prompts(plain, 2, progress=False)
    with pytest.raises(eagle3.InvalidArgumentError, match="n = 0"):
        self_prompts(chat_target, 0, progress=False)
    with pytest.raises(eagle3.ArgumentTypeError, match="max_tokens"):
        self_prompts(chat_target, 2, max_tokens=1.5, progress=False)
    with pytest.raises(eagle3.ModelLoadError):
        self_prompts(tmp_path / "missing.gguf", 2, progress=False)
