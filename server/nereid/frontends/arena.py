"""Arena: one front-end worker's shared memory with the main process, reused for every
request, and the ring that hands out its blocks.

Owns where bytes go in the shared region; knows nothing about HTTP or tensors. The
region is a memfd (no name in /dev/shm to leak if a process dies), mapped by both
processes; its first half carries request bodies (the worker allocates), its second half
answers (the main process allocates). A block is freed by whoever allocated it, when the
other side says it is done with it (messages.py).
"""

from __future__ import annotations

import collections
import mmap
import os
import tempfile

__all__ = ["Arena", "Ring", "ARENA_BYTES"]

#: Each worker's region: half for request bodies, half for answers. Pages are touched
#: only as the ring reaches them; a body or answer larger than the free room travels
#: inline in its control message instead (correct, slower).
ARENA_BYTES = 32 * 1024 * 1024

#: Blocks start on cache-line boundaries (numpy views of inputs stay aligned).
_ALIGN = 64


class Ring:
    """Blocks of ``capacity`` bytes handed out in order and taken back in any order:
    space is reused once every block allocated before it is free (a block held long
    holds back reuse, never correctness). Pure bookkeeping, no memory of its own.

    A worker allocates and frees a block per request: the live blocks are their offsets
    in order (a deque) and the end of each not yet freed (a dict), nothing per block
    beyond that."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        #: offsets of the blocks not yet reclaimed, oldest first
        self._order: collections.deque[int] = collections.deque()
        #: the end of each block not yet freed, by its offset
        self._ends: dict[int, int] = {}
        #: the newest block's offset and end (meaningful while ``_order`` is not empty)
        self._newest = 0
        self._tail = 0

    def allocate(self, size: int) -> int | None:
        """The offset of a block of at least ``size`` bytes, or None when there is no
        room now."""
        size = (size + _ALIGN - 1) & ~(_ALIGN - 1) or _ALIGN
        order = self._order
        if not order:
            if size > self.capacity:
                return None
            offset = 0
        else:
            head = order[0]
            tail = self._tail
            if self._newest >= head:  # not wrapped: room after the newest block, or from 0 to the oldest
                if self.capacity - tail >= size:
                    offset = tail
                elif head >= size:
                    offset = 0
                else:
                    return None
            elif head - tail >= size:  # wrapped: room between the newest block and the oldest
                offset = tail
            else:
                return None
        order.append(offset)
        self._newest = offset
        self._tail = self._ends[offset] = offset + size
        return offset

    def free(self, offset: int) -> None:
        """Give back the block at ``offset``. Raises ValueError for an offset that is no
        live block."""
        if self._ends.pop(offset, None) is None:
            raise ValueError(f"arena ring: no block allocated at offset {offset}")
        order = self._order
        ends = self._ends
        while order and order[0] not in ends:
            order.popleft()

    def reset(self) -> None:
        """Forget every block (the other side is gone)."""
        self._order.clear()
        self._ends.clear()

    @property
    def blocks(self) -> int:
        """Blocks allocated and not freed."""
        return len(self._ends)


class Arena:
    """The shared region of one worker: ``requests`` and ``answers`` are writable views
    of its two halves. ``Arena.create()`` in the main process, ``Arena.attach(fd, size)``
    in the worker it is handed to."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._map = mmap.mmap(fd, size)
        view = memoryview(self._map)
        half = size // 2
        self.requests = view[:half]
        self.answers = view[half:]

    @classmethod
    def create(cls, size: int = ARENA_BYTES) -> Arena:
        """A new region of ``size`` bytes (a memfd where the system has them)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("nereid-frontend-arena", 0)
        else:  # pragma: no cover - not Linux
            fd, path = tempfile.mkstemp(prefix="nereid-frontend-arena-")
            os.unlink(path)
        os.ftruncate(fd, size)
        return cls(fd, size)

    @classmethod
    def attach(cls, fd: int, size: int) -> Arena:
        return cls(fd, size)

    def close(self) -> None:
        """Close the descriptor and unmap; while arrays still view the region (a batch
        of a worker that died may still run), it stays mapped until they go."""
        try:
            self.requests.release()
            self.answers.release()
            self._map.close()
        except BufferError:  # a view still refers to it: unmapped when that goes
            pass
        os.close(self.fd)
