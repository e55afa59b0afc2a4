"""A context variable set for the code run inside one block: how model code finds the
server it belongs to (its BLS target: bls.py; its metrics sink: metrics.py) when two
servers share a process, with no module attribute. Code the block calls, awaits or runs
with ``asyncio.to_thread`` sees the value (contexts are copied there).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, TypeVar

__all__ = ["set_within"]

_T = TypeVar("_T")


@contextlib.contextmanager
def set_within(variable: contextvars.ContextVar[_T], value: _T) -> Iterator[None]:
    """``variable`` holds ``value`` inside the block, and what it held before after it."""
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)
