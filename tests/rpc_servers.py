"""RPC servers for the tests: ``eagle3 rpc-server`` in child processes on
127.0.0.1 (free ports), and a relay that corrupts one answer of a real server.
Nothing here reaches any other address."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import threading
import time

LOOPBACK = "127.0.0.1"


def _die_with_parent() -> None:
    # (a test run that is killed must not leave servers behind)
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class RpcServer:
    """``eagle3 rpc-server`` for this CPU, in a child process, until stopped or killed."""

    def __init__(self, threads: int = 1, cache_dir: str | None = None):
        for _ in range(5):  # (another process may take the free port first)
            self.port = free_port()
            cmd = [sys.executable, "-m", "eagle3", "rpc-server", "--port", str(self.port), "--threads", str(threads)]
            if cache_dir:
                cmd += ["--cache", cache_dir]
            self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                            preexec_fn=_die_with_parent)
            self.output = []
            for line in self.process.stdout:
                self.output.append(line)
                if line.startswith("Listening on"):
                    # keep draining, so that the server never blocks on a full pipe
                    threading.Thread(target=self._drain, daemon=True).start()
                    return
            self.process.wait()
        raise RuntimeError("eagle3 rpc-server did not start:\n" + "".join(self.output))

    def _drain(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def interrupt(self, timeout: float = 30, presses: int = 1) -> int:
        """Ctrl-C, pressed ``presses`` times: returns the exit code."""
        for _ in range(presses):
            self.process.send_signal(signal.SIGINT)
            time.sleep(0.01)
        return self.process.wait(timeout)

    def __enter__(self) -> RpcServer:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


# ggml-rpc's commands (protocol 7) whose request gets an answer; the others get none.
ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE = 0, 1, 2, 3
SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR, GET_DEVICE_MEMORY = 7, 8, 9, 11
GET_ALLOC_SIZE, HELLO, DEVICE_COUNT = 13, 14, 15
ANSWERED = {ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR,
            GET_DEVICE_MEMORY, GET_ALLOC_SIZE, HELLO, DEVICE_COUNT}


class CorruptingRelay:
    """Relays 127.0.0.1:port to a real server and spoils one of its answers: the
    ``nth`` (0 is the handshake's) answer to ``command`` (None: to any command).

    ``mode``: "length" sends it with a wrong length; "close" closes the
    connection instead; "value" sends the right length with the answer's
    first fields replaced by ``value`` (uint64s, None keeps one; for the
    handshake its (major, minor, patch) bytes). Nothing is relayed after a
    spoiled answer."""

    def __init__(self, upstream_port: int, nth: int, mode: str = "length", command: int | None = None,
                 value: tuple[int, ...] = ()):
        self.upstream_port = upstream_port
        self.nth, self.mode, self.command, self.value = nth, mode, command, value
        self.listener = socket.socket()
        self.listener.bind((LOOPBACK, 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        self.spoiled = threading.Event()
        self.answers = 0  # relayed so far (to the spoiled command's kind)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def close(self) -> None:
        self.listener.close()

    def __enter__(self) -> CorruptingRelay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((LOOPBACK, self.upstream_port))
            pending: list[int] = []  # the commands waiting for an answer, in order
            threading.Thread(target=self._requests, args=(client, upstream, pending), daemon=True).start()
            threading.Thread(target=self._answers, args=(client, upstream, pending), daemon=True).start()

    @staticmethod
    def _read(sock: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    @staticmethod
    def _end(reading: socket.socket, other: socket.socket) -> None:
        # Each thread closes only the socket it reads; the other one is shut down, which
        # wakes its reader. (Closing a socket another thread reads lets the kernel give
        # its number to the next socket opened, which that thread would then read.)
        try:
            other.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        reading.close()

    def _requests(self, client, upstream, pending) -> None:
        try:
            while True:
                cmd = self._read(client, 1)
                size = self._read(client, 8)
                payload = self._read(client, struct.unpack("<Q", size)[0])
                if cmd[0] in ANSWERED:
                    pending.append(cmd[0])  # (before the request leaves: its answer comes after)
                upstream.sendall(cmd + size + payload)
        except (EOFError, OSError):
            pass
        self._end(client, upstream)

    def _answers(self, client, upstream, pending) -> None:
        relaying = True
        try:
            while True:
                size = self._read(upstream, 8)
                payload = self._read(upstream, struct.unpack("<Q", size)[0])
                cmd = pending.pop(0)
                if relaying and (self.command is None or cmd == self.command):
                    if self.answers == self.nth and not self.spoiled.is_set():
                        self.spoiled.set()
                        self._spoil(client, size, payload, cmd)
                        relaying = False  # (the connection stays open: the client has to close it)
                        continue
                    self.answers += 1
                if relaying:
                    client.sendall(size + payload)
        except (EOFError, OSError):
            pass
        self._end(upstream, client)

    def _spoil(self, client, size: bytes, payload: bytes, cmd: int) -> None:
        if self.mode == "close":
            client.shutdown(socket.SHUT_RDWR)
        elif self.mode == "length":
            client.sendall(struct.pack("<Q", len(payload) + 8) + payload)
        else:  # the answer's first fields replaced (None: kept)
            fmt = "<3B" if cmd == HELLO else f"<{len(self.value)}Q"
            width = struct.calcsize(fmt)
            fields = struct.unpack(fmt, (payload + bytes(width))[:width])
            head = struct.pack(fmt, *[old if new is None else new for old, new in zip(fields, self.value)])
            head = head[:len(payload)]  # (a uint32 answer takes the low half)
            client.sendall(size + head + payload[len(head):])


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
