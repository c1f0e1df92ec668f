"""Random sequences of API calls (hypothesis stateful testing), run in a child process.

Every call either works or raises an eagle3 error; a call that raises
anything else fails the run, and an abort kills the child, which the parent
test reports. Correct rounds of the speculative loop are interleaved with
hostile calls, so both the loop and its edges are reached.

Usage: ``python api_machine.py TARGET DRAFT EXAMPLES``.
"""

from __future__ import annotations

import sys
import unittest
from collections import Counter

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import eagle3

TARGET, DRAFT = sys.argv[1], sys.argv[2]
MODELS = {"target": eagle3.Model(TARGET), "draft": eagle3.Model(DRAFT)}
N_VOCAB = MODELS["target"].n_vocab


def mostly(valid, hostile):
    """``valid`` most of the time, ``hostile`` some of the time."""
    return st.integers(0, 7).flatmap(lambda k: hostile if k == 7 else valid)


token = st.integers(0, N_VOCAB - 1)
hostile_token = st.sampled_from([-1, N_VOCAB, 2**31 - 1, -(2**31)])
seq = mostly(st.integers(0, 2), st.sampled_from([-1, 3, 300]))
small = mostly(st.integers(0, 8), st.integers(-2, 12))

OUTCOMES: Counter = Counter()
FAILED = object()


def attempt(call, *args, **kwargs):
    """Run a call; eagle3 errors are expected outcomes (FAILED), anything else is a bug."""
    name = getattr(call, "__name__", "call")
    try:
        result = call(*args, **kwargs)
    except eagle3.Eagle3Error as e:
        OUTCOMES[f"{name}: {type(e).__name__}"] += 1
        return FAILED
    OUTCOMES[f"{name}: ok"] += 1
    return result


class Api(RuleBasedStateMachine):
    @initialize(n_seq_max=st.integers(1, 3), n_batch=st.sampled_from([16, 64, 512]))
    def setup(self, n_seq_max, n_batch):
        self.target = eagle3.Context(MODELS["target"], n_ctx=512, n_batch=n_batch, n_seq_max=n_seq_max)
        self.draft = eagle3.Context(MODELS["draft"], other=self.target)
        self.session = None
        self.batch = eagle3.Batch(64, n_seq_max=3)
        self.stale = eagle3.Batch(64, n_seq_max=3)
        self.views = []
        self.last = []     # the last generated prompt and output (continuations reuse it)
        self.states = []   # saved states, loaded later (often into something else)

    def _next_pos(self, s):
        held = attempt(self.target.seq_pos_max, s)
        return None if held is FAILED else held + 1

    @rule(n_seq=mostly(st.integers(1, 3), st.integers(-1, 4)), n_draft_max=mostly(st.integers(1, 8), small),
          n_min=mostly(st.just(0), small), p_min=mostly(st.just(0.0), st.floats(-0.5, 1.5)))
    def new_session(self, n_seq, n_draft_max, n_min, p_min):
        if self.session is not None:
            self.session.close()
        session = attempt(eagle3.Eagle3Session, self.target, self.draft, n_seq=n_seq, n_draft_max=n_draft_max,
                          n_min=n_min, p_min=p_min)
        self.session = None if session is FAILED else session

    @rule(s=seq, toks=st.lists(token, min_size=1, max_size=20), bad=mostly(st.none(), hostile_token),
          shift=mostly(st.just(0), st.integers(-3, 3)), output=st.sampled_from(["last", "all", "none"]),
          process=mostly(st.just(True), st.just(False)))
    def prefill(self, s, toks, bad, shift, output, process):
        """Decode tokens of one sequence (and usually process them)."""
        start = self._next_pos(s)
        self.batch.clear()
        if bad is not None:
            toks = toks + [bad]
        if attempt(self.batch.add_sequence, toks, (start or 0) + shift, s, output) is FAILED:
            return
        if attempt(self.target.decode, self.batch) is not FAILED:
            attempt(self.target.logits, -1)
            if process and self.session is not None:
                attempt(self.session.process, self.batch)

    @rule(s=st.integers(0, 2), n_accept=st.integers(0, 8), id_last=token)
    def round(self, s, n_accept, id_last):
        """One correct round of the loop: draft, verify in one batch, process, accept, trim."""
        if self.session is None or self.session.closed:
            return
        n_past = self._next_pos(s)
        if n_past is None:
            return
        draft = attempt(self.session.draft, s, n_past, id_last)
        if draft is FAILED:
            return
        self.batch.clear()
        if attempt(self.batch.add_sequence, np.concatenate([[id_last], draft]), n_past, s, "all") is FAILED:
            return
        if FAILED in (attempt(self.target.decode, self.batch), attempt(self.session.process, self.batch)):
            return
        n = min(n_accept, len(draft))
        attempt(self.session.accept, s, n)
        attempt(self.target.seq_rm, s, n_past + 1 + n)

    @rule(op=st.sampled_from(["decode", "process", "draft", "accept", "draft_many", "begin", "stats"]),
          s=seq, n=small, t=mostly(token, hostile_token), p=st.integers(-2, 600), exact=st.booleans(),
          stale=st.booleans())
    def chaos(self, op, s, n, t, p, exact, stale):
        """One call with arguments that are often wrong."""
        batch = self.stale if stale else self.batch
        if op == "decode":
            attempt(self.target.decode, batch)
            return
        session = self.session
        if session is None:
            return
        if op == "process":
            attempt(session.process, batch)
        elif op == "draft":
            attempt(session.draft, s, (self._next_pos(s) or 0) if exact else p, t)
        elif op == "accept":
            attempt(session.accept, s, n)
        elif op == "draft_many":
            seqs = [s, (s + 1) % 3, s]  # the repeat is refused
            attempt(session.draft_many, seqs[:max(1, n % 4)], [self._next_pos(x) or 0 for x in seqs[:max(1, n % 4)]],
                    [t] * max(1, n % 4))
        elif op == "begin":
            attempt(session.begin, s, [t] * n if n > 0 else [])
        else:
            attempt(session.stats, s if n % 2 else None)
            attempt(session.print_stats)

    @rule(k=st.integers(0, 60), toks=st.lists(token, max_size=6), n=st.integers(1, 10), reuse=st.booleans(),
          n_prompts=st.integers(1, 3))
    def generate(self, k, toks, n, reuse, n_prompts):
        """A whole generation, often continuing (or leaving early) the last one: prefix reuse."""
        if self.session is None:
            return
        prompt = (self.last[:k] + toks) or [1]
        if n_prompts == 1:
            g = attempt(self.session.generate, prompt, n, reuse=reuse)
            if g is not FAILED:
                self.last = prompt + [int(t) for t in g.tokens]
        else:
            attempt(self.session.generate_batch, [prompt, prompt + toks, toks or [2]][:n_prompts], n, reuse=reuse)

    @rule(which=st.sampled_from(["session", "target", "target-seq", "draft-seq"]), s=seq)
    def save_state(self, which, s):
        if which == "session":
            data = attempt(self.session.save_state) if self.session is not None else FAILED
        elif which == "target":
            data = attempt(self.target.save_state)
        else:
            data = attempt((self.target if which == "target-seq" else self.draft).save_state, s)
        if data is not FAILED:
            self.states = (self.states + [data])[-4:]

    @rule(i=st.integers(0, 3), into=st.sampled_from(["session", "target", "draft"]), s=mostly(st.none(), seq),
          damage=mostly(st.just(0), st.integers(1, 3)), at=st.integers(0, 2**20))
    def load_state(self, i, into, s, damage, at):
        """A saved state, whole or damaged, into the session or a context it may not fit."""
        if not self.states:
            return
        data = self.states[i % len(self.states)]
        if damage == 1:
            data = data[:at % len(data)]
        elif damage == 2:
            data = data[:at % len(data)] + bytes([data[at % len(data)] ^ 0x10]) + data[at % len(data) + 1:]
        elif damage == 3:
            data = b""
        if into == "session":
            if self.session is not None:
                attempt(self.session.load_state, data)
        else:
            attempt((self.target if into == "target" else self.draft).load_state, data, seq_id=s)

    @rule(i=mostly(st.integers(-2, 0), st.integers(-6, 70)), keep=st.booleans())
    def logits(self, i, keep):
        view = attempt(self.target.logits, i)
        if view is not FAILED:
            assert view.shape == (N_VOCAB,)
            if keep:
                self.views.append(view)
        attempt(self.target.argmax, i)

    @rule()
    def drop_views(self):
        self.views.clear()

    @rule(s=seq, p0=st.integers(-1, 40), p1=st.integers(-1, 40), on_draft=st.booleans(), clear=st.booleans())
    def trim(self, s, p0, p1, on_draft, clear):
        ctx = self.draft if on_draft else self.target
        attempt(ctx.clear) if clear else attempt(ctx.seq_rm, s, p0, p1)

    @rule(what=st.sampled_from(["session", "draft", "target"]))
    def close(self, what):
        obj = {"session": self.session, "draft": self.draft, "target": self.target}[what]
        if obj is not None:
            obj.close()

    @precondition(lambda self: self.target.closed or self.draft.closed)
    @rule()
    def reopen(self):
        self.target.close()
        self.target = eagle3.Context(MODELS["target"], n_ctx=512, n_seq_max=3)
        self.draft = eagle3.Context(MODELS["draft"], other=self.target)
        self.session = None

    @invariant()
    def views_stay_readable(self):
        for view in getattr(self, "views", []):
            float(view[-1])

    def teardown(self):
        self.views = []
        if getattr(self, "target", None) is not None:
            self.target.close()


if __name__ == "__main__":
    Api.TestCase.settings = settings(max_examples=int(sys.argv[3]), stateful_step_count=25, deadline=None,
                                     derandomize=True, suppress_health_check=list(HealthCheck))
    result = unittest.TextTestRunner(verbosity=0).run(unittest.defaultTestLoader.loadTestsFromTestCase(Api.TestCase))
    print("\n".join(f"{count:7d}  {outcome}" for outcome, count in sorted(OUTCOMES.items())))
    # the sequences must reach the speculative loop itself, not only its error paths
    reached = all(OUTCOMES[f"{name}: ok"] >= 50 for name in ("decode", "process", "draft", "accept", "logits"))
    print("PASSED" if result.wasSuccessful() and reached else "FAILED")
    sys.exit(0 if result.wasSuccessful() and reached else 1)
