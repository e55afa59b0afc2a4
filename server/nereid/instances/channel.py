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
from typing import Any, Mapping

import numpy as np

__all__ = [
    "Arena", "ArraySpec", "Channel", "ChannelClosed", "Unsendable", "read_arrays", "socket_pair", "write_arrays",
]

#: one datagram: a longer message (a long traceback, large request parameters) goes as a
#: _LONG header and then chunks of this size (most messages are a few hundred bytes, and
#: a receive buffer costs its size on every receive).
_DATAGRAM = 1 << 16
_LONG = b"\x00"  # no pickle starts with it
_MIN_ARENA = 1 << 16


class ChannelClosed(EOFError):
    """The other end is gone (its process exited or was killed)."""


class Unsendable:
    """Sent in place of a value that cannot be pickled (a lambda, a generator): the name
    of its type, all the receiver can be told of it."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (Unsendable, (self.type_name,))


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of message sockets (the second one is for the child)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class Channel:
    """One end of a message socket: ``send(obj, fds)`` / ``recv(timeout)``. Not thread
    safe: one thread uses a channel at a time."""

    __slots__ = ("sock", "_timeout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._timeout: float | None = sock.gettimeout()

    def send(self, message: Any, fds: tuple[int, ...] = ()) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        sock = self.sock
        long = len(data) > _DATAGRAM
        first = _LONG + len(data).to_bytes(8, "little") if long else data
        try:
            if fds:
                sock.sendmsg([first], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                sock.send(first)
            if long:
                for start in range(0, len(data), _DATAGRAM):
                    sock.send(data[start : start + _DATAGRAM])
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosed(str(exc)) from None

    def recv(self, timeout: float | None = None) -> tuple[Any, list[int]]:
        """The next message and the descriptors that came with it. Raises TimeoutError
        after ``timeout`` seconds, ChannelClosed when the other end is gone."""
        sock = self.sock
        if timeout != self._timeout:
            sock.settimeout(timeout)
            self._timeout = timeout
        try:
            data, fds, _, _ = socket.recv_fds(sock, _DATAGRAM, 4)
            if data[:1] == _LONG:
                data = self._rest_of_long(data)
        except TimeoutError:
            raise
        except (ConnectionResetError, OSError) as exc:
            raise ChannelClosed(str(exc)) from None
        if not data:
            raise ChannelClosed("the other end closed the channel")
        return pickle.loads(data), fds

    def recv_ready(self) -> tuple[Any, list[int]]:
        """``recv`` for a socket the event loop found readable (never waits)."""
        data, fds, _, _ = socket.recv_fds(self.sock, _DATAGRAM, 4, socket.MSG_DONTWAIT)
        if data[:1] == _LONG:  # the rest follows at once: read it as recv does
            self.sock.settimeout(None)
            self._timeout = None
            data = self._rest_of_long(data)
        if not data:
            raise ChannelClosed("the other end closed the channel")
        return pickle.loads(data), fds

    def _rest_of_long(self, header: bytes) -> bytes:
        """The chunks of a long message whose _LONG ``header`` (with its size) came first."""
        size = int.from_bytes(header[1:9], "little")
        parts = []
        while size > 0:
            part = self.sock.recv(_DATAGRAM)
            if not part:
                break
            parts.append(part)
            size -= len(part)
        return b"".join(parts)

    def close(self) -> None:
        self.sock.close()


#: Where one array lies in an arena: (name, kind, dtype, shape, offset, nbytes); ``kind``
#: "n" (numeric, ``dtype`` a numpy dtype string, or the dtype itself for an extension
#: dtype such as bfloat16) or "b" (BYTES: uint64 lengths, then the elements). A plain
#: tuple: it is pickled twice per batch.
ArraySpec = tuple[str, str, Any, tuple[int, ...], int, int]


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


def _element(item: Any) -> bytes:
    """One element of a BYTES (object) array: bytes as they are, str as UTF-8 (as the
    server encodes a STRING output's str elements). Anything else raises TypeError (the
    sender may send such an array otherwise: ``bytes(3)`` would be three zero bytes)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    raise TypeError(f"an object array element that is not bytes or str: {type(item).__name__}")


def _dtype(dtype: np.dtype) -> Any:
    """What a spec says of a numeric array's dtype: its ``str`` (cheap to pickle), or the
    dtype itself where the ``str`` loses it (``<V2`` for ml_dtypes' bfloat16)."""
    return dtype if dtype.kind == "V" else dtype.str


def write_arrays(arena: Arena, arrays: Mapping[str, Any]) -> list[ArraySpec]:
    """Copy ``arrays`` (numpy arrays; object arrays of bytes or str for BYTES) into
    ``arena``, growing it first if needed. Returns where each one lies. Raises TypeError
    for an object array with an element that is neither bytes nor str."""
    plan: list[tuple[str, Any, str, int]] = []
    total = 0
    for name, value in arrays.items():
        arr = np.asarray(value)
        if arr.dtype == object:
            items = [_element(item) for item in arr.flat]
            size = 8 * len(items) + sum(len(item) for item in items)
            plan.append((name, (arr.shape, items), "b", size))
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
            np.ndarray(arr.shape, arr.dtype, buffer, offset)[...] = arr
            specs.append((name, "n", _dtype(arr.dtype), arr.shape, offset, size))
        else:
            shape, items = arr
            lengths = np.ndarray((len(items),), np.uint64, buffer, offset)
            lengths[:] = [len(item) for item in items]
            position = offset + 8 * len(items)
            buffer[position : position + size - 8 * len(items)] = b"".join(items)
            specs.append((name, "b", "object", shape, offset, size))
        offset += (size + 63) & ~63
    return specs


def read_arrays(arena: Arena, specs: list[ArraySpec], copy: bool) -> dict[str, np.ndarray]:
    """The arrays ``specs`` describe: views of the arena (``copy=False``: valid until the
    arena is written again) or copies; BYTES arrays are always new object arrays."""
    buffer = arena.buffer
    arrays: dict[str, np.ndarray] = {}
    for name, kind, dtype, shape, offset, _ in specs:
        if kind == "n":
            view = np.ndarray(shape, dtype, buffer, offset)
            arrays[name] = view.copy() if copy else view
            continue
        count = int(np.prod(shape, dtype=np.int64))
        lengths = np.ndarray((count,), np.uint64, buffer, offset).tolist()
        out = np.empty(count, dtype=object)
        position = offset + 8 * count
        for index, length in enumerate(lengths):
            out[index] = bytes(buffer[position : position + length])
            position += length
        arrays[name] = out.reshape(shape)
    return arrays
