"""The GIL is released while llama.cpp works; calls from several threads are serialized."""

from __future__ import annotations

import sys
import threading

import numpy as np

import eagle3
from conftest import run_python


def _runs_concurrently(work, tries: int = 5) -> bool:
    """True if another thread ran Python code while ``work()`` was inside its call.

    With a huge switch interval the interpreter never takes the GIL away from
    the worker; the main thread can only run once the worker releases it
    itself, which eagle3 does inside llama.cpp calls (and nowhere before).
    A short call on a busy machine can end before the main thread is
    scheduled, so it counts if one of a few tries overlaps.
    """
    return any(_overlaps(work) for _ in range(tries))


def _overlaps(work) -> bool:
    started = threading.Event()
    done = []

    def worker():
        started.set()
        work()
        done.append(True)

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        thread = threading.Thread(target=worker)
        thread.start()
        started.wait()
        overlapped = not done
        thread.join()
    finally:
        sys.setswitchinterval(old)
    return overlapped


def test_the_probe_sees_code_that_keeps_the_gil(tiny_models):
    target, _ = tiny_models
    assert not _runs_concurrently(lambda: sum(range(200_000)))
    assert not _runs_concurrently(lambda: target.is_eog(3))


def test_decode_releases_the_gil(tiny_models):
    target, _ = tiny_models
    with eagle3.Context(target, n_ctx=512, n_batch=512) as ctx:
        batch = eagle3.Batch.from_tokens(np.arange(400) % target.n_vocab)
        assert _runs_concurrently(lambda: ctx.decode(batch))


def test_model_loading_releases_the_gil(tiny_pair):
    models = []
    assert _runs_concurrently(lambda: models.append(eagle3.Model(tiny_pair[0])))
    for model in models:
        model.close()


def test_process_and_draft_release_the_gil(spec_setup):
    tctx, _, session = spec_setup
    batch = eagle3.Batch.from_tokens(np.arange(100))
    tctx.decode(batch)
    assert _runs_concurrently(lambda: session.process(batch))
    assert _runs_concurrently(lambda: session.draft(0, 100, 3))


HAMMER = """
import random, sys, threading
import numpy as np
import eagle3
tm = eagle3.Model(sys.argv[1]); dm = eagle3.Model(sys.argv[2])
tc = eagle3.Context(tm, n_seq_max=4); dc = eagle3.Context(dm, other=tc)
s = eagle3.Eagle3Session(tc, dc, n_seq=4, n_draft_max=3)
unexpected = []

def hammer(seed):
    rng = random.Random(seed)
    seq = seed % 4
    for _ in range(300):
        try:
            op = rng.randrange(6)
            if op == 0:
                n = tc.seq_pos_max(seq) + 1
                b = eagle3.Batch.from_tokens([rng.randrange(256)], pos0=n, seq_id=seq, n_seq_max=4)
                tc.decode(b); s.process(b)
            elif op == 1:
                s.draft(seq, tc.seq_pos_max(seq) + 1, rng.randrange(256))
            elif op == 2:
                s.accept(seq, 0)
            elif op == 3:
                tc.logits(-1).sum()
            elif op == 4:
                tc.seq_rm(seq, max(0, tc.seq_pos_max(seq) - 2))
            else:
                s.stats(seq)
        except eagle3.Eagle3Error:
            pass  # another thread changed the state in between: a clean error is fine
        except Exception as e:
            unexpected.append(repr(e))

threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
closer = threading.Thread(target=tc.close)
workers = [threading.Thread(target=hammer, args=(100 + i,)) for i in range(4)]
for t in workers + [closer]: t.start()
for t in workers + [closer]: t.join()
print("UNEXPECTED", unexpected[:5])
print("DONE", len(unexpected))
"""


def test_many_threads_on_one_session_never_crash(tiny_pair):
    result = run_python(HAMMER, str(tiny_pair[0]), str(tiny_pair[1]), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DONE 0" in result.stdout, result.stdout
