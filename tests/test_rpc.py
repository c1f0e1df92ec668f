"""Models split across llama.cpp RPC servers: lossless, and failing closed.

Every server is ``eagle3 rpc-server`` in a child process on 127.0.0.1 (or a
relay on 127.0.0.1 in front of one); nothing reaches any other address.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import eagle3
from eagle3 import remote, shipped
from rpc_servers import (ALLOC_BUFFER, BUFFER_GET_BASE, DEVICE_COUNT, GET_ALIGNMENT, GET_MAX_SIZE, HELLO,
                         CorruptingRelay, RpcServer, free_port, wait_for)

pytestmark = pytest.mark.skipif(not remote.available(), reason="built without the RPC backend")

CLIENT = Path(__file__).with_name("rpc_client.py")
PROMPTS = [[1, 5, 9, 2, 7, 3], [4, 4, 8], [12, 3, 6, 2, 9]]


@pytest.fixture(scope="module")
def servers():
    a, b = RpcServer(), RpcServer()
    yield a, b
    a.kill()
    b.kill()


def greedy(target, draft, n_seq=1):
    """(speculative tokens, plain tokens, logits of a prompt) of greedy decoding."""
    tctx = eagle3.Context(target, n_ctx=768, n_seq_max=n_seq)
    try:
        dctx = eagle3.Context(draft, other=tctx, n_seq_max=n_seq)
        session = eagle3.Eagle3Session(tctx, dctx, n_seq=n_seq, n_draft_max=5)
        spec = [list(session.generate(p, max_new_tokens=40).tokens) for p in PROMPTS]
        spec.append([list(t) for t in session.generate_batch(PROMPTS, max_new_tokens=24).tokens]
                    if n_seq > 1 else [])
        plain = [list(tctx.generate(p, max_new_tokens=24).tokens) for p in PROMPTS]
        tctx.clear()
        tctx.decode(eagle3.Batch.from_tokens(PROMPTS[0], output="all"))
        logits = np.stack([np.array(tctx.logits(i)) for i in range(len(PROMPTS[0]))])
        return spec, plain, logits
    finally:
        tctx.close()


SPLITS = {
    "one server": dict(servers=1),
    "two servers 1:2": dict(servers=2, tensor_split=[1, 2]),
    "half the layers": dict(servers=2, layers="half"),
    "draft remote too": dict(servers=2, tensor_split=[3, 1], draft=True),
}


@pytest.mark.parametrize("pair", ["chain-d2t", "random-own-embd", "random-d2t"])
@pytest.mark.parametrize("split", list(SPLITS))
def test_greedy_over_rpc_is_local_greedy_bit_for_bit(servers, pair_paths, models, pair, split):
    how = SPLITS[split]
    endpoints = [s.endpoint for s in servers[:how["servers"]]]
    target_path, draft_path = pair_paths[pair]
    local_target, local_draft = models[pair]
    n_gpu_layers = local_target.n_layer // 2 if how.get("layers") == "half" else None
    target = eagle3.Model(target_path, n_gpu_layers, rpc_servers=endpoints, tensor_split=how.get("tensor_split"))
    draft = eagle3.Model(draft_path, rpc_servers=endpoints) if how.get("draft") else local_draft
    try:
        got = greedy(target, draft, n_seq=3)
        want = greedy(local_target, local_draft, n_seq=3)
        assert got[0] == want[0]
        assert got[1] == want[1]
        assert np.array_equal(got[2], want[2])  # the same kernels ran remotely: the same bits

        devices = {d.name: d for d in target.devices}
        layers = sorted(il for d in devices.values() for il in d.layers)
        assert layers == list(range(local_target.n_layer))
        assert sum(d.output for d in devices.values()) == 1
        remote_devices = [d for d in devices.values() if d.endpoint is not None]
        if n_gpu_layers is None:  # (some of the layers may all fall on one server)
            assert {d.endpoint for d in remote_devices} == set(endpoints)
        assert all(d.weight_bytes > 0 for d in remote_devices)
        if n_gpu_layers is None:
            assert devices["CPU"].layers == () and not devices["CPU"].output
        else:  # llama.cpp offloads the output layer and the last layers before it
            assert devices["CPU"].layers == tuple(range(local_target.n_layer + 1 - n_gpu_layers))
            assert not devices["CPU"].output
    finally:
        if draft is not local_draft:
            draft.close()
        target.close()


def test_tensor_split_decides_the_layers(servers, pair_paths):
    target_path, _ = pair_paths["chain-d2t"]  # 6 layers
    endpoints = [s.endpoint for s in servers]
    for shares in ([1, 0], [0, 1], [1, 1], [1, 3]):
        with eagle3.Model(target_path, rpc_servers=endpoints, tensor_split=shares) as model:
            on = {d.endpoint: d for d in model.devices if d.endpoint}
            a, b = on.get(endpoints[0]), on.get(endpoints[1])
            got = (len(a.layers) if a else 0, len(b.layers) if b else 0)
            assert sum(got) == 6, model.devices
            assert (a.layers if a else ()) + (b.layers if b else ()) == tuple(range(6))  # in order
            if 0 in shares:
                assert got[shares.index(0)] == 0, (shares, model.devices)
            else:  # each holds about its share
                assert abs(got[0] - 6 * shares[0] / sum(shares)) <= 1, (shares, model.devices)


def test_mtp_over_rpc_is_local_mtp(servers, model_dir):
    from eagle3.testing import MtpSpec, write_mtp_target

    path = write_mtp_target(model_dir / "rpc-mtp.gguf", MtpSpec(n_layer=3, nextn=2, n_embd=32, n_head=2, n_head_kv=1,
                                                                 weights="chain", noise=0.02, seed=2))

    def run(model):
        with eagle3.Context(model, n_ctx=512) as target, eagle3.Context(model, ctx_type="mtp") as mtp, \
                eagle3.MtpSession(target, mtp, n_draft_max=3) as session:
            return [list(session.generate(p, 32).tokens) for p in PROMPTS]

    with eagle3.Model(path) as local, eagle3.Model(path, rpc_servers=[s.endpoint for s in servers]) as remote_model:
        assert run(remote_model) == run(local)


def test_local_model_is_on_the_cpu(models):
    target, _ = models["chain"]
    (cpu,) = target.devices
    assert cpu.name == "CPU" and cpu.endpoint is None and cpu.output
    assert cpu.layers == tuple(range(target.n_layer)) and cpu.weight_bytes > 0


# -- refused before or at load ------------------------------------------------

@pytest.mark.parametrize("servers_arg, message", [
    (["localhost"], "not an RPC server's 'host:port'"),
    (["127.0.0.1:0"], "port must be a number from 1 to 65535"),
    (["127.0.0.1:65536"], "port must be"),
    ([":50052"], "not an RPC server's"),
    (["127.0.0.1:5005x"], "port must be"),
    (["127.0.0.1:50052", "127.0.0.1:50052"], "names a server twice"),
])
def test_malformed_endpoints_are_refused(tiny_pair, servers_arg, message):
    with pytest.raises(eagle3.InvalidArgumentError, match=message):
        eagle3.Model(tiny_pair[0], rpc_servers=servers_arg)


def test_bad_tensor_split_is_refused(servers, tiny_pair):
    endpoints = [s.endpoint for s in servers]
    for split, error in (([1], eagle3.InvalidArgumentError), ([1, -1], eagle3.InvalidArgumentError),
                         ([0, 0], eagle3.InvalidArgumentError), ([1, float("nan")], eagle3.InvalidArgumentError),
                         ("ab", eagle3.ArgumentTypeError), (3, eagle3.ArgumentTypeError)):
        with pytest.raises(error):
            eagle3.Model(tiny_pair[0], rpc_servers=endpoints, tensor_split=split)
    with pytest.raises(eagle3.InvalidArgumentError, match="tensor_split"):
        eagle3.Model(tiny_pair[0], tensor_split=[1.0])  # no remote device to share


def test_unreachable_server_is_a_load_error_naming_it(tiny_pair):
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(eagle3.ModelLoadError, match=f"RPC server {endpoint}: cannot connect"):
        eagle3.Model(tiny_pair[0], rpc_servers=[endpoint])
    # and the second of two
    with RpcServer() as alive:
        with pytest.raises(eagle3.ModelLoadError, match=endpoint):
            eagle3.Model(tiny_pair[0], rpc_servers=[alive.endpoint, endpoint])


def test_a_port_that_is_not_an_rpc_server(tiny_pair):
    import socket
    import threading

    with socket.socket() as listener:  # accepts, says something else, closes
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]

        def talk():
            for _ in range(8):
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                conn.close()

        threading.Thread(target=talk, daemon=True).start()
        with pytest.raises(eagle3.ModelLoadError, match=f"127.0.0.1:{port}: no answer to the handshake"):
            eagle3.Model(tiny_pair[0], rpc_servers=[f"127.0.0.1:{port}"])


@pytest.mark.parametrize("command, value, message", [
    (HELLO, (6, 0, 0), "protocol 6.0.0"),
    (HELLO, (7, 9, 0), "protocol 7.9.0"),
    (DEVICE_COUNT, (2**31,), "2147483648 devices"),
    (DEVICE_COUNT, (0,), "has no devices"),
    (GET_ALIGNMENT, (3,), "alignment of 3"),
    (GET_ALIGNMENT, (0,), "alignment of 0"),
    (GET_MAX_SIZE, (0,), "maximum buffer size of 0"),
    (ALLOC_BUFFER, (None, 16), "a buffer of 16 bytes"),
    (BUFFER_GET_BASE, (0,), "null base address"),
])
def test_absurd_answers_are_a_load_error_naming_the_server(servers, tiny_pair, command, value, message):
    with CorruptingRelay(servers[0].port, 0, "value", command, value) as relay:
        with pytest.raises(eagle3.ModelLoadError, match=f"RPC server {relay.endpoint}: .*{message}"):
            eagle3.Model(tiny_pair[0], rpc_servers=[relay.endpoint])
        assert relay.spoiled.is_set()


def test_a_server_usable_again_after_its_client_failed(servers, pair_paths, models):
    """A failed connection is closed: the server serves the next client, and a model
    loaded again (once the failed one is closed) works."""
    target_path, draft_path = pair_paths["chain"]
    with CorruptingRelay(servers[1].port, 40, "length") as relay:
        model = eagle3.Model(target_path, rpc_servers=[relay.endpoint])
        with pytest.raises(eagle3.RemoteError) as info:
            ctx = eagle3.Context(model, n_ctx=256)
            for _ in range(200):
                ctx.generate(PROMPTS[0], max_new_tokens=16)
        assert info.value.endpoint == relay.endpoint
        with pytest.raises(eagle3.RemoteError):  # the model is lost; it says so again, at once
            eagle3.Context(model, n_ctx=256).generate(PROMPTS[0], max_new_tokens=4)
        model.close()
    with eagle3.Model(target_path, rpc_servers=[servers[1].endpoint]) as model:
        ctx = eagle3.Context(model, n_ctx=256)
        local = eagle3.Context(models["chain"][0], n_ctx=256)
        assert list(ctx.generate(PROMPTS[1], 16).tokens) == list(local.generate(PROMPTS[1], 16).tokens)


# -- servers that die or answer garbage while a client generates ------------------

WAYS = ["generate", "stream", "batch", "plain", "manual", "remote-draft"]


def run_client(pair, servers_arg, way, kill=None, timeout=120):
    """rpc_client.py in a child process. ``kill`` is (phase, seconds, action): the
    action runs that long after the client begins the phase. Returns the client's
    JSON result; an abort, a crash or a hang fails the test."""
    target, draft = pair
    child = subprocess.Popen([sys.executable, str(CLIENT), str(target), str(draft), servers_arg, way],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "started", child.stderr.read()[-3000:]
        if kill is not None:
            phase, delay, action = kill
            for line in child.stdout:
                if line.strip() == f"phase {phase}":
                    break
            time.sleep(delay)
            action()
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"the client hung ({way}):\n{err[-3000:]}")
    assert child.returncode == 0, f"the client died with {child.returncode} ({way}):\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


def check_failed_closed(result, endpoint):
    assert result["error"] is not None, result
    assert {"RemoteError", "ModelLoadError", "ContextError"} & set(result["error"]), result
    assert endpoint in result["message"], result
    if "again" in result:  # (it failed after it began to generate)
        assert result["again"] == "RemoteError" and result["again_s"] < 5, result
    assert result["after"] == result["before"], f"threads or descriptors left behind: {result}"


# a kill lands this long at most after the client begins each phase
PHASES = {"load": 0.04, "context": 0.01, "session": 0.01, "generate": 0.8}


def test_servers_killed_at_random_points_fail_closed():
    """A server is killed at a random moment of a phase of a client's life (loading,
    creating contexts and the session, generating in each way); the client, in a
    child process, gets an eagle3 exception naming the server every time, closes
    everything and keeps no thread or descriptor of it."""
    rng = random.Random(20261201)
    pair = shipped.toy_pair()  # (18 MB: loading takes a while)
    outcomes = []
    for trial in range(20):
        way = WAYS[trial % len(WAYS)]
        phase = list(PHASES)[trial % len(PHASES)]
        two = trial % 3 == 2
        with RpcServer() as a, RpcServer() as b:
            victim = rng.choice([a, b]) if two else a
            servers_arg = f"{a.endpoint},{b.endpoint}" if two else a.endpoint
            kill = (phase, rng.uniform(0.0, PHASES[phase]), victim.kill)
            result = run_client(pair, servers_arg, way, kill)
            check_failed_closed(result, victim.endpoint)
            outcomes.append((phase, result["error"][0]))
    # the kills met every stage: some loads failed, some generations did
    assert {"ModelLoadError", "RemoteError"} <= {error for _, error in outcomes}, outcomes


def test_garbage_answers_at_random_points_fail_closed(servers, pair_paths):
    """A relay in front of a live server spoils one answer (a wrong length, or the
    connection closed) at a random point; the client fails closed every time."""
    rng = random.Random(7)
    pair = pair_paths["random-d2t"]
    for trial in range(10):
        way = WAYS[trial % len(WAYS)]
        mode = ("length", "close")[trial % 2]
        with CorruptingRelay(servers[trial % 2].port, rng.randrange(0, 300), mode) as relay:
            result = run_client(pair, relay.endpoint, way)
            assert relay.spoiled.is_set()
        check_failed_closed(result, relay.endpoint)


# -- the server ------------------------------------------------------------------

def eagle3_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "eagle3", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_the_server_cleanly(stop):
    server = RpcServer()
    server.process.send_signal(stop)
    assert server.process.wait(30) == 0
    assert wait_for(lambda: any("stopped" in line for line in server.output)), server.output


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_a_server_with_a_client(pair_paths, presses):
    """While it serves a generating client: the server exits 0, the client gets a
    RemoteError. Pressed twice, the second press may end the process once the server
    has stopped (as Ctrl-C does); it must not crash it."""
    server = RpcServer()

    def stop_it():
        assert server.interrupt(presses=presses) in ((0,) if presses == 1 else (0, -signal.SIGINT))

    result = run_client(pair_paths["chain"], server.endpoint, "generate", ("generate", 0.5, stop_it))
    check_failed_closed(result, server.endpoint)
    assert wait_for(lambda: any("stopped" in line for line in server.output)), server.output


def test_server_refuses_other_hosts_without_the_flag():
    result = eagle3_cli("rpc-server", "--host", "10.11.12.13")
    assert result.returncode == 1
    assert "--allow-remote" in result.stderr and "authentication" in result.stderr


def test_server_with_the_flag_warns_and_reports_an_address_it_cannot_bind():
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: nothing is exposed
    result = eagle3_cli("rpc-server", "--host", "192.0.2.1", "--port", str(free_port()), "--allow-remote")
    assert "Never expose the RPC server to an open network!" in result.stderr
    assert result.returncode == 1 and "could not start" in result.stderr


def test_server_on_a_port_in_use():
    with RpcServer() as server:
        result = eagle3_cli("rpc-server", "--port", str(server.port))
        assert result.returncode == 1 and "could not start" in result.stderr
        assert server.process.poll() is None  # the first one serves on


def test_server_arguments_are_checked():
    for args in (["--host", "localhost"], ["--host", "::1"], ["--port", "0"], ["--port", "70000"],
                 ["--threads", "0"]):
        result = eagle3_cli("rpc-server", *args)
        assert result.returncode in (1, 2) and result.stderr, args


def test_server_with_a_cache_dir_makes_it_and_serves(tmp_path, tiny_pair):
    # (weights are cached by hash from 10 MiB a tensor up: the test models have none that large)
    cache = tmp_path / "cache" / "rpc"
    with RpcServer(cache_dir=str(cache)) as server:
        assert cache.is_dir()
        with eagle3.Model(tiny_pair[0], rpc_servers=[server.endpoint]) as model:
            assert len(eagle3.Context(model, n_ctx=64).generate([1, 2, 3], 4).tokens) == 4


def test_cli_generate_over_rpc(servers):
    local = eagle3_cli("generate", "def f(x):", "-n", "24", "--json", "--n-draft-max", "4", timeout=120)
    over = eagle3_cli("generate", "def f(x):", "-n", "24", "--json", "--n-draft-max", "4",
                      "--rpc", f"{servers[0].endpoint},{servers[1].endpoint}", timeout=120)
    assert local.returncode == 0 and over.returncode == 0, over.stderr
    assert json.loads(over.stdout)["text"] == json.loads(local.stdout)["text"]
    dead = eagle3_cli("generate", "x", "-n", "4", "--rpc", f"127.0.0.1:{free_port()}")
    assert dead.returncode == 1 and "cannot connect" in dead.stderr
    bad = eagle3_cli("generate", "x", "--rpc", "nohost")
    assert bad.returncode == 2 and "host:port" in bad.stderr


CTRL_C_CLIENT = r"""
import json, sys
import eagle3

target_path, draft_path, endpoint = sys.argv[1:4]
with eagle3.Model(target_path, rpc_servers=[endpoint]) as tm, eagle3.Model(draft_path) as dm, \
        eagle3.Context(tm, n_ctx=4096) as target, eagle3.Context(dm, other=target) as draft, \
        eagle3.Eagle3Session(target, draft, n_draft_max=3) as session:
    reference = session.generate([1, 2, 3], 20).tokens.tolist()
    print("go", flush=True)
    interrupted = 0
    try:
        while True:
            session.generate([5, 6, 7], 3000)
    except KeyboardInterrupt:
        interrupted = 1
    again = session.generate([1, 2, 3], 20).tokens.tolist()
    print(json.dumps({"interrupted": interrupted, "usable": again == reference}), flush=True)
"""


def test_ctrl_c_in_a_client_waiting_for_its_server_leaves_the_model_working(pair_paths):
    """SIGINT lands while the client's threads wait on the socket: KeyboardInterrupt, and
    the connection is not taken for broken (the model generates the same tokens after)."""
    target, draft = pair_paths["chain"]
    with RpcServer() as server:
        for _ in range(3):
            child = subprocess.Popen([sys.executable, "-c", CTRL_C_CLIENT, str(target), str(draft), server.endpoint],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                assert child.stdout.readline().strip() == "go", child.stderr.read()[-3000:]
                time.sleep(0.4)
                child.send_signal(signal.SIGINT)
                out, err = child.communicate(timeout=60)
            finally:
                child.kill()
            assert child.returncode == 0, err[-3000:]
            assert json.loads(out.strip().splitlines()[-1]) == {"interrupted": 1, "usable": True}


FORK_CLIENT = r"""
import json, os, sys, time
import eagle3

target_path, draft_path, held, free = sys.argv[1:5]
model = eagle3.Model(target_path, rpc_servers=[held])
ctx = eagle3.Context(model, n_ctx=256)
reference = ctx.generate([1, 2, 3], 16).tokens.tolist()
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child: what it inherited is the parent's; its own loads work
    out = {}
    t0 = time.monotonic()
    try:
        ctx.generate([1, 2, 3], 16)
        out["inherited"] = None
    except eagle3.Eagle3Error as e:
        out["inherited"] = [type(e).__name__, str(e)]
    out["inherited_s"] = time.monotonic() - t0
    with eagle3.Model(target_path, rpc_servers=[free]) as own:
        out["own"] = eagle3.Context(own, n_ctx=256).generate([1, 2, 3], 16).tokens.tolist() == reference
    t0 = time.monotonic()
    try:
        eagle3.Model(target_path, rpc_servers=[held])
        out["busy"] = None
    except eagle3.Eagle3Error as e:
        out["busy"] = [type(e).__name__, str(e)]
    out["busy_s"] = time.monotonic() - t0
    model.close()
    os.write(write, json.dumps(out).encode())
    os._exit(0)
os.close(write)
_, status = os.waitpid(pid, 0)
child = json.loads(os.read(read, 1 << 16) or b"{}")
again = ctx.generate([1, 2, 3], 16).tokens.tolist() == reference  # the parent's connection goes on
print(json.dumps({"status": status, "child": child, "parent_again": again}), flush=True)
"""


def test_a_forked_child_does_not_use_its_parents_connection(pair_paths):
    """A child made by fork() inherits the parent's RPC connection but not its thread: using an
    inherited remote model is a RemoteError at once (not a hang, and the parent's connection goes
    on); a model the child loads itself works; a server the parent holds says it is busy."""
    target, draft = pair_paths["chain"]
    with RpcServer() as held, RpcServer() as free:
        result = subprocess.run([sys.executable, "-c", FORK_CLIENT, str(target), str(draft), held.endpoint,
                                 free.endpoint], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["status"] == 0 and out["parent_again"], out
    child = out["child"]
    assert child["inherited"][0] == "RemoteError" and "forked" in child["inherited"][1], child
    assert child["inherited_s"] < 5 and child["own"], child
    assert child["busy"][0] == "ModelLoadError" and "one client at a time" in child["busy"][1], child
    assert child["busy_s"] < 30, child


def test_a_client_naming_memory_outside_its_buffer_does_not_kill_the_server(tiny_pair):
    """A client (here a hand-made one) that sends a tensor lying outside the buffer it
    names loses its connection; the server goes on serving the next client."""
    import socket
    import struct

    def call(sock, cmd, payload, answer_size=None):
        sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
        if answer_size is None:
            return None
        size = struct.unpack("<Q", sock.recv(8, socket.MSG_WAITALL))[0]
        assert size == answer_size
        return sock.recv(size, socket.MSG_WAITALL)

    with RpcServer() as server:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            assert call(sock, HELLO, bytes(24), 28)[0] == 7
            remote, _ = struct.unpack("<QQ", call(sock, ALLOC_BUFFER, struct.pack("<IQ", 0, 4096), 16))
            (base,) = struct.unpack("<Q", call(sock, BUFFER_GET_BASE, struct.pack("<Q", remote), 8))
            # rpc_tensor: id, type (f32), buffer, ne[4], nb[4], op, op_params[16], flags, src[10], view_src,
            # view_offs, data (1 GiB past the buffer's start), name[64], use_count
            tensor = struct.pack("<QIQ4I4II16ii10QQQQ64si", 1, 0, remote, 4, 1, 1, 1, 4, 16, 16, 16, 0, *[0] * 16, 0,
                                 *[0] * 10, 0, 0, base + (1 << 30), b"outside", 0)
            call(sock, 6, tensor + struct.pack("<BQ", 0, 0) + bytes(16))  # SET_TENSOR
            assert sock.recv(1) == b""  # the server closed this connection
        assert server.process.poll() is None
        assert wait_for(lambda: any("out of its buffer's bounds" in line for line in server.output)), server.output
        with eagle3.Model(tiny_pair[0], rpc_servers=[server.endpoint]) as model:
            assert len(eagle3.Context(model, n_ctx=64).generate([1, 2, 3], 4).tokens) == 4
