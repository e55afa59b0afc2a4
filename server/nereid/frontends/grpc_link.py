"""GrpcWorkerLink: a front-end worker's link in the main process, with its gRPC calls.

The worker serves the gRPC port with the native HTTP/2 engine. A ModelInfer it decodes
comes as a DECODED message like HTTP's (one more field: True) and is queued by
``WorkerLink``'s own code; its outputs go back as RESULTS, and only its error differs:
a gRPC status and message (GRPC_FINISH) where HTTP gets a JSON body. Every other call
is relayed whole (GRPC_OPEN, GRPC_MESSAGE, GRPC_END, GRPC_RESET) into the main
process's ``NativeGrpcServer`` through a ``RelayedConnection``, which stands for the
client's connection there: the server's own routes, restrictions, service and messages
answer it, so the worker's client sees what one process would have said, byte for byte,
and statistics are counted once, here.
"""

from __future__ import annotations

import logging
from typing import Any

from nereid.errors import NereidError
from nereid.frontends.arena import Arena
from nereid.frontends.link import WorkerLink
from nereid.frontends.messages import Kind
from nereid.grpc.h2.calls import Status
from nereid.grpc.h2.stream import GrpcStream, StreamState
from nereid.grpc.infer import status_of
from nereid.grpc.native import NativeGrpcServer
from nereid.http.app import NereidApp

__all__ = ["GrpcWorkerLink", "RelayedConnection"]

_log = logging.getLogger("nereid")

_WITHDRAW = Kind.WITHDRAW.value
_OPEN, _MESSAGE, _END, _RESET = (
    Kind.GRPC_OPEN.value, Kind.GRPC_MESSAGE.value, Kind.GRPC_END.value, Kind.GRPC_RESET.value)
_RESPOND, _SEND, _FINISH, _TAKEN = (
    Kind.GRPC_RESPOND.value, Kind.GRPC_SEND.value, Kind.GRPC_FINISH.value, Kind.GRPC_TAKEN.value)


class RelayedConnection:
    """The main process's stand-in for the client connections of one worker: what the
    ``NativeGrpcServer``'s handlers call on a ``GrpcConnection`` (respond, send_message,
    finish, taken, writable) becomes a message to the worker, which writes it on the
    real stream. A stream here is the relayed call's, numbered by the worker's id."""

    def __init__(self, server: NativeGrpcServer, link: GrpcWorkerLink) -> None:
        self.server = server
        self.link = link
        self.streams: dict[int, GrpcStream] = {}

    # -- what the worker relays ------------------------------------------------------------

    def open(self, id: int, headers: dict[bytes, bytes]) -> None:
        stream = GrpcStream(id, headers, 0, 0)
        stream.handler = self.server.routes.get(headers.get(b":path", b""), self.server)
        self.streams[id] = stream
        self._tell(stream, "open")

    def message(self, id: int, data: bytes) -> None:
        stream = self.streams.get(id)
        if stream is not None and stream.state is not StreamState.CLOSED:
            if stream.streaming:
                stream.backlog += 1
            self._tell(stream, "message", data)

    def end(self, id: int) -> None:
        stream = self.streams.get(id)
        if stream is not None and stream.state is StreamState.OPEN:
            stream.state = StreamState.HALF_CLOSED_REMOTE
            self._tell(stream, "end")

    def reset(self, id: int) -> None:
        stream = self.streams.pop(id, None)
        if stream is not None and stream.state is not StreamState.CLOSED:
            stream.state = StreamState.CLOSED
            self.link.windows.forget(id)
            self._tell(stream, "reset")

    def reset_all(self) -> None:
        """The worker is gone: every call it relayed is reset (nobody is left to answer)."""
        for id in list(self.streams):
            self.reset(id)

    def _tell(self, stream: GrpcStream, event: str, *args: Any) -> None:
        try:
            getattr(stream.handler, event)(self, stream, *args)
        except Exception as exc:  # a bug: this call fails, the link goes on
            _log.exception("gRPC: a call relayed from front-end worker %d failed", self.link.index)
            self.finish(stream, Status.INTERNAL, f"internal error: {exc}")

    # -- what a GrpcConnection does for the handlers ---------------------------------------

    def respond(self, stream: GrpcStream, message: bytes) -> None:
        if self._close(stream):
            self.link.send((_RESPOND, stream.id, bytes(message)))

    def send_message(self, stream: GrpcStream, message: bytes) -> None:
        if stream.state is not StreamState.CLOSED:
            data = bytes(message)
            self.link.windows.sent(stream.id, len(data))
            self.link.send((_SEND, stream.id, data))

    def finish(self, stream: GrpcStream, status: int, message: str) -> None:
        if self._close(stream):
            self.link.send((_FINISH, stream.id, status, message))

    def taken(self, stream: GrpcStream, size: int) -> None:
        if stream.state is not StreamState.CLOSED:
            stream.backlog -= 1
            self.link.send((_TAKEN, stream.id, size))

    async def writable(self, stream: GrpcStream) -> None:
        """Wait while the worker holds more of this stream's messages than its client let
        it send (send_windows.py): the streaming call's writer waits as it would on the
        client's own connection."""
        await self.link.windows.wait(stream.id)

    def _close(self, stream: GrpcStream) -> bool:
        if stream.state is StreamState.CLOSED:
            return False
        stream.state = StreamState.CLOSED
        self.streams.pop(stream.id, None)
        self.link.windows.forget(stream.id)
        return True


class GrpcWorkerLink(WorkerLink):
    """``WorkerLink`` that also takes the worker's gRPC calls: relayed ones into
    ``grpc_server`` (the main process's, which listens on no port of its own), decoded
    ModelInfer requests like HTTP's, their errors as gRPC statuses."""

    def __init__(
        self, app: NereidApp, arena: Arena, state: dict[str, Any], index: int, grpc_server: NativeGrpcServer,
    ) -> None:
        super().__init__(app, arena, state, index)
        self.relay = RelayedConnection(grpc_server, self)
        #: decoded gRPC ModelInfer requests not answered yet
        self._grpc_ids: set[int] = set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._grpc_ids.clear()
        self.relay.reset_all()
        super().connection_lost(exc)

    def _take(self, message: tuple[Any, ...]) -> None:
        """The gRPC relay's messages here, the rest as ``WorkerLink`` takes them."""
        kind = message[0]
        relay = self.relay
        if kind == _MESSAGE:
            relay.message(message[1], message[2])
        elif kind == _OPEN:
            self.requests += 1
            relay.open(message[1], message[2])
        elif kind == _END:
            relay.end(message[1])
            if message[2] is not None:
                self._announce(message[2])
        elif kind == _RESET:
            relay.reset(message[1])
        else:
            if kind == _WITHDRAW:
                self._grpc_ids.discard(message[1])
            super()._take(message)

    def _decoded(self, messages: list[tuple[Any, ...]]) -> None:
        for message in messages:
            if len(message) > 8:
                self._grpc_ids.add(message[1])
        super()._decoded(messages)

    def answered(self, id: int, version: int, outputs: dict[str, Any]) -> None:
        self._grpc_ids.discard(id)
        super().answered(id, version, outputs)

    def answered_rows(self, ids: list[int], rows: int, version: int, outputs: dict[str, Any]) -> None:
        self._grpc_ids.difference_update(ids)
        super().answered_rows(ids, rows, version, outputs)

    def send_error(self, id: int, error: NereidError) -> None:
        if id in self._grpc_ids:
            self._grpc_ids.discard(id)
            self.send((_FINISH, id, status_of(error).value[0], error.message))
        else:
            super().send_error(id, error)
