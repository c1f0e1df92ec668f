"""A client generating over RPC until a server fails, run as a child process by
test_rpc.py (so that an abort or a hang cannot take the test run down).

    python rpc_client.py TARGET DRAFT ENDPOINT[,ENDPOINT] WAY

WAY is how it generates: generate, stream, batch, plain, manual (the loop by
hand through decode/process/draft/accept), remote-draft (the draft on the
servers too). It prints "started" once it is ready, a line "phase NAME"
before each phase (load, context, session, generate), then one JSON line: the
error's classes and message, whether the next call failed the same way, and
the threads and descriptors it holds before loading and after closing.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import eagle3

PROMPTS = [[1, 5, 9, 2, 7], [3, 3, 8], [11, 4, 6, 2]]


def counts() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def counts_settled(want: tuple[int, int], wait_s: float = 5.0) -> tuple[int, int]:
    """The counts once they are back to ``want``, or after ``wait_s``. A joined
    thread can still be listed for a moment: pthread_join returns when the
    kernel has cleared the thread's id, before it removes the thread from
    /proc/self/task (seen: one extra thread, gone 0.5 s later). One left
    behind stays listed."""
    deadline = time.monotonic() + wait_s
    while (now := counts()) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return now


def manual_round(session, target, draft, prompt, n_predict=24):
    prompt = np.asarray(prompt, dtype=np.int32)
    target.clear()
    draft.clear()
    batch = eagle3.Batch(len(prompt) + session.n_draft_max + 1)
    batch.add_sequence(prompt, 0, 0)
    target.decode(batch)
    session.process(batch)
    session.begin(0, prompt)
    n_past, last, out = len(prompt), target.argmax(-1), 0
    while out < n_predict:
        draft = session.draft(0, n_past, last)
        batch.clear()
        batch.add(last, n_past, 0, True)
        for i, token in enumerate(draft):
            batch.add(int(token), n_past + 1 + i, 0, True)
        target.decode(batch)
        session.process(batch)
        n = 0
        while n < len(draft) and target.argmax(n) == draft[n]:
            n += 1
        session.accept(0, n)
        last = target.argmax(n)
        n_past += n + 1
        out += n + 1
        target.seq_rm(0, n_past)


def main() -> None:
    target_path, draft_path, servers, way = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
    local_draft = eagle3.Model(draft_path) if way != "remote-draft" else None
    with eagle3.Model(target_path) as warm, eagle3.Model(draft_path) as warm_draft:
        # (this machine's compute threads start once per process: they are not the client's)
        tctx = eagle3.Context(warm, n_ctx=256)
        eagle3.Eagle3Session(tctx, eagle3.Context(warm_draft, other=tctx), n_draft_max=4).generate(PROMPTS[0], 8)
    before = counts()
    print("started", flush=True)

    def phase(name):
        print("phase", name, flush=True)

    result: dict = {"way": way}
    objects: list = []
    step = None
    try:
        phase("load")
        target = eagle3.Model(target_path, rpc_servers=servers)
        objects.append(target)
        draft = local_draft or eagle3.Model(draft_path, rpc_servers=servers)
        if draft is not local_draft:
            objects.append(draft)
        n_seq = 3 if way == "batch" else 1
        phase("context")
        tctx = eagle3.Context(target, n_ctx=768, n_seq_max=n_seq)
        objects.insert(0, tctx)
        dctx = eagle3.Context(draft, other=tctx, n_seq_max=n_seq)
        phase("session")
        session = eagle3.Eagle3Session(tctx, dctx, n_seq=n_seq, n_draft_max=4)
        objects.insert(0, session)
        phase("generate")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if way == "batch":
                step = lambda: session.generate_batch(PROMPTS, max_new_tokens=24)  # noqa: E731
            elif way == "stream":
                step = lambda: list(session.stream(PROMPTS[0], max_new_tokens=24))  # noqa: E731
            elif way == "plain":
                step = lambda: tctx.generate(PROMPTS[1], max_new_tokens=24)  # noqa: E731
            elif way == "manual":
                step = lambda: manual_round(session, tctx, dctx, PROMPTS[2])  # noqa: E731
            else:
                step = lambda: session.generate(PROMPTS[0], max_new_tokens=24)  # noqa: E731
            step()
        result["error"] = None
    except eagle3.Eagle3Error as e:
        result["error"] = [c.__name__ for c in type(e).__mro__]
        result["message"] = str(e)
        if step is not None:  # the model is lost: the next call fails too, at once
            t0 = time.monotonic()
            try:
                step()
                result["again"] = None
            except eagle3.Eagle3Error as again:
                result["again"] = type(again).__name__
            result["again_s"] = time.monotonic() - t0
    for obj in objects:
        obj.close()
    result["before"], result["after"] = before, counts_settled(before)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
