"""Remote devices through llama.cpp's RPC backend: endpoints, and the server.

A machine runs ``eagle3 rpc-server`` (:func:`serve`); a :class:`~eagle3.Model`
given ``rpc_servers=["host:port", ...]`` puts its layers on those machines. The
protocol has no authentication and no encryption: serve on loopback, or on a
network where every host is trusted.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
import threading
from typing import TextIO

from eagle3 import _core
from eagle3.errors import ArgumentTypeError, InvalidArgumentError

DEFAULT_PORT = 50052

# llama.cpp's rpc-server says this when it binds to anything but 127.0.0.1.
NO_AUTHENTICATION_WARNING = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
WARNING: Host ('{host}') is != '127.0.0.1'
         Never expose the RPC server to an open network!
         This is an experimental feature and is not secure!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""


def available() -> bool:
    """Whether this build has llama.cpp's RPC backend (the meson option ``rpc``)."""
    return _core.RPC_AVAILABLE


def _port(text: str, endpoint: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InvalidArgumentError(f"{endpoint!r}: the port must be a number from 1 to 65535")
    return int(text)


def endpoint(value: str) -> str:
    """``"host:port"`` checked (a host name or IPv4 address, a port 1-65535)."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"an RPC server is a 'host:port' string, got {type(value).__name__}")
    host, sep, port = value.rpartition(":")
    if not sep or not host or any(c.isspace() for c in host):
        raise InvalidArgumentError(f"{value!r} is not an RPC server's 'host:port'")
    return f"{host}:{_port(port, value)}"


def endpoints(values) -> tuple[str, ...]:
    """A model's ``rpc_servers``: a sequence of distinct ``"host:port"`` (one string: one server)."""
    if isinstance(values, str):
        values = [values]
    try:
        checked = tuple(endpoint(v) for v in values)
    except TypeError:
        raise ArgumentTypeError("rpc_servers must be a sequence of 'host:port' strings") from None
    if len(set(checked)) != len(checked):
        raise InvalidArgumentError(f"rpc_servers names a server twice: {list(checked)}")
    if checked and not available():
        raise InvalidArgumentError("this eagle3 was built without llama.cpp's RPC backend (meson option rpc)")
    return checked


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.IPv4Address(host).is_loopback
    except ValueError:
        return False


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _start_undisturbed(thread: threading.Thread) -> None:
    """thread.start() with Ctrl-C and SIGTERM held back until it has returned, so
    that they arrive where the caller handles them, never halfway through it."""
    if not hasattr(signal, "pthread_sigmask"):
        thread.start()
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _stop(ended: threading.Event) -> None:
    """Stops the server and waits until it has returned (the process must not exit
    while it computes). The stop is repeated: one that comes before the server has
    begun listening is undone when it begins. A second Ctrl-C changes nothing."""
    while True:
        try:
            _core.rpc_stop()
            if ended.wait(0.1):
                return
        except KeyboardInterrupt:
            pass


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, threads: int | None = None,
          cache_dir: str | os.PathLike | None = None, allow_remote: bool = False,
          log: TextIO | None = None) -> None:
    """Run llama.cpp's RPC server for this machine's CPU at ``host:port`` until Ctrl-C
    (KeyboardInterrupt) or SIGTERM, which stop it: clients see their connection close.

    ``host`` is an IPv4 address of this machine. Anything but loopback needs
    ``allow_remote=True`` and prints llama.cpp's warning: whoever reaches the port
    can run graphs and read memory the server allocated. ``cache_dir`` keeps weights
    the clients send (by hash) so that loading the same model again sends less.
    """
    log = log or sys.stderr
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise InvalidArgumentError(f"--host must be an IPv4 address of this machine, got {host!r}") from None
    address = endpoint(f"{host}:{port}")
    if not is_loopback(host):
        if not allow_remote:
            raise InvalidArgumentError(
                f"serving on {host} lets anyone who reaches the port use this machine (the protocol has no "
                f"authentication); pass --allow-remote (allow_remote=True) to do it anyway")
        print(NO_AUTHENTICATION_WARNING.format(host=host), file=log, flush=True)
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cache_dir is not None:
        os.makedirs(cache_dir, exist_ok=True)

    failure: list[BaseException] = []
    # (set when rpc_serve has returned; Thread.join and is_alive are no witness
    # of that: a Ctrl-C that interrupts join marks the thread ended while it runs)
    ended = threading.Event()

    def run() -> None:
        try:
            _core.rpc_serve(address, None if cache_dir is None else os.fspath(cache_dir), threads)
        except BaseException as e:  # noqa: BLE001 (handed to the waiting thread)
            failure.append(e)
        finally:
            ended.set()

    # The server blocks in C; it runs on a thread of its own so that this one
    # stays in Python, where Ctrl-C arrives, and stops it.
    server = threading.Thread(target=run, name="eagle3-rpc-server", daemon=True)
    on_main = threading.current_thread() is threading.main_thread()
    if on_main:  # a service manager's stop is Ctrl-C's
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        # (a Ctrl-C held back during start arrives as start returns: here, inside the try)
        _start_undisturbed(server)
        while not ended.wait(0.25):
            pass
    except KeyboardInterrupt:
        _stop(ended)
        print("eagle3 rpc-server: stopped", file=log, flush=True)
        return
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, previous)
    if failure:
        raise failure[0]
