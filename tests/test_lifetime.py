"""Lifetimes: nothing the user closes or drops can crash the interpreter."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import eagle3
from conftest import run_python
from helpers import greedy, speculative


def test_session_keeps_dropped_contexts_alive(chain_pair):
    target_path, draft_path = chain_pair
    target, draft = eagle3.Model(target_path), eagle3.Model(draft_path)
    prompt = np.array([5, 6, 7], np.int32)
    expected = greedy(target, prompt, 20)
    tctx = eagle3.Context(target)
    session = eagle3.Eagle3Session(tctx, eagle3.Context(draft, other=tctx), n_draft_max=3)
    witness = weakref.ref(tctx)
    del tctx, target, draft  # the session holds what it needs
    gc.collect()
    assert witness() is not None
    assert speculative(session, session.target, prompt, 20) == expected
    session.target.model.close()  # closes the target context, then the session
    assert session.closed
    with pytest.raises(eagle3.ClosedError):
        session.draft(0, 3, 1)


def test_close_is_idempotent_and_cascades(tiny_pair):
    with eagle3.Model(tiny_pair[0]) as target, eagle3.Model(tiny_pair[1]) as draft:
        tctx = eagle3.Context(target)
        dctx = eagle3.Context(draft, other=tctx)
        session = eagle3.Eagle3Session(tctx, dctx)
        tctx.close()
        tctx.close()
        assert dctx.closed and session.closed and not draft.closed
        for call in (lambda: tctx.decode(eagle3.Batch.from_tokens([1])), lambda: dctx.logits(0),
                     lambda: session.accept(0, 0), lambda: session.stats(), lambda: tctx.seq_pos_max(0)):
            with pytest.raises(eagle3.ClosedError):
                call()
        with pytest.raises(eagle3.ClosedError):
            eagle3.Context(draft, other=tctx)
    with pytest.raises(eagle3.ClosedError):
        target.tokenize("x")


CLOSE_EVERY_ORDER = """
import gc, itertools, sys
import numpy as np
import eagle3
tp, dp = sys.argv[1], sys.argv[2]
names = ["session", "dctx", "dmodel", "tctx", "tmodel"]
for order in itertools.permutations(range(5)):
    tm = eagle3.Model(tp); dm = eagle3.Model(dp)
    tc = eagle3.Context(tm); dc = eagle3.Context(dm, other=tc)
    s = eagle3.Eagle3Session(tc, dc, n_draft_max=2)
    b = eagle3.Batch.from_tokens([1, 2, 3]); tc.decode(b); s.process(b)
    view = tc.logits(-1)
    objs = [s, dc, dm, tc, tm]
    for i in order:
        objs[i].close()
    assert all(o.closed for o in objs)
    float(view.sum())  # still readable
    del objs, s, dc, dm, tc, tm, view
    gc.collect()
# drop everything in every order without closing
for order in itertools.permutations(range(5)):
    tm = eagle3.Model(tp); dm = eagle3.Model(dp)
    tc = eagle3.Context(tm); dc = eagle3.Context(dm, other=tc)
    objs = [eagle3.Eagle3Session(tc, dc), dc, dm, tc, tm]
    del tm, dm, tc, dc
    for i in sorted(order, reverse=True):
        objs.pop(i)
        gc.collect()
print("DONE")
"""


def test_close_and_drop_in_every_order(tiny_pair):
    result = run_python(CLOSE_EVERY_ORDER, str(tiny_pair[0]), str(tiny_pair[1]), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DONE" in result.stdout


EXIT_WITH_LIVE_OBJECTS = """
import sys
import eagle3
tm = eagle3.Model(sys.argv[1]); dm = eagle3.Model(sys.argv[2])
tc = eagle3.Context(tm); dc = eagle3.Context(dm, other=tc)
s = eagle3.Eagle3Session(tc, dc)
b = eagle3.Batch.from_tokens([1, 2, 3]); tc.decode(b); s.process(b)
d = s.draft(0, 3, tc.argmax(-1))
view = tc.logits(-1)
cycle = [s, tc]; cycle.append(cycle)  # a reference cycle the collector meets at exit
print("EXITING")
"""


def test_interpreter_exit_with_everything_open(tiny_pair):
    result = run_python(EXIT_WITH_LIVE_OBJECTS, str(tiny_pair[0]), str(tiny_pair[1]))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "EXITING" in result.stdout


def test_objects_that_own_llama_cpp_memory_cannot_be_copied_or_pickled(spec_setup):
    import copy
    import pickle

    tctx, dctx, session = spec_setup
    for obj in (tctx.model, tctx, dctx, session, eagle3.Batch(4)):
        for copier in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be copied or pickled"):
                copier(obj)
    assert session.generate([5, 6], 4).finish_reason == "length"  # and nothing was shared or lost
