"""The control messages between a front-end worker and the main process, and their
framing on the socket pair that joins them.

A message is a small tuple ``(kind, request id, ...)``, pickled with a 4-byte length in
front; tensors never travel here unless the arena is full (they live in arena.py's
shared region, and a message carries the offset and length). Frames are written in
batches: ``Outbox`` gathers the frames of one loop turn into one write.
"""

from __future__ import annotations

import enum
import pickle
import struct
from typing import Any, Callable

__all__ = ["Kind", "FrameReader", "Outbox", "frame"]

_LENGTH = struct.Struct("<I")


class Kind(enum.IntEnum):
    """What a message is. Worker -> main: INFER, DECODED, ASGI, WITHDRAW, FREED. Main ->
    worker: OPTIONS (first, once), ANSWER, RESULT, RETRY, START, BODY, CLOSE, DONE, STOP,
    MODEL, FORGET."""

    #: (INFER, id, name, version, (header length, content encoding, accept encoding),
    #:  received_ns, offset, length, inline body or None)
    INFER = 1
    #: (ASGI, id, scope without its state, body): any other request, for the main app
    ASGI = 2
    #: (WITHDRAW, id): the client went away
    WITHDRAW = 3
    #: (FREED, offsets): answer blocks the worker has copied out
    FREED = 4
    #: (DECODED, id, token, template id, template or None, offset, request id, received_ns):
    #: a request decoded in the worker (decoding.py), its tensors at ``offset``
    DECODED = 5
    #: (OPTIONS, ServerOptions, worker index)
    OPTIONS = 10
    #: (ANSWER, id, status, headers, offset, length, inline body or None, repeat):
    #: a whole response (``repeat``: Responder.reply_repeat's headers, content-length in)
    ANSWER = 11
    #: (START, id, status, headers): a response whose body comes in BODY parts
    START = 12
    #: (BODY, id, data, more)
    BODY = 13
    #: (CLOSE, id): the response cannot be finished; close its connection
    CLOSE = 14
    #: (DONE, id): the main process let go of a withdrawn request (its block may be reused)
    DONE = 15
    #: (STOP,): stop taking connections, finish what is in flight, exit
    STOP = 16
    #: (MODEL, name, token, version, config, labels): the worker may decode for this version
    MODEL = 17
    #: (FORGET, name, token): it may not any more (unloaded, or another version serves)
    FORGET = 18
    #: (RESULT, id, version, offset, layout, inline outputs or None): a decoded request's outputs
    RESULT = 19
    #: (RETRY, id): send that decoded request again as a raw body (its model changed)
    RETRY = 20


def frame(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Bytes from the socket in, whole messages out (a frame may arrive in pieces)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        buffer = self._buffer
        buffer += data
        messages = []
        start = 0
        end = len(buffer)
        while end - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if end - start - 4 < length:
                break
            with memoryview(buffer) as view:
                messages.append(pickle.loads(view[start + 4:start + 4 + length]))
            start += 4 + length
        if start:
            del buffer[:start]
        return messages


class Outbox:
    """Frames for one transport, written together once per loop turn (``schedule``: the
    loop's ``call_soon``), so a busy worker sends many messages per system call."""

    def __init__(self, write: Callable[[bytes], None], schedule: Callable[[Callable[[], None]], Any]) -> None:
        self._write = write
        self._schedule = schedule
        self._frames: list[bytes] = []

    def send(self, message: tuple[Any, ...]) -> None:
        frames = self._frames
        if not frames:
            self._schedule(self.flush)
        frames.append(frame(message))

    def flush(self) -> None:
        frames, self._frames = self._frames, []
        if frames:
            self._write(b"".join(frames))
