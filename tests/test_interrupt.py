"""Ctrl-C, cancel() and close() from another thread stop a running generation promptly and lose nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import eagle3
from helpers import greedy

# a child process generates over and over until Ctrl-C lands in one call, then proves the session
# still works; it reports when it caught the KeyboardInterrupt
CHILD = r"""
import json, sys, time
import eagle3

target_path, draft_path, kind = sys.argv[1], sys.argv[2], sys.argv[3]
with eagle3.Model(target_path) as tm, eagle3.Model(draft_path) as dm, \
        eagle3.Context(tm, n_ctx=4096, n_batch=4096, n_ubatch=512, n_seq_max=2) as target, \
        eagle3.Context(dm, other=target) as draft, \
        eagle3.Eagle3Session(target, draft, n_seq=2, n_draft_max=3) as session:
    calls = {
        "generate": lambda: session.generate([5, 6, 7], 4000),
        "generate_batch": lambda: session.generate_batch([[5, 6, 7], [8, 9]], 2000),
        "stream": lambda: list(session.stream([5, 6, 7], 4000)),
        "plain": lambda: target.generate([5, 6, 7], 4000),
        "decode": lambda: (target.clear(), target.decode(eagle3.Batch.from_tokens([t % 200 for t in range(2000)]))),
    }
    reference = session.generate([1, 2, 3], 20).tokens.tolist()
    print("go", flush=True)
    try:
        while True:
            calls[kind]()
    except KeyboardInterrupt:
        caught = time.time()
    again = session.generate([1, 2, 3], 20).tokens.tolist()
    print(json.dumps({"caught": caught, "usable": again == reference}), flush=True)
"""


@pytest.mark.parametrize("kind", ["generate", "generate_batch", "stream", "plain", "decode"])
def test_ctrl_c_interrupts_within_half_a_second_and_the_session_goes_on(pair_paths, kind):
    target, draft = pair_paths["random"]
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target), str(draft), kind],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "go"
        time.sleep(0.3)
        sent = time.time()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["caught"] - sent < 0.5
    assert report["usable"]


def _cancel_later(call, delay: float = 0.2) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), call()))
    thread.start()
    return thread


@pytest.fixture
def long_session(models):
    target, draft = models["random"]
    with eagle3.Context(target, n_ctx=8192) as tctx, eagle3.Context(draft, other=tctx) as dctx, \
            eagle3.Eagle3Session(tctx, dctx, n_draft_max=3) as session:
        yield session


def test_cancel_from_another_thread_ends_the_generation_with_what_it_has(long_session):
    session = long_session
    model = session.target.model
    thread = _cancel_later(session.cancel)
    g = session.generate([5, 6, 7], 8000)
    thread.join()
    assert g.finish_reason == "cancelled"
    assert 0 < len(g.tokens) < 8000
    n = min(50, len(g.tokens))
    assert g.tokens[:n].tolist() == greedy(model, [5, 6, 7], n)
    # a generation after it is whole, and right
    again = session.generate([5, 6, 7], 40)
    assert again.finish_reason == "length" and again.tokens.tolist() == greedy(model, [5, 6, 7], 40)


def test_a_cancel_before_a_call_does_not_affect_it(long_session):
    session = long_session
    session.cancel()
    assert session.generate([5, 6, 7], 30).finish_reason == "length"
    session.target.cancel()
    session.target.clear()
    session.target.decode(eagle3.Batch.from_tokens([1, 2, 3]))
    assert session.target.generate([1, 2], 10).finish_reason == "length"


def test_cancelling_a_stream_ends_it(long_session):
    stream = long_session.stream([5, 6, 7], 8000)
    tokens = [next(stream)]
    long_session.cancel()
    tokens += list(stream)
    assert stream.generation.finish_reason == "cancelled" and len(tokens) < 8000


def test_close_from_another_thread_does_not_wait_for_the_generation(models):
    target, draft = models["random"]
    tctx = eagle3.Context(target, n_ctx=8192)
    dctx = eagle3.Context(draft, other=tctx)
    session = eagle3.Eagle3Session(tctx, dctx, n_draft_max=3)
    took = []
    thread = _cancel_later(lambda: (took.append(time.perf_counter()), tctx.close(),
                                    took.append(time.perf_counter())))
    g = session.generate([5, 6, 7], 8000)
    thread.join()
    assert g.finish_reason == "cancelled"
    assert took[1] - took[0] < 1.0
    assert session.closed and dctx.closed and tctx.closed
    with pytest.raises(eagle3.ClosedError):
        session.generate([1], 2)


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_generating_outside_the_main_thread_leaves_sigint_alone(long_session):
    before = signal.getsignal(signal.SIGINT)
    result = []
    thread = threading.Thread(target=lambda: result.append(long_session.generate([5, 6, 7], 30)))
    thread.start()
    thread.join()
    assert result[0].finish_reason == "length"
    assert signal.getsignal(signal.SIGINT) is before
