"""gRPC in a front-end worker: ``WorkerGrpcServer`` (the native HTTP/2 engine on the
worker's gRPC socket) and ``GrpcMainLink`` (``MainLink`` with the gRPC calls).

A ModelInfer whose model the main process announced (the same MODEL messages as HTTP's)
and that needs nothing the main process holds (no version named, no client shared
memory, no BYTES tensors, no sequence) is decoded here with the main process's gRPC
decoder and memo (``infer_messages``, ``InferMemo``), its tensors laid out in the arena
and sent as a DECODED message, exactly as HTTP's; its outputs come back as RESULTS and
are encoded here into the ModelInferResponse. ModelStatistics is answered here from the
figures the main process publishes (shared_stats.py; relayed when they cannot tell).
Every other call -- the other unary RPCs,
ModelStreamInfer, a ModelInfer this cannot decode, and every call of a restricted group
-- is relayed whole to the main process's gRPC server (grpc_link.py): its headers, each
message, its end or reset; and back its response message(s) and status. A streamed
call's request messages hold the client's window here until the main process has taken
them (GRPC_TAKEN); its response messages are given back (CREDIT, send_windows.py) once
the client's window let them out, so the main process's writer waits for a client that
does not read as it would with one process. The calls' own objects and the handlers of
the calls taken here are in grpc_calls.py.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from nereid.frontends.arena import Arena
from nereid.frontends.decoding import lay_out
from nereid.frontends.directory_sync import DirectoryCopy
from nereid.frontends.forwarding import MainLink, _InferCall
from nereid.frontends.grpc_calls import (
    MAIN_GONE, CallState, GrpcAnnounced, WorkerGrpcCall, WorkerModelInfer, WorkerModelStatistics, decode,
)
from nereid.frontends.messages import Kind
from nereid.frontends.shared_limits import CountedConnections, SharedLimits
from nereid.frontends.shared_stats import StatisticsCopy
from nereid.grpc.h2.calls import Status
from nereid.grpc.h2.connection import GrpcConnection
from nereid.grpc.h2.stream import GrpcStream, StreamState
from nereid.grpc.native import NativeGrpcServer
from nereid.grpc.service import METHOD_GROUPS, InferenceService
from nereid.network.access import restriction_table
from nereid.network.request_budget import RequestBudget
from nereid.options import ServerOptions

__all__ = ["GrpcMainLink", "WorkerGrpcServer"]

_SERVICE = "/inference.GRPCInferenceService/"
_MODEL_INFER = f"{_SERVICE}ModelInfer".encode()
_STREAM_INFER = f"{_SERVICE}ModelStreamInfer".encode()
_MODEL_STATISTICS = f"{_SERVICE}ModelStatistics".encode()

_DECODED, _MODEL, _FORGET = Kind.DECODED.value, Kind.MODEL.value, Kind.FORGET.value
_OPEN, _MESSAGE, _END, _RESET = (
    Kind.GRPC_OPEN.value, Kind.GRPC_MESSAGE.value, Kind.GRPC_END.value, Kind.GRPC_RESET.value)
_RESPOND, _SEND, _FINISH, _TAKEN = (
    Kind.GRPC_RESPOND.value, Kind.GRPC_SEND.value, Kind.GRPC_FINISH.value, Kind.GRPC_TAKEN.value)
#: templates named by number (as forwarding.py's)


class GrpcMainLink(MainLink):
    """``MainLink`` with this worker's gRPC calls: decoded ModelInfer requests beside
    HTTP's, relayed calls, and their answers."""

    def __init__(self, arena: Arena, directory: DirectoryCopy) -> None:
        super().__init__(arena, directory)
        #: the model versions announced, as gRPC decodes for them, by name
        self.grpc_models: dict[str, GrpcAnnounced] = {}
        self._draining: set[asyncio.Task[None]] = set()

    # -- what the gRPC server hands over ---------------------------------------------------

    def open_relayed(self, connection: GrpcConnection, stream: GrpcStream) -> WorkerGrpcCall:
        call = stream.call = WorkerGrpcCall(self, connection, stream)
        self._relay(call)
        return call

    def start_infer_call(self, call: WorkerGrpcCall, data: bytes) -> None:
        """A ModelInfer whose request is in: decoded here when it can be, else relayed."""
        if self.main_gone:
            call.end(Status.UNAVAILABLE, MAIN_GONE)
            return
        try:
            message = service_pb2.ModelInferRequest.FromString(data)
        except DecodeError:
            message = None
        name = message.model_name if message is not None else None
        model = self.grpc_models.get(name) if message is not None and name and not message.model_version else None
        if model is not None:
            decoded = decode(model, message, data)
            if decoded is not None:
                offset = self.ring.allocate(decoded.size)
                if offset is not None:
                    template = lay_out(decoded, self.arena.requests[offset:offset + decoded.size])
                    call.id = self._next_id = self._next_id + 1
                    call.state, call.offset, call.model, call.request = CallState.DECODED, offset, model, decoded.request
                    call.raw = data
                    self._calls[call.id] = call
                    self._send_decoded_grpc(call, model.token, template, offset)
                    return
        call.data = data
        self._relay(call, name)

    def _relay(self, call: WorkerGrpcCall, model_name: str | None = None) -> None:
        """The call goes whole to the main process's gRPC server (under a new id)."""
        call.id = self._next_id = self._next_id + 1
        call.state = CallState.RELAYED
        if self.main_gone:
            call.end(Status.UNAVAILABLE, MAIN_GONE)
            return
        self._calls[call.id] = call
        self.send((_OPEN, call.id, dict(call.stream.headers)))
        if call.data is not None:  # a ModelInfer not decoded: its request is in already
            data, call.data = call.data, None
            self.send((_MESSAGE, call.id, data))
            self.send((_END, call.id, model_name))

    def relay_request(self, call: WorkerGrpcCall, data: bytes) -> None:
        """A unary call whose request is in, relayed whole (this worker does not answer it)."""
        call.data = data
        self._relay(call)

    def _send_decoded_grpc(self, call: WorkerGrpcCall, token: int, template: tuple[Any, ...], offset: int) -> None:
        number, whole = self._numbered(template)
        self.send((_DECODED, call.id, token, number, whole, offset, call.request.id, call.received_ns, True))

    def reset_call(self, call: WorkerGrpcCall) -> None:
        """The client (or its deadline) reset the call."""
        if call.state is CallState.DECODED:
            call.withdraw()  # its block is let go on DONE
        elif call.state is CallState.RELAYED and self._calls.pop(call.id, None) is not None:
            self.send((_RESET, call.id))

    # -- what the main process sends -------------------------------------------------------

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == _RESPOND:
            call = self._calls.pop(message[1], None)
            if isinstance(call, WorkerGrpcCall) and call.stream.call is call:
                call.stream.call = None
                call.connection.respond(call.stream, message[2])
        elif kind == _SEND:
            call = self._calls.get(message[1])
            if isinstance(call, WorkerGrpcCall) and call.stream.call is call:
                call.connection.send_message(call.stream, message[2])
                self._owe(call, len(message[2]))
        elif kind == _FINISH:
            call = self._calls.pop(message[1], None)
            self._release(call)
            if isinstance(call, WorkerGrpcCall):
                call.end(message[2], message[3])
        elif kind == _TAKEN:
            call = self._calls.get(message[1])
            if isinstance(call, WorkerGrpcCall) and call.stream.call is call:
                call.connection.taken(call.stream, message[2])
        else:
            super()._dispatch(message)
            if kind == _MODEL:
                _, name, token, version, config, labels = message
                self.grpc_models[name] = GrpcAnnounced(token, version, config, labels)
            elif kind == _FORGET:
                known = self.grpc_models.get(message[1])
                if known is not None and known.token == message[2]:
                    del self.grpc_models[message[1]]

    def _owe(self, call: WorkerGrpcCall, size: int) -> None:
        """``size`` bytes of a relayed stream's response are queued on its stream: given
        back to the main process (``credit``) once the client's window let them all
        out -- at once when it did already, else when the stream drains."""
        call.owed += size
        if call.stream.pending_bytes == 0:
            self.credit(call.id, call.owed)
            call.owed = 0
        elif not call.draining:
            call.draining = True
            task = self._loop.create_task(self._credit_when_drained(call))
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)

    async def _credit_when_drained(self, call: WorkerGrpcCall) -> None:
        stream = call.stream
        try:
            while call.owed and stream.call is call and stream.state is not StreamState.CLOSED:
                await call.connection.writable(stream, 0)
                if stream.pending_bytes == 0 and stream.call is call:
                    self.credit(call.id, call.owed)
                    call.owed = 0
        finally:
            call.draining = False

    def _answer_decoded(self, call: _InferCall, version: int, outputs: dict[str, Any]) -> None:
        """As ``MainLink._answer_decoded``, a gRPC call answered in its own protocol."""
        if isinstance(call, WorkerGrpcCall):
            call.answer(version, outputs)
        else:
            super()._answer_decoded(call, version, outputs)

    def _retry(self, id: int) -> None:
        call = self._calls.get(id)
        if not isinstance(call, WorkerGrpcCall):
            super()._retry(id)
            return
        del self._calls[id]
        self._release(call)
        if not call.withdrawn and call.stream.call is call:  # else nobody waits
            call.data, call.raw = call.raw, None
            self._relay(call)  # the main process announces the version it serves now



class WorkerGrpcServer(NativeGrpcServer):
    """The worker's gRPC server: the native engine's connections, limits, keep-alive and
    deadlines, with ModelInfer routed to ``WorkerModelInfer`` and (given ``statistics``)
    ModelStatistics to ``WorkerModelStatistics`` (unless their group is restricted: the
    main process checks the key) and every other call relayed."""

    def __init__(
        self, link: GrpcMainLink, options: ServerOptions, budget: RequestBudget, shared: SharedLimits | None = None,
        index: int = 0, statistics: StatisticsCopy | None = None,
    ) -> None:
        super().__init__(cast(InferenceService, None), options, budget=budget)
        self._link = link
        #: --grpc-max-connections server-wide: each worker's count in its row of ``shared``
        self._shared = shared
        if shared is not None:
            self.connections = CountedConnections(shared, index, grpc=True)
        restrictions = restriction_table(options.grpc_restricted_protocol, "--grpc-restricted-protocol")
        restricted = METHOD_GROUPS["ModelInfer"] in restrictions
        self.routes: dict[bytes, Any] = {} if restricted else {_MODEL_INFER: WorkerModelInfer(link)}
        if statistics is not None and METHOD_GROUPS["ModelStatistics"] not in restrictions:
            self.routes[_MODEL_STATISTICS] = WorkerModelStatistics(link, statistics)

    def open_connections(self) -> int:
        return self._shared.grpc_connections() if self._shared is not None else len(self.connections)

    @staticmethod
    def _method_table(service: InferenceService, restrictions: Any) -> dict[bytes, Any]:
        return {}  # the main process's server knows the methods

    def open(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        if stream.headers.get(b":path") == _STREAM_INFER:
            stream.streaming = True  # its messages hold the window until the main process takes them
        self._link.open_relayed(connection, stream)

    def message(self, connection: GrpcConnection, stream: GrpcStream, data: bytes) -> None:
        call: WorkerGrpcCall | None = stream.call
        if call is not None and call.state is CallState.RELAYED:
            self._link.send((_MESSAGE, call.id, data))

    def end(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        call: WorkerGrpcCall | None = stream.call
        if call is not None and call.state is CallState.RELAYED:
            self._link.send((_END, call.id, None))

    def reset(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        call: WorkerGrpcCall | None = stream.call
        if call is not None:
            stream.call = None
            self._link.reset_call(call)
