"""A built wheel installs and works in a fresh virtual environment."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SMOKE = """
import tempfile
import eagle3
from eagle3.testing import DraftSpec, TargetSpec, write_pair
with tempfile.TemporaryDirectory() as d:
    t, dr = write_pair(d, TargetSpec(weights="chain"), DraftSpec(weights="aligned"))
    with eagle3.Model(t) as tm, eagle3.Model(dr) as dm, eagle3.Context(tm) as tc, \\
            eagle3.Context(dm, other=tc) as dc, eagle3.Eagle3Session(tc, dc) as s:
        b = eagle3.Batch.from_tokens([1, 2, 3]); tc.decode(b); s.process(b)
        print("DRAFT", len(s.draft(0, 3, tc.argmax(-1))), eagle3.__file__)
"""


@pytest.mark.skipif(not (REPO / "pyproject.toml").exists(), reason="needs the source tree")
def test_wheel_installs_and_runs_in_a_fresh_venv(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(REPO)],
                   check=True, capture_output=True)
    wheels = list((tmp_path / "dist").glob("eagle3-*.whl"))
    assert len(wheels) == 1
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheels[0])], check=True, capture_output=True)
    result = subprocess.run([str(python), "-c", SMOKE], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DRAFT 3" in result.stdout and str(env_dir) in result.stdout
