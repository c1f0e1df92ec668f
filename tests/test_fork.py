"""A forked child (multiprocessing's default start on Linux) can generate, whether its parent
had generated before the fork or not, and so can a child of that child."""

from __future__ import annotations

import os

import pytest

from conftest import run_python

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CHILD = r"""
import os, sys
import eagle3
target_path, draft_path, when, depth, kind = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
tm = eagle3.Model(target_path); dm = eagle3.Model(draft_path)
tc = eagle3.Context(tm, n_seq_max=2)
if kind == "eagle3":
    session = eagle3.Eagle3Session(tc, eagle3.Context(dm, other=tc), n_seq=2, n_draft_max=3)
elif kind == "draft":  # the target as its own draft model
    session = eagle3.DraftSession(tc, eagle3.Context(tm, n_ctx=tc.n_ctx, n_seq_max=2), n_seq=2, n_draft_max=3)
else:
    session = eagle3.NgramSession(tc, "simple", n_seq=2, n_draft_max=3, size_n=1, size_m=3)
prompt = [5, 6, 7]
expected = tc.generate(prompt, 24).tokens.tolist()
if when == "after":
    session.generate(prompt, 24)

def generate_in_child(levels):
    # what the child writes back: its own speculative, batched and fresh results agree
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = b"?"
        try:
            got = session.generate(prompt, 24).tokens.tolist()
            batch = [g.tokens.tolist() for g in session.generate_batch([prompt, prompt], 24)]
            with eagle3.Model(target_path) as m2, eagle3.Context(m2) as c2:
                fresh = c2.generate(prompt, 24).tokens.tolist()
            ok = got == fresh == expected and batch == [expected, expected]
            status = b"ok" if ok else b"differ"
            if ok and levels > 1:
                status = generate_in_child(levels - 1)
        finally:
            os.write(w, status)
            os._exit(0)
    os.close(w)
    _, code = os.waitpid(pid, 0)
    return os.read(r, 16) if code == 0 else b"died"

print(generate_in_child(depth).decode(), session.generate(prompt, 24).tokens.tolist() == expected)
"""


@pytest.mark.parametrize("when, depth, kind", [("before", 1, "eagle3"), ("after", 1, "eagle3"), ("after", 2, "eagle3"),
                                              ("after", 1, "draft"), ("before", 1, "ngram"), ("after", 2, "ngram")])
def test_a_forked_child_generates(pair_paths, when, depth, kind):
    target, draft = pair_paths["random"]
    result = run_python(CHILD, str(target), str(draft), when, str(depth), kind, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "True"]


POOL = r"""
import multiprocessing as mp, sys
import eagle3
target_path = sys.argv[1]
model = eagle3.Model(target_path)
context = eagle3.Context(model)
expected = context.generate([1, 2, 3], 16).tokens.tolist()

def work(first):
    return context.generate([first, 2, 3], 16).tokens.tolist()

with mp.get_context("fork").Pool(2) as pool:
    results = pool.map(work, [1, 4, 1, 4], chunksize=1)
print(results[0] == results[2] == expected, results[1] == results[3] == work(4))
"""


def test_a_fork_pool_generates_after_the_parent(pair_paths):
    target, _ = pair_paths["random"]
    result = run_python(POOL, str(target), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
