"""A child forked before its parent generated (multiprocessing's default start on Linux) can generate.

(After the parent has decoded, a forked child hangs in OpenMP's thread pool: that case
is not supported yet, and not tested.)"""

from __future__ import annotations

import os

import pytest

from conftest import run_python

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CHILD = r"""
import os, sys
import eagle3
from helpers_path import *  # noqa
target_path, draft_path, when = sys.argv[1], sys.argv[2], sys.argv[3]
tm = eagle3.Model(target_path); dm = eagle3.Model(draft_path)
tc = eagle3.Context(tm); dc = eagle3.Context(dm, other=tc)
session = eagle3.Eagle3Session(tc, dc, n_draft_max=3)
expected = tc.generate([5, 6, 7], 24).tokens.tolist() if when == "after" else None
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        got = session.generate([5, 6, 7], 24).tokens.tolist()
        with eagle3.Model(target_path) as m2, eagle3.Context(m2) as c2:
            fresh = c2.generate([5, 6, 7], 24).tokens.tolist()
        os.write(w, b"ok" if got == fresh else b"differ")
    finally:
        os._exit(0)
os.waitpid(pid, 0)
child = os.read(r, 16).decode()
parent = session.generate([5, 6, 7], 24).tokens.tolist()
print(child, parent == (expected or parent))
"""


@pytest.mark.parametrize("when", ["before"])
def test_a_forked_child_generates(pair_paths, when):
    target, draft = pair_paths["random"]
    code = CHILD.replace("from helpers_path import *  # noqa\n", "")
    result = run_python(code, str(target), str(draft), when, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "True"]
