"""Mutated GGUF files: every one loads or raises an eagle3 error; none aborts.

A worker process loads and uses each file (model, context, decode; for
drafts a whole session); hypothesis mutates a target and a draft: bit flips
in the header, truncation, metadata values set to edge cases or to another
type, tensors removed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eagle3
from gguf_edit import T, rewrite

EXAMPLES = int(os.environ.get("EAGLE3_FUZZ_GGUF", "500"))


class Worker:
    def __init__(self, target: Path):
        self.target = target
        self.proc = None
        self.replies: dict[str, int] = {}

    def start(self):
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("gguf_worker.py")),
                                      str(self.target)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def run(self, path: Path) -> str:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply:
            self.proc.wait()
            err = self.proc.stderr.read()[-2000:]
            self.proc = None
            pytest.fail(f"the worker died (return code {self.proc_rc(err)}) on {path}:\n{err}")
        kind = reply.split(" ")[0] if reply == "ok" else " ".join(reply.split(" ")[:2])
        self.replies[kind] = self.replies.get(kind, 0) + 1
        return reply

    @staticmethod
    def proc_rc(err: str) -> str:
        return "signal" if "GGML" in err or "terminate" in err else "non-zero"

    def stop(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def worker(tiny_pair):
    w = Worker(tiny_pair[0])
    yield w
    w.stop()
    # the mutants must reach llama.cpp: some load and run, many are refused in several ways
    print("worker replies:", w.replies)
    assert w.replies.get("ok", 0) > 0
    assert sum(1 for kind in w.replies if kind.startswith("error")) >= 2


@pytest.fixture(scope="module")
def headers(tiny_pair):
    """(path, bytes, metadata types, end of the header) of the target and the draft."""
    out = []
    for path in tiny_pair:
        _, types, tensors = eagle3.read_gguf(path)
        out.append((path, path.read_bytes(), types, min(t.offset for t in tensors.values())))
    return out


EDGE_VALUES = {
    "uint32": st.sampled_from([0, 1, 2, 3, 5, 7, 64, 65, 511, 512, 513, 2**16, 2**31 - 1, 2**32 - 1]),
    "int32": st.sampled_from([-(2**31), -1, 0, 1, 3, 2**31 - 1]),
    "float32": st.sampled_from([0.0, -0.0, -1.0, 1e-30, 1e30, float("inf"), float("-inf"), float("nan")]),
    "bool": st.booleans(),
}
GGUF_TYPES = {"uint32": T.UINT32, "int32": T.INT32, "float32": T.FLOAT32, "bool": T.BOOL}

mutation = st.one_of(
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)),
                                        min_size=1, max_size=6)),
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("value"), st.data()),
    st.tuples(st.just("retype"), st.data()),
    st.tuples(st.just("layers"), st.lists(st.integers(-3, 12), min_size=3, max_size=3)
              | st.lists(st.integers(-3, 12), min_size=1, max_size=5)),
    st.tuples(st.just("drop-tensor"), st.data()),
)


def mutate(tmp: Path, header, kind, arg) -> Path:
    path, data, types, header_end = header
    out = tmp / "mutant.gguf"
    if kind == "flip":
        buf = bytearray(data)
        for where, bit in arg:
            buf[int(where * header_end)] ^= 1 << bit
        out.write_bytes(bytes(buf))
    elif kind == "truncate":
        out.write_bytes(data[:int(arg * len(data))])
    elif kind == "value":
        keys = sorted(k for k, t in types.items() if t in EDGE_VALUES)
        key = arg.draw(st.sampled_from(keys))
        rewrite(path, out, set_kv={key: (arg.draw(EDGE_VALUES[types[key]]), GGUF_TYPES[types[key]])})
    elif kind == "retype":
        keys = sorted(k for k, t in types.items() if t in EDGE_VALUES and k != "general.architecture")
        key = arg.draw(st.sampled_from(keys))
        new = arg.draw(st.sampled_from([t for t in GGUF_TYPES if t != types[key]] + ["string"]))
        value = "7" if new == "string" else arg.draw(EDGE_VALUES[new])
        rewrite(path, out, set_kv={key: (value, T.STRING if new == "string" else GGUF_TYPES[new])})
    elif kind == "layers":
        if "eagle3.target_layers" not in types:
            return mutate(tmp, header, "truncate", 0.5)
        rewrite(path, out, set_kv={"eagle3.target_layers": (arg, T.ARRAY, T.INT32)})
    else:
        names = sorted(eagle3.read_gguf(path)[2])
        rewrite(path, out, drop_tensors=[arg.draw(st.sampled_from(names))])
    return out


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(which=st.integers(0, 1), change=mutation)
def test_mutated_files_never_crash(worker, headers, tmp_path, which, change):
    path = mutate(tmp_path, headers[which], *change)
    reply = worker.run(path)
    assert reply == "ok" or reply.startswith("error "), reply
