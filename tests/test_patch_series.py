"""The llama.cpp patch series (patches/llama.cpp/): its form, what the build made of it,
and ``build_support/llama_cpp.py try-patches`` on the pristine pinned files and on a
tree it does not fit.

Only the files the series touches are taken from the pinned archive (the whole
vendored tree is large), so these tests take a few seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import tarfile
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3 import _build_config

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "build_support" / "llama_cpp.py"
pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="needs the source tree")


def _load_build_support():
    spec = importlib.util.spec_from_file_location("eagle3_build_llama_cpp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bs():
    return _load_build_support()


@pytest.fixture(scope="module")
def patches(bs):
    return bs.patch_series.read_series(bs.SERIES)


@pytest.fixture(scope="module")
def pristine(bs, patches, tmp_path_factory) -> Path:
    """The pristine pinned versions of the files the series touches (a partial tree)."""
    if not (bs.ARCHIVE_DIR / bs.SDIST_FILE).exists():
        pytest.skip(f"the pinned archive {bs.SDIST_FILE} is not in {bs.ARCHIVE_DIR} (the build fetches it)")
    dest = tmp_path_factory.mktemp("pristine")
    bs.extract_pristine(bs.patch_series.touched(patches), dest)
    return dest


def _copy(tree: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "llama.cpp"
    shutil.copytree(tree, dest)
    return dest


def _digests(tree: Path) -> dict[str, str]:
    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file()}


def _try(tree: Path) -> tuple[int, dict[str, str]]:
    result = subprocess.run([sys.executable, str(SCRIPT), "try-patches", str(tree)], capture_output=True, text=True)
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines() if line.split()[0].endswith(".patch"))
    return result.returncode, lines


def test_the_series_is_every_patch_in_its_folder_each_explained(bs, patches):
    folder = bs.SERIES.parent
    assert sorted(p.name for p in patches) == sorted(p.name for p in folder.glob("*.patch"))
    for p in patches:
        explanation = re.split(r"^(?:diff --git |--- )", p.path.read_text(), maxsplit=1, flags=re.M)[0]
        assert len(explanation.split()) >= 20, f"{p.name} does not start with its explanation"
        for f in p.files:  # llama.cpp's own paths, -p1
            assert not (f.path.startswith("vendor/") or f.path.startswith("a/") or f.path.startswith("b/")), f.path


def test_the_series_applies_to_the_pristine_pinned_files(pristine):
    before = _digests(pristine)
    rc, lines = _try(pristine)
    assert rc == 0, lines
    assert len(lines) == len(list((REPO / "patches" / "llama.cpp").glob("*.patch")))
    assert set(lines.values()) == {"applies"}, lines
    assert _digests(pristine) == before  # nothing written into the tree tried


def test_a_hunk_that_no_longer_fits_names_its_patch(pristine, tmp_path):
    tree = _copy(pristine, tmp_path)
    qwen2 = tree / "src" / "models" / "qwen2.cpp"
    text = qwen2.read_text()
    assert text.count("ggml_tensor * inpSA = inpL;") == 1
    qwen2.write_text(text.replace("ggml_tensor * inpSA = inpL;", "ggml_tensor * inpSA = inpL; // edited"))
    # and lines added at the top of another file only move its hunks
    log = tree / "common" / "log.cpp"
    log.write_text("// one\n// two\n" + log.read_text())
    before = _digests(tree)

    rc, lines = _try(tree)
    assert rc == 1
    assert lines["qwen2-layer-inputs.patch"].startswith("fails (src/models/qwen2.cpp: hunk #1 of 1, @@ -69,6 ")
    assert lines["common-log-callback.patch"].startswith("applies with offsets (common/log.cpp #1 +2 lines")
    others = {name: outcome for name, outcome in lines.items()
              if name not in ("qwen2-layer-inputs.patch", "common-log-callback.patch")}
    assert set(others.values()) == {"applies"}, others
    assert _digests(tree) == before


@pytest.mark.parametrize("command", [["patch"], ["git", "apply"]])
def test_both_tools_give_the_same_tree_and_tell_applied_patches(bs, patches, pristine, tmp_path, command):
    if not shutil.which(command[0]):
        pytest.skip(f"{command[0]} is not installed")
    tree = _copy(pristine, tmp_path)
    outcomes = [bs.patch_series.apply(p, tree, 0, command) for p in patches]
    assert [o.status for o in outcomes] == ["applies"] * len(patches), [o.describe() for o in outcomes]
    again = bs.patch_series.apply(patches[0], tree, 0, command)
    assert again.status == "fails" and "already applied" in again.detail
    source = Path(_build_config.LLAMA_CPP_SOURCE)
    if (source / "common").is_dir() and source.resolve() == (bs.SDIST_ROOT / "vendor" / "llama.cpp").resolve():
        # the tree this package was built from is the pristine one with the series applied
        for rel in bs.patch_series.touched(patches):
            assert (tree / rel).read_bytes() == (source / rel).read_bytes(), rel


def test_try_patches_refuses_a_folder_that_is_not_llama_cpp(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "try-patches", str(tmp_path)], capture_output=True,
                            text=True)
    assert result.returncode == 2 and "not a llama.cpp tree" in result.stderr


def test_the_build_patches_again_only_when_the_series_changes(bs, patches, pristine, tmp_path, monkeypatch):
    # a stand-in for the extracted sdist and its archive: the pristine files the
    # series touches, and an archive of just those
    sdist = tmp_path / bs.SDIST_DIRECTORY
    vendor = sdist / "vendor" / "llama.cpp"
    shutil.copytree(pristine, vendor)
    (vendor / "README.md").write_text("untouched by the series\n")
    archive_dir = tmp_path / "packagefiles"
    archive_dir.mkdir()
    with tarfile.open(archive_dir / bs.SDIST_FILE, "w:gz") as archive:
        archive.add(sdist, arcname=bs.SDIST_DIRECTORY)
    monkeypatch.setattr(bs, "SDIST_SHA256", hashlib.sha256((archive_dir / bs.SDIST_FILE).read_bytes()).hexdigest())
    series = tmp_path / "series"
    shutil.copytree(bs.SERIES.parent, series)

    assert bs.patch_pinned(sdist, archive_dir, series / "series")
    qwen2 = vendor / "src" / "models" / "qwen2.cpp"
    assert "res->t_layer_inp[il] = inpL;" in qwen2.read_text()
    mtimes = {p: p.stat().st_mtime_ns for p in vendor.rglob("*") if p.is_file()}
    assert not bs.patch_pinned(sdist, archive_dir, series / "series")  # unchanged: nothing to do

    # a changed patch: the tree is the pristine one with the new series, and only the
    # file whose content changed is written
    (series / "qwen2-layer-inputs.patch").write_text(
        (series / "qwen2-layer-inputs.patch").read_text().replace("res->t_layer_inp[il] = inpL;",
                                                                 "res->t_layer_inp[il] = inpL; // changed"))
    assert bs.patch_pinned(sdist, archive_dir, series / "series")
    assert "res->t_layer_inp[il] = inpL; // changed" in qwen2.read_text()
    assert [p for p in mtimes if p.stat().st_mtime_ns != mtimes[p]] == [qwen2]

    # a patch left out of the series: its file goes back to the pristine one
    lines = (series / "series").read_text().splitlines()
    (series / "series").write_text("\n".join(line for line in lines if line != "qwen2-layer-inputs.patch") + "\n")
    assert bs.patch_pinned(sdist, archive_dir, series / "series")
    assert qwen2.read_bytes() == (pristine / "src" / "models" / "qwen2.cpp").read_bytes()

    # a patch that does not apply: the build stops and names it, the tree stays as it was
    (series / "series").write_text("\n".join(lines) + "\n")
    (series / "qwen2-layer-inputs.patch").write_text(
        (series / "qwen2-layer-inputs.patch").read_text().replace("ggml_tensor * inpSA = inpL;",
                                                                 "ggml_tensor * inpSA = inpL; // no such line"))
    before = _digests(vendor)
    with pytest.raises(SystemExit, match="qwen2-layer-inputs.patch does not apply"):
        bs.patch_pinned(sdist, archive_dir, series / "series")
    assert _digests(vendor) == before


@pytest.mark.parametrize("reports_amx", [False, True])
def test_stock_builds_keep_llama_cpps_defaults_but_amx_where_the_cpu_reports_it(bs, monkeypatch, reports_amx):
    monkeypatch.setattr(bs, "cpu_reports_amx", lambda: reports_amx)
    args = bs._stock_cmake_args("Release")
    flags = [a for a in args if a.startswith(("-DCMAKE_C_FLAGS=", "-DCMAKE_CXX_FLAGS="))]
    if reports_amx:
        assert flags == [f"-DCMAKE_C_FLAGS={' '.join(bs.NO_AMX_FLAGS)}", f"-DCMAKE_CXX_FLAGS={' '.join(bs.NO_AMX_FLAGS)}"]
    else:
        assert flags == []
    # never eagle3's own define or options
    assert not any("BATCH_INVARIANT" in a or "GGML_NATIVE" in a or "LLAMAFILE" in a for a in args)
