"""What every e2e test shares beyond tests/conftest.py's fixtures."""

from __future__ import annotations

import gc
from typing import Iterator

import pytest


@pytest.fixture(autouse=True)
def collect_leaked_clients() -> Iterator[None]:
    """Collect a test's unreachable objects on the main thread as it ends. A tritonclient
    HTTP client a test leaves open is freed by the garbage collector, and its ``__del__``
    closes its gevent pool: run on a worker thread of a later test (wherever the collector
    happened to trigger), that close fails inside gevent and pytest reports it against the
    innocent test."""
    yield
    gc.collect()
