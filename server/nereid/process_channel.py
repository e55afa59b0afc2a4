"""The wire between the server and a process instance: messages over a Unix socket,
tensors through shared memory.

A ``Channel`` is one end of a ``SOCK_SEQPACKET`` socket pair: each ``send`` is one message
(a small pickled header: names, dtypes, shapes, request parameters, errors), delivered
whole, optionally with file descriptors. Tensors never travel in a message: the sender
writes them into its ``Arena`` (a ``memfd`` mapped by both processes, grown by replacing
it with a larger one whose descriptor rides along with the next message) and the message
says where each array lies. Numeric arrays are read back as numpy views of the mapping;
BYTES (object) arrays as length-prefixed elements.

Knows nothing about models, batches or HTTP.
"""

from __future__ import annotations

import array
import mmap
import os
import pickle
import socket
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

__all__ = ["Arena", "ArraySpec", "Channel", "ChannelClosed", "read_arrays", "socket_pair", "write_arrays"]

#: the largest control message (headers only; tensors go through the arena).
_MAX_MESSAGE = 1 << 20
_MIN_ARENA = 1 << 16


class ChannelClosed(EOFError):
    """The other end is gone (its process exited or was killed)."""


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of message sockets (the second one is for the child)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class Channel:
    """One end of a message socket: ``send(obj, fds)`` / ``recv(timeout)``. Not thread
    safe: one thread uses a channel at a time."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, message: Any, fds: tuple[int, ...] = ()) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            if fds:
                self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosed(str(exc)) from None

    def recv(self, timeout: float | None = None) -> tuple[Any, list[int]]:
        """The next message and the descriptors that came with it. Raises TimeoutError
        after ``timeout`` seconds, ChannelClosed when the other end is gone."""
        self.sock.settimeout(timeout)
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, _MAX_MESSAGE, 4)
        except TimeoutError:
            raise
        except (ConnectionResetError, OSError) as exc:
            raise ChannelClosed(str(exc)) from None
        if not data:
            raise ChannelClosed("the other end closed the channel")
        return pickle.loads(data), fds

    def close(self) -> None:
        self.sock.close()


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """Where one array lies in an arena: ``kind`` "n" (numeric, ``dtype`` a numpy dtype
    string) or "b" (BYTES: ``count`` uint64 lengths, then the elements)."""

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class Arena:
    """Shared memory one process writes and the other reads: a ``memfd`` mapping that
    grows (a new, larger one) when an array set does not fit. ``fd_to_send`` is the
    descriptor the peer has not seen yet (sent once with the next message)."""

    __slots__ = ("fd", "size", "buffer", "fd_to_send")

    def __init__(self, size: int = _MIN_ARENA, fd: int | None = None) -> None:
        if fd is None:
            fd = os.memfd_create("nereid-arena", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
            self.fd_to_send: int | None = fd
        else:
            size = os.fstat(fd).st_size
            self.fd_to_send = None
        self.fd = fd
        self.size = size
        self.buffer = mmap.mmap(fd, size)

    def ensure(self, needed: int) -> None:
        """Room for ``needed`` bytes (a larger mapping replaces this one if needed)."""
        if needed <= self.size:
            return
        self.close()
        size = max(needed, self.size * 2)
        fd = os.memfd_create("nereid-arena", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        self.fd, self.size, self.buffer, self.fd_to_send = fd, size, mmap.mmap(fd, size), fd

    def take_fd_to_send(self) -> tuple[int, ...]:
        fd, self.fd_to_send = self.fd_to_send, None
        return () if fd is None else (fd,)

    def adopt(self, fds: list[int]) -> None:
        """The peer replaced its arena: map the new one (this side only reads it)."""
        if not fds:
            return
        self.close()
        for extra in fds[1:]:
            os.close(extra)
        fd = fds[0]
        self.fd, self.size = fd, os.fstat(fd).st_size
        self.buffer = mmap.mmap(fd, self.size)

    def close(self) -> None:
        try:
            self.buffer.close()
        except BufferError:  # a view still points into it: the mapping goes with the view
            pass
        os.close(self.fd)


def _bytes_size(array_: np.ndarray) -> int:
    return 8 * array_.size + sum(len(item) for item in array_.flat)


def write_arrays(arena: Arena, arrays: Mapping[str, Any]) -> list[ArraySpec]:
    """Copy ``arrays`` (numpy arrays; object arrays of bytes for BYTES) into ``arena``,
    growing it first if needed. Returns where each one lies."""
    plan: list[tuple[str, np.ndarray, str, int]] = []
    total = 0
    for name, value in arrays.items():
        arr = np.asarray(value)
        if arr.dtype == object:
            size = _bytes_size(arr)
            plan.append((name, arr, "b", size))
        else:
            size = arr.nbytes
            plan.append((name, arr, "n", size))
        total += (size + 63) & ~63  # 64-byte aligned starts
    arena.ensure(total)
    buffer = arena.buffer
    specs: list[ArraySpec] = []
    offset = 0
    for name, arr, kind, size in plan:
        if kind == "n":
            target = np.ndarray(arr.shape, arr.dtype, buffer, offset)
            target[...] = arr
            specs.append(ArraySpec(name, "n", arr.dtype.str, arr.shape, offset, size))
        else:
            items = [bytes(item) for item in arr.flat]
            lengths = np.ndarray((len(items),), np.uint64, buffer, offset)
            lengths[:] = [len(item) for item in items]
            position = offset + 8 * len(items)
            buffer[position : position + size - 8 * len(items)] = b"".join(items)
            specs.append(ArraySpec(name, "b", "object", arr.shape, offset, size))
        offset += (size + 63) & ~63
    return specs


def read_arrays(arena: Arena, specs: list[ArraySpec], copy: bool) -> dict[str, np.ndarray]:
    """The arrays ``specs`` describe: views of the arena (``copy=False``: valid until the
    arena is written again) or copies; BYTES arrays are always new object arrays."""
    buffer = arena.buffer
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.kind == "n":
            view = np.ndarray(spec.shape, np.dtype(spec.dtype), buffer, spec.offset)
            arrays[spec.name] = view.copy() if copy else view
            continue
        count = int(np.prod(spec.shape, dtype=np.int64))
        lengths = np.ndarray((count,), np.uint64, buffer, spec.offset).tolist()
        out = np.empty(count, dtype=object)
        position = spec.offset + 8 * count
        for index, length in enumerate(lengths):
            out[index] = bytes(buffer[position : position + length])
            position += length
        arrays[spec.name] = out.reshape(spec.shape)
    return arrays
