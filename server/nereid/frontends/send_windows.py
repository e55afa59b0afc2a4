"""SendWindows: back-pressure across a front-end worker's link on streamed responses.

A relayed gRPC stream's response messages (GRPC_SEND) and a forwarded HTTP response's
body parts (BODY) are written by the main process and handed to their clients by the
worker, as fast as each client reads. The main process counts, per stream, the bytes it
sent that the worker has not yet handed to its client's connection; the worker gives
them back (CREDIT) once they left its queue for the connection: a gRPC stream's bytes
when the client's HTTP/2 window let them all out (``GrpcConnection.writable``), an HTTP
part once the connection's writer drained it (the ASGI ``send`` returned).

The stream's writer in the main process waits (``wait``, the ``writable`` of the relayed
gRPC connection and the ``drain`` of the forwarded exchange) while its stream has more
than ``per_stream`` bytes out, or while the whole link has more than ``whole`` bytes out
and this stream has any: the model's producer is then held exactly as with one process,
where the same writers wait on the client's connection. A stream with nothing out may
always send one part, so streams of slow clients that fill ``whole`` slow the others to
one part per hand-over and never stop them. A stream that ends, is reset or withdrawn
is forgotten (``forget``): its bytes no longer count and its writer wakes. A worker that
goes away wakes every writer (``close``). What a worker holds for its clients is thus at
most ``whole`` plus one part per stream, and ``per_stream`` for one stream.
"""

from __future__ import annotations

import asyncio

__all__ = ["SendWindows", "PER_STREAM", "WHOLE"]

#: bytes one stream may have out in the worker: the native HTTP/2 engine's high-water mark
#: of a stream (TransportLimits.stream_high_water), what one process holds for it
PER_STREAM = 1 << 20
#: bytes all the streams of one worker may have out
WHOLE = 32 << 20


class SendWindows:
    """The bytes of each stream out in one worker, and the writers waiting for them to
    come back (one per stream: its response is written in order)."""

    def __init__(self, per_stream: int = PER_STREAM, whole: int = WHOLE) -> None:
        self.per_stream = per_stream
        self.whole = whole
        #: bytes out, by stream id (absent: none)
        self.out: dict[int, int] = {}
        #: bytes out, all streams
        self.total = 0
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self.closed = False

    def sent(self, id: int, size: int) -> None:
        """``size`` bytes of stream ``id`` went to the worker."""
        if size > 0 and not self.closed:
            self.out[id] = self.out.get(id, 0) + size
            self.total += size

    def returned(self, id: int, size: int) -> None:
        """The worker handed ``size`` bytes of stream ``id`` to its client's connection
        (CREDIT); bytes of a stream already forgotten are ignored."""
        out = self.out.get(id)
        if out is None:
            return
        size = min(size, out)
        if out > size:
            self.out[id] = out - size
        else:
            del self.out[id]
        self._released(id, size)

    def forget(self, id: int) -> None:
        """Stream ``id`` ended (finished, reset, withdrawn): its bytes no longer count."""
        self._released(id, self.out.pop(id, 0))
        self._wake([id])

    def close(self) -> None:
        """The worker is gone: nothing is out any more, and no writer waits."""
        self.closed = True
        self.out.clear()
        self.total = 0
        self._wake(list(self._waiting))

    def blocked(self, id: int) -> bool:
        """Whether stream ``id``'s writer must wait before its next part."""
        out = self.out.get(id, 0)
        return out > self.per_stream or (out > 0 and self.total > self.whole)

    async def wait(self, id: int) -> None:
        """Wait while stream ``id`` is ``blocked`` (and neither it nor the link ended)."""
        while not self.closed and self.blocked(id):
            waiter = self._waiting.get(id)
            if waiter is None or waiter.done():
                waiter = self._waiting[id] = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiting.get(id) is waiter:
                    del self._waiting[id]

    def _released(self, id: int, size: int) -> None:
        if not size:
            return
        was_over = self.total > self.whole
        self.total -= size
        if was_over and self.total <= self.whole:
            self._wake(list(self._waiting))  # every stream held by the whole may go on
        elif id in self._waiting and not self.blocked(id):
            self._wake([id])

    def _wake(self, ids: list[int]) -> None:
        for id in ids:
            waiter = self._waiting.pop(id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
