"""Waiting for another process, the one way the tests do it.

A test never sleeps to let something happen: it waits here until it *has* happened (a
server answers ready, a line reaches its log, a model writes a file, the statistics count a
request), within a bound generous enough for a loaded machine, and fails naming what never
came. In-process code drives time with an injected clock instead (tests/unit/manual_clock.py).
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import sys
import time
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

#: How long a server (or a model's process instances) may take to start and answer ready.
#: Generous on purpose: on a busy 2-core machine a server starting 11 process instances
#: took over 60 s. Every start-up wait in tests/ uses this one figure.
START_TIMEOUT_S = 180.0

#: The bound on anything else a test waits for: a log line, a state change, a file.
WAIT_TIMEOUT_S = 60.0

#: How often a condition is polled (a cheap read: a file, a log, a small HTTP GET).
POLL_S = 0.02


def _message(what: str | Callable[[], str], timeout: float) -> str:
    return f"not within {timeout:g} s: {what() if callable(what) else what}"


def wait_until(condition: Callable[[], T], what: str | Callable[[], str], *,
               timeout: float = WAIT_TIMEOUT_S, every: float = POLL_S) -> T:
    """Poll ``condition`` every ``every`` seconds until it returns something true, and
    return that; fail with ``what`` (a text, or a callable that builds it then, e.g. with a
    server's log) after ``timeout`` seconds. The bound never asserts speed: it only turns a
    hang into a failure that says what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(_message(what, timeout))
        time.sleep(every)


async def wait_until_async(condition: Callable[[], T | Awaitable[T]], what: str | Callable[[], str], *,
                           timeout: float = WAIT_TIMEOUT_S, every: float = POLL_S) -> T:
    """``wait_until`` for a test's own event loop: the loop keeps running the test's other
    tasks between polls, and ``condition`` may be a coroutine function (an aio client's call)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(_message(what, timeout))
        await asyncio.sleep(every)


def wait_until_read(sock: socket.socket, *, timeout: float = WAIT_TIMEOUT_S) -> None:
    """Wait until the server at the other end of ``sock`` (a TCP connection to a process on
    this machine) has read all that was sent on it: the bytes are acknowledged, and the
    server's socket holds none unread (Linux's /proc/net/tcp counts both), so what is sent
    next reaches the server in a read of its own. Without /proc/net/tcp (or for an IPv6
    connection) it returns at once: the bytes may then arrive in one read."""
    table = Path("/proc/net/tcp")
    if sock.family != socket.AF_INET or not table.exists():
        return
    ours, theirs = _proc_address(sock.getsockname()), _proc_address(sock.getpeername())

    def read_by_server() -> bool:
        queues = {}
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            queues[fields[1], fields[2]] = fields[4]  # tx_queue:rx_queue, hex, by (local, remote)
        unacknowledged = queues.get((ours, theirs), "0:0").split(":")[0]
        unread = queues.get((theirs, ours), "0:0").split(":")[1]
        return int(unacknowledged, 16) == 0 and int(unread, 16) == 0

    wait_until(read_by_server, "the server read what was sent", timeout=timeout)


def _proc_address(address: tuple[str, int]) -> str:
    """An IPv4 address as /proc/net/tcp writes it (the address as a host-order word, then
    the port, in hex)."""
    host, port = address
    return f"{int.from_bytes(socket.inet_aton(host), sys.byteorder):08X}:{port:04X}"


#: Source of ``wait_for_file(path)``, for the models a test holds at a gate: the model
#: calls it (in the server's process, so it cannot share an event with the test) and the
#: test releases it by creating ``path``. Append it to a model's source.
MODEL_GATE = '''

def wait_for_file(path, timeout=60.0):
    """Hold until the test creates ``path`` (tests/waiting.py: MODEL_GATE)."""
    import os
    import time

    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
'''

#: An identity model (INPUT0 -> OUTPUT0) that holds each request until the test creates
#: the file "open" beside its model.py.
GATED_IDENTITY = """
class Model:
    def __init__(self, context):
        self.folder = context.model_dir

    def infer(self, inputs):
        wait_for_file(self.folder / "open")
        return {"OUTPUT0": inputs["INPUT0"]}
""" + MODEL_GATE
