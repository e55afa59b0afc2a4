"""The control messages between a front-end worker and the main process, and their
framing on the socket pair that joins them.

A message is a small tuple ``(kind, request id, ...)``; tensors never travel here unless
the arena is full (they live in arena.py's shared region, and a message carries the
offset and length). ``Outbox`` gathers the messages of one loop turn into one frame (the
list of them pickled once, a 4-byte length in front) and one write: a busy link pays one
pickle, one system call and one wake-up per turn, not per request.
"""

from __future__ import annotations

import enum
import pickle
import struct
from typing import Any, Callable

__all__ = ["Kind", "FrameReader", "Outbox", "frame"]

_LENGTH = struct.Struct("<I")


class Kind(enum.IntEnum):
    """What a message is. Worker -> main: ARMED, INFER, DECODED, ASGI, WITHDRAW, FREED, CREDIT. Main ->
    worker: OPTIONS (first, once), ANSWER, RESULTS, RESULT, RETRY, START, BODY, CLOSE, DONE, STOP,
    MODEL, FORGET, DIRECTORY; and the GRPC_* pairs of relayed gRPC calls. A DECODED message
    of a gRPC ModelInfer carries one more field, True."""

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
    #: (CREDIT, ((id, size), ...)): bytes of streamed responses (BODY, GRPC_SEND) the
    #: worker handed to their clients' connections (send_windows.py)
    CREDIT = 6
    #: (ARMED,): the worker's signal handlers are in place: from now on SIGHUP makes it read
    #: its certificate again (before, the signal's default would end it)
    ARMED = 7
    #: (OPTIONS, ServerOptions, worker index, TlsFiles or None)
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
    #: (RESULTS, version, offset, layout, ((id, rows), ...)): the outputs of several
    #: decoded requests in one arena block, each output's rows of every request one after
    #: the other (the first request's rows first); the worker frees the block once it
    #: has answered them all
    RESULTS = 21
    #: (DIRECTORY, generation, ready, ready strict, {name: ModelFacts or None}, whole):
    #: what the model manager shows, for health, metadata and config answered in the
    #: worker (directory_sync.py): the models that changed (None: forgotten), or all
    #: of them (``whole``)
    DIRECTORY = 22
    # -- gRPC (grpc_front.py in the worker, grpc_link.py in the main process) -------------
    #: (GRPC_OPEN, id, headers): a call the worker relays whole opened (its :path, metadata)
    GRPC_OPEN = 30
    #: (GRPC_MESSAGE, id, data): one of its request messages (inflated)
    GRPC_MESSAGE = 31
    #: (GRPC_END, id, model name or None): the client ended its side (a ModelInfer names its
    #: model, so the main process may announce it)
    GRPC_END = 32
    #: (GRPC_RESET, id): the call was reset (client, transport, grpc-timeout)
    GRPC_RESET = 33
    #: (GRPC_RESPOND, id, data): its one response message, status OK
    GRPC_RESPOND = 40
    #: (GRPC_SEND, id, data): one response message of a streaming call
    GRPC_SEND = 41
    #: (GRPC_FINISH, id, status, message): the call's end (a relayed call, or a decoded
    #: ModelInfer's error)
    GRPC_FINISH = 42
    #: (GRPC_TAKEN, id, size): the main process took a streamed request message
    GRPC_TAKEN = 43


def frame(*messages: tuple[Any, ...]) -> bytes:
    """One frame carrying ``messages``, in order."""
    payload = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Bytes from the socket in, whole messages out (a frame may arrive in pieces)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        """The messages of every whole frame received so far, in order. Frames are read
        straight from ``data`` when nothing is left over from before (the usual case: a
        read ends on a frame's end); only a partial frame is kept, copied."""
        buffer = self._buffer
        if buffer:
            buffer += data
            source: bytes | bytearray = buffer
        else:
            source = data
        messages: list[tuple[Any, ...]] = []
        start = 0
        end = len(source)
        with memoryview(source) as view:
            while end - start >= 4:
                (length,) = _LENGTH.unpack_from(source, start)
                if end - start - 4 < length:
                    break
                messages += pickle.loads(view[start + 4:start + 4 + length])
                start += 4 + length
            if source is not buffer and start < end:
                buffer += view[start:]
        if source is buffer and start:
            del buffer[:start]
        return messages


class Outbox:
    """Messages for one transport, written together once per loop turn (``schedule``: the
    loop's ``call_soon``) as one frame. ``before_flush(callback)``: ``callback`` runs at
    that flush, before the frame is made, and may send (answers gathered over the turn).
    A message is pickled at the flush: what it holds must not change until then."""

    def __init__(self, write: Callable[[bytes], None], schedule: Callable[[Callable[[], None]], Any]) -> None:
        self._write = write
        self._schedule = schedule
        self._messages: list[tuple[Any, ...]] = []
        self._before: list[Callable[[], None]] = []
        self._armed = False

    def send(self, message: tuple[Any, ...]) -> None:
        self._messages.append(message)
        if not self._armed:
            self._armed = True
            self._schedule(self.flush)

    def before_flush(self, callback: Callable[[], None]) -> None:
        self._before.append(callback)
        if not self._armed:
            self._armed = True
            self._schedule(self.flush)

    def flush(self) -> None:
        self._armed = False
        if self._before:
            before, self._before = self._before, []
            for callback in before:
                callback()
        messages, self._messages = self._messages, []
        if messages:
            self._write(frame(*messages))
