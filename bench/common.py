"""Shared pieces of the benchmarks: a model pair large enough to time, and timing helpers."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from eagle3 import _build_config

from eagle3.testing import DraftSpec, TargetSpec, write_pair

BUILD = Path(__file__).resolve().parent / ".build"
REPO = BUILD.parent.parent


def build_stock(*targets: str, rpc: bool = False) -> Path:
    """llama.cpp tools built from the tree eagle3 was built from, with llama.cpp's
    own default options (not eagle3's): what a user would otherwise run; ``rpc``
    adds its RPC backend (GGML_RPC=ON, in a build folder of its own).
    Rebuilt only where something changed; returns the folder of the binaries."""
    build_dir = BUILD / ("llama.cpp-stock-rpc" if rpc else "llama.cpp-stock")
    cmd = [sys.executable, str(REPO / "build_support" / "llama_cpp.py"), "build", "--stock",
           "--source", _build_config.LLAMA_CPP_SOURCE, "--build-dir", str(build_dir),
           "--out-dir", str(build_dir / "lib"), "--rpc", "true" if rpc else "false"]
    for target in targets:
        cmd += ["--target", target]
    subprocess.run(cmd, check=True)
    return build_dir / "bin"


def machine_peaks(threads: int) -> dict | None:
    """This machine's peak 8-bit integer multiply-adds and f32 fused multiply-adds
    per second with ``threads`` threads busy (bench/peak.c, built here for this
    CPU with the system C compiler): ``{"int8": {"op", "per_s"}, "f32": {...}}``,
    or None where nothing can build it."""
    source = Path(__file__).resolve().parent / "peak.c"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    flags = ["-O2", "-march=native", "-pthread"]
    key = hashlib.sha256(source.read_bytes() + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
    binary = BUILD / f"peak-{key}"
    if not binary.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        built = subprocess.run([compiler, *flags, "-o", str(binary), str(source)], capture_output=True, text=True)
        if built.returncode != 0:
            print(f"bench/peak.c did not build ({compiler}): {built.stderr.strip()[:300]}", file=sys.stderr)
            return None
    return json.loads(subprocess.run([str(binary), str(threads)], check=True, capture_output=True, text=True).stdout)


def multiply_adds_per_token(model) -> dict[str, int]:
    """Weight multiply-adds one token costs, split by what multiplies them:
    ``int8`` for quantized weights (their kernels take 8-bit integer dot
    products), ``f32`` for f32, f16 and bf16 ones. The token embeddings count
    only where they are the output head too (no ``output.weight``)."""
    tensors = model.tensors
    counts = {"int8": 0, "f32": 0}
    for name, info in tensors.items():
        if len(info.shape) != 2 or (name == "token_embd.weight" and "output.weight" in tensors):
            continue
        counts["f32" if info.type in ("f32", "f16", "bf16") else "int8"] += info.shape[0] * info.shape[1]
    return counts


# A 28M-parameter llama target (8 layers, width 512, 4096 tokens) whose greedy
# next token follows a fixed rule, and an EAGLE-3 draft that knows 90% of the
# rule: decoding is not all overhead, and drafts are mostly accepted.
TARGET = TargetSpec(n_layer=8, n_embd=512, n_head=8, n_head_kv=4, n_ff=1408, n_vocab=4096, weights="chain", seed=21)
DRAFT = DraftSpec(n_head=8, n_head_kv=8, n_ff=1408, weights="aligned", agreement=0.9, seed=22)
PROMPT = list(range(100, 132))


# The same target with a draft that knows nothing: speculation cannot pay.
RANDOM_DRAFT = DraftSpec(n_head=8, n_head_kv=8, n_ff=1408, seed=23)

# The tests' tiny pair (0.2M parameters): a loop's own overhead dominates.
TINY_TARGET = TargetSpec(weights="chain", seed=7)
TINY_DRAFT = DraftSpec(weights="aligned", agreement=0.7, seed=8)


def pair(name: str = "bench") -> tuple[Path, Path]:
    """A benchmark pair (``"bench"``, ``"bench-random"`` or ``"tiny"``), written once into bench/.build/models."""
    target_spec, draft_spec = {"bench": (TARGET, DRAFT), "bench-random": (TARGET, RANDOM_DRAFT),
                               "tiny": (TINY_TARGET, TINY_DRAFT)}[name]
    directory = BUILD / "models"
    target, draft = directory / f"{name}-target.gguf", directory / f"{name}-draft.gguf"
    if not (target.exists() and draft.exists()):
        logging.getLogger("gguf").setLevel(logging.WARNING)
        write_pair(directory, target_spec, draft_spec, name=name)
    return target, draft


def side_by_side(*fns, rounds: int = 7) -> list[float]:
    """Median wall time of each function, run in turn ``rounds`` times after a warm-up,
    so that both see the same machine (these machines are shared and noisy)."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, spent in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - t0)
    return [statistics.median(spent) for spent in times]


def pass_costs(ctx, context, sizes, repeats: int = 10, rounds: int = 7) -> list[float]:
    """Seconds of one pass over k tokens after ``context`` (freshly decoded into
    ``ctx``), for each k in ``sizes``, measured side by side. Each block
    repeats one size, so llama.cpp reuses the compute graph as it does while
    decoding; each pass is dropped again, so every pass sees the same cache."""
    import eagle3

    ctx.clear()
    ctx.decode(eagle3.Batch.from_tokens(context))
    n0 = len(context)

    def passes_of(k: int):
        batch = eagle3.Batch.from_tokens(context[1:k + 1], pos0=n0, output="all")

        def run() -> None:
            for _ in range(repeats):
                ctx.decode(batch)
                ctx.seq_rm(0, n0)
        return run
    return [t / repeats for t in side_by_side(*(passes_of(k) for k in sizes), rounds=rounds)]
