"""Waiting for another process, the one way the tests do it.

A test never sleeps to let something happen: it waits here until it *has* happened (a
server answers ready, a line reaches its log, a model writes a file, the statistics count a
request), within a bound generous enough for a loaded machine, and fails naming what never
came. In-process code drives time with an injected clock instead (tests/unit/manual_clock.py).
"""

from __future__ import annotations

import asyncio
import inspect
import time
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
