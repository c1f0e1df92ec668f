"""A target split across two local RPC servers against the same target on this CPU.

    python bench/rpc.py [-n 128] [--rounds 5] [--server-threads 1] [--n-draft-max 4] [--stock]

Starts ``eagle3 rpc-server`` processes on 127.0.0.1: two that share the bench
target's layers 1:1, and one that holds them all with as many threads as the
two together, which the local runs use too (the draft stays here). Plain greedy
decoding and greedy EAGLE-3 decoding run on each, interleaved (local, 2
servers, 1 server, local, ...) for ``--rounds`` rounds; the table has the
medians. The bytes per token (both ways) are counted by a relay in front of
each server, in separate untimed runs.

``--stock`` also runs what a user would otherwise run: llama.cpp's own
``rpc-server`` and ``llama-speculative-simple --rpc`` built from the same tree
with llama.cpp's defaults plus GGML_RPC=ON, the same split, draft and threads,
against eagle3's generate over eagle3's servers (decode phase only, as
llama-speculative-simple reports it), alternating.

Loopback has no network latency: over a real network each pass pays a round
trip per server more, which speculation spreads over the tokens a pass accepts.
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

import eagle3
from common import PROMPT, build_stock, pair, side_by_side


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(threads: int, binary=None) -> tuple[subprocess.Popen, int]:
    """eagle3 rpc-server (or llama.cpp's, ``binary``) on a free port, once it listens."""
    port = free_port()
    cmd = ([str(binary), "-p", str(port), "-t", str(threads)] if binary else
           [sys.executable, "-m", "eagle3", "rpc-server", "--port", str(port), "--threads", str(threads)])
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in server.stdout:
        if line.startswith("Listening on"):
            threading.Thread(target=server.stdout.read, daemon=True).start()
            return server, port
    raise SystemExit(f"{cmd[0]} did not start")


class CountingRelay:
    """127.0.0.1:port relayed to a server, counting the bytes each way."""

    def __init__(self, upstream: int):
        self.upstream = upstream
        self.sent = self.received = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for src, dst, field in ((client, server, "sent"), (server, client, "received")):
                threading.Thread(target=self._pipe, args=(src, dst, field), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, field: str) -> None:
        try:
            while data := src.recv(1 << 16):
                setattr(self, field, getattr(self, field) + len(data))
                dst.sendall(data)
        except OSError:
            pass
        try:  # wake the other direction's reader; each closes only what it reads
            dst.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        src.close()


def make_runs(target_model, draft_model, n, n_draft_max, threads):
    target = eagle3.Context(target_model, n_ctx=1024, n_threads=threads)
    draft = eagle3.Context(draft_model, other=target, n_threads=threads)
    session = eagle3.Eagle3Session(target, draft, n_draft_max=n_draft_max)
    plain = eagle3.Context(target_model, n_ctx=1024, n_threads=threads)
    return lambda: plain.generate(PROMPT, n), lambda: session.generate(PROMPT, n)


def stock_speculative(bin_dir, target, draft, endpoints, n, n_draft, threads) -> tuple[float, str]:
    """(decode tokens/s, output) of llama-speculative-simple with the target on the servers."""
    text = " ".join(str(t) for t in PROMPT)  # (a synthesized vocabulary: the tokens' own text)
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(draft),
           "--spec-type", "draft-eagle3", "--spec-draft-n-max", str(n_draft), "-p", text, "-n", str(n),
           "--temp", "0", "-c", "1024", "-t", str(threads), "-tb", str(threads), "--rpc", ",".join(endpoints),
           "-ngl", "99", "-ts", "1,1", "-ngld", "0", "--seed", "1"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", result.stderr)
    if result.returncode != 0 or not found:
        raise SystemExit(f"llama-speculative-simple failed:\n{result.stderr[-3000:]}")
    return float(found.group(3)), result.stdout


def vs_stock(args, target_path, draft_path, threads) -> None:
    bin_dir = build_stock("ggml-rpc-server", "llama-speculative-simple", rpc=True)
    ours = [start_server(args.server_threads) for _ in range(2)]
    theirs = [start_server(args.server_threads, bin_dir / "ggml-rpc-server") for _ in range(2)]
    try:
        endpoints = [f"127.0.0.1:{port}" for _, port in ours]
        with eagle3.Model(target_path, rpc_servers=endpoints, tensor_split=[1, 1]) as tm, \
                eagle3.Model(draft_path) as dm:
            prompt = tm.tokenize(" ".join(str(t) for t in PROMPT))  # (the prompt llama.cpp's tool reads)
            speeds: dict[str, list[float]] = {"eagle3": [], "llama.cpp": []}
            spec_generation(tm, dm, prompt, args.n, args.n_draft_max, threads)  # warm-up
            for _ in range(args.rounds):
                speed, stdout = stock_speculative(bin_dir, target_path, draft_path,
                                             [f"127.0.0.1:{port}" for _, port in theirs], args.n,
                                             args.n_draft_max, threads)
                speeds["llama.cpp"].append(speed)
                time.sleep(0.2)  # (the stock servers see the client leave)
                g = spec_generation(tm, dm, prompt, args.n, args.n_draft_max, threads)
                speeds["eagle3"].append((g.stats.n_generated - 1) / (g.stats.t_total_s - g.stats.t_prefill_s))
                same = g.text[:200] in stdout  # (it prints the prompt, then the output)
    finally:
        for server, _ in ours + theirs:
            server.kill()
            server.wait()
    a, b = statistics.median(speeds["eagle3"]), statistics.median(speeds["llama.cpp"])
    print(f"speculative over 2 RPC servers, decode phase, medians of {args.rounds} alternating runs: "
          f"llama-speculative-simple + rpc-server {b:.1f} t/s | eagle3 {a:.1f} t/s | ratio {a / b:.2f}x | "
          f"same output: {'yes' if same else 'NO'}")


def spec_generation(target_model, draft_model, prompt, n, n_draft_max, threads):
    with eagle3.Context(target_model, n_ctx=1024, n_threads=threads) as target, \
            eagle3.Context(draft_model, other=target, n_threads=threads) as draft, \
            eagle3.Eagle3Session(target, draft, n_draft_max=n_draft_max) as session:
        return session.generate(prompt, n)


def layout(model) -> str:
    return ", ".join(f"{d.name}{'@' + d.endpoint if d.endpoint else ''}: {len(d.layers)} layers"
                     f"{' + output' if d.output else ''}" for d in model.devices if d.layers or d.output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=128, help="tokens per generation")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians)")
    parser.add_argument("--server-threads", type=int, default=1, help="threads of each of the two servers")
    parser.add_argument("--n-draft-max", type=int, default=4)
    parser.add_argument("--stock", action="store_true",
                        help="also against llama.cpp's own rpc-server and llama-speculative-simple")
    args = parser.parse_args()
    target_path, draft_path = pair("bench")
    threads = 2 * args.server_threads
    # two servers sharing the layers, and one server with all of them and as many threads as here
    servers = [start_server(args.server_threads) for _ in range(2)] + [start_server(threads)]
    layouts = {"2 servers": dict(ports=[p for _, p in servers[:2]], tensor_split=[1, 1]),
               "1 server": dict(ports=[servers[2][1]], tensor_split=None)}
    try:
        with eagle3.Model(target_path) as local_target, eagle3.Model(draft_path) as draft_model:
            runs = {"local": make_runs(local_target, draft_model, args.n, args.n_draft_max, threads)}
            remote = {}
            for name, how in layouts.items():
                remote[name] = eagle3.Model(target_path, tensor_split=how["tensor_split"],
                                            rpc_servers=[f"127.0.0.1:{p}" for p in how["ports"]])
                runs[name] = make_runs(remote[name], draft_model, args.n, args.n_draft_max, threads)
            want = list(runs["local"][0]().tokens)
            tokens = len(want)
            assert all(list(run().tokens) == want for pair_of_runs in runs.values() for run in pair_of_runs)
            order = [(name, kind) for kind in (0, 1) for name in runs]
            seconds = dict(zip(order, side_by_side(*[runs[name][kind] for name, kind in order],
                                                   rounds=args.rounds)))
            tau = runs["local"][1]().stats.mean_accepted_length
            placed = {name: layout(model) for name, model in remote.items()}
            for model in remote.values():
                model.close()
            # the bytes, through relays, in runs of their own
            traffic = {}
            for name, how in layouts.items():
                relays = [CountingRelay(p) for p in how["ports"]]
                with eagle3.Model(target_path, rpc_servers=[f"127.0.0.1:{r.port}" for r in relays],
                                  tensor_split=how["tensor_split"]) as counted:
                    for kind, run in enumerate(make_runs(counted, draft_model, args.n, args.n_draft_max, threads)):
                        before = sum(r.sent + r.received for r in relays)
                        run()
                        traffic[name, kind] = (sum(r.sent + r.received for r in relays) - before) / tokens
    finally:
        for server, _ in servers:
            server.kill()
            server.wait()

    print(f"bench target ({target_path.name}); local: {threads} threads here; 2 servers of {args.server_threads} "
          f"thread(s) [{placed['2 servers']}]; 1 server of {threads} threads [{placed['1 server']}]; the draft "
          f"here. {tokens} tokens, n_draft_max {args.n_draft_max}, tau {tau:.2f}; medians of {args.rounds} "
          f"interleaved rounds; output identical.")
    print("| decoding | local tok/s | 2 servers tok/s | / local | bytes/token | 1 server tok/s | / local | bytes/token |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, label in enumerate(("plain", "speculative")):
        local_s = seconds["local", kind]
        cells = [f"{tokens / seconds[name, kind]:.1f} | {local_s / seconds[name, kind]:.2f}x | "
                 f"{traffic[name, kind]:,.0f}" for name in layouts]
        print(f"| {label} | {tokens / local_s:.1f} | " + " | ".join(cells) + " |")
    print("speculative / plain: " + ", ".join(f"{name} {seconds[name, 0] / seconds[name, 1]:.2f}x" for name in runs))
    if args.stock:
        vs_stock(args, target_path, draft_path, threads)


if __name__ == "__main__":
    main()
