"""A gRPC call in a front-end worker: where it is (``CallState``), its request decoded
and its answer encoded for a model version the main process announced (``decode``,
``encode``), and the handlers of the unary calls the worker takes itself: ModelInfer
(decoded here, or relayed) and ModelStatistics (answered here from the shared figures,
or relayed). grpc_front.py holds the worker's gRPC server and its link to the main
process.
"""

from __future__ import annotations

import abc
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from nereid.config.schema import ModelConfig
from nereid.errors import NereidError
from nereid.frontends.decoding import Decoded, decoded_for_main
from nereid.frontends.forwarding import _InferCall
from nereid.frontends.messages import Kind
from nereid.frontends.shared_stats import StatisticsCopy
from nereid.grpc.h2.calls import Status
from nereid.grpc.h2.connection import GrpcConnection
from nereid.grpc.h2.stream import GrpcStream
from nereid.grpc.infer import GrpcModelTables, status_of
from nereid.grpc.infer_messages import decode_request, encode_response
from nereid.grpc.service import statistics_response
from nereid.inference import InferRequest

if TYPE_CHECKING:
    from nereid.frontends.grpc_front import GrpcMainLink

__all__ = ["CallState", "GrpcAnnounced", "WorkerGrpcCall", "WorkerModelInfer", "WorkerModelStatistics", "decode", "encode"]

_log = logging.getLogger("nereid")

#: what a call says when the main process is gone
MAIN_GONE = "the server's main process is gone (it is restarting or stopping)"
_MESSAGE = Kind.GRPC_MESSAGE.value


class CallState(enum.Enum):
    """Where a gRPC call of the worker is: its request still coming (a ModelInfer),
    decoded here and queued in the main process, or relayed whole to it."""

    RECEIVING = "receiving"
    DECODED = "decoded"
    RELAYED = "relayed"


@dataclass(slots=True)
class GrpcAnnounced:
    """A model version the main process announced, as gRPC decodes for it (its tables
    made at the first gRPC request)."""

    token: int
    version: int
    config: ModelConfig
    labels: Mapping[str, list[str]]
    tables: GrpcModelTables | None = field(default=None)

    def grpc_tables(self) -> GrpcModelTables:
        if self.tables is None:
            self.tables = GrpcModelTables.for_config(self.config)
        return self.tables


class _NeedsMain(Exception):
    """The request uses client shared memory, which the main process holds."""


def _no_shared_memory(*args: Any) -> Any:
    raise _NeedsMain()


def decode(model: GrpcAnnounced, message: Any, data: bytes) -> Decoded | None:
    """A ModelInferRequest decoded for ``model`` (through the memo, as the main process
    would), or None when the main process must take it whole."""
    tables = model.grpc_tables()
    memo = tables.memo
    key = memo.request_key(message, data)
    try:
        request = memo.request(key, message, model.version) if key is not None else None
        if request is None:
            request = decode_request(message, tables, model.version, _no_shared_memory)
            if key is not None:
                memo.learn_request(key, message, request)
    except Exception:  # shared memory, or a bad request: the main process answers it
        return None
    return decoded_for_main(request)


def encode(model: GrpcAnnounced, request: InferRequest, version: int, outputs: Mapping[str, Any]) -> bytes:
    """The serialized ModelInferResponse (the memo's when it knows its shape)."""
    tables = model.grpc_tables()
    memo = tables.memo
    data = memo.answer(request, outputs, version)
    if data is None:
        response = encode_response(outputs, request, tables, version, model.labels, _no_shared_memory)
        data = response.SerializeToString()
        memo.learn_answer(request, outputs, version, response, data, tables)
    return data


class WorkerGrpcCall(_InferCall):
    """One gRPC call of this worker: its stream, its request bytes (a ModelInfer), and
    what was decoded of it. Its own responder: the main process gone, it ends UNAVAILABLE."""

    __slots__ = ("connection", "stream", "state", "received_ns", "data", "raw", "model", "request", "owed", "draining")

    def __init__(self, link: GrpcMainLink, connection: GrpcConnection, stream: GrpcStream) -> None:
        super().__init__(link, 0, self, -1)  # type: ignore[arg-type]  # its own Responder
        self.connection = connection
        self.stream = stream
        self.state = CallState.RECEIVING
        self.received_ns = time.monotonic_ns()
        self.data: bytes | None = None
        #: a decoded request's bytes, sent whole if the main process asks (RETRY)
        self.raw: bytes | None = None
        self.model: GrpcAnnounced | None = None
        self.request: Any = None
        #: bytes of relayed response messages not given back yet, and whether a task
        #: waits for the stream to drain to give them back
        self.owed = 0
        self.draining = False

    def reply(self, status: int, headers: Any, body: bytes) -> None:
        self.end(Status.UNAVAILABLE, MAIN_GONE)

    def end(self, status: int, message: str) -> None:
        if self.stream.call is self:
            self.stream.call = None
            self.connection.finish(self.stream, status, message)

    def answer(self, version: int, outputs: Mapping[str, Any]) -> None:
        """A decoded request's outputs (views on the arena: encoded at once)."""
        if self.stream.call is not self:
            return
        assert self.model is not None
        try:
            data = encode(self.model, self.request, version, outputs)
        except NereidError as exc:
            self.end(status_of(exc).value[0], exc.message)
            return
        except Exception as exc:  # a bug: this call fails, loudly
            _log.exception("gRPC: encoding a ModelInfer answer in a front-end worker failed")
            self.end(Status.INTERNAL, f"internal error: {exc}")  # as the main process says it
            return
        self.stream.call = None
        self.raw = None
        self.connection.respond(self.stream, data)


class _UnaryHandler(abc.ABC):
    """A unary call collected in the worker (a CallHandler routed by ``:path``): its one
    request message, then ``handle`` (relayed messages go straight on once it was relayed)."""

    def __init__(self, link: GrpcMainLink) -> None:
        self._link = link

    def open(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        stream.call = WorkerGrpcCall(self._link, connection, stream)

    def message(self, connection: GrpcConnection, stream: GrpcStream, data: bytes) -> None:
        call: WorkerGrpcCall | None = stream.call
        if call is None:
            return
        if call.state is CallState.RELAYED:
            self._link.send((_MESSAGE, call.id, data))
        elif call.data is None:
            call.data = data
        else:
            call.end(Status.UNIMPLEMENTED, "More than one request message in a unary call")

    def end(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        call: WorkerGrpcCall | None = stream.call
        if call is None or call.state is not CallState.RECEIVING:
            return
        data, call.data = call.data, None
        if data is None:
            call.end(Status.UNIMPLEMENTED, "No request message in a unary call")
            return
        self.handle(connection, stream, call, data)

    @abc.abstractmethod
    def handle(self, connection: GrpcConnection, stream: GrpcStream, call: WorkerGrpcCall, data: bytes) -> None:
        """The call's one request message ``data``, collected: answer it or relay it."""

    def reset(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        call: WorkerGrpcCall | None = stream.call
        if call is None:
            return
        stream.call = None
        self._link.reset_call(call)


class WorkerModelInfer(_UnaryHandler):
    """ModelInfer's calls in the worker: the request is collected, then decoded here or
    relayed (``GrpcMainLink.start_infer_call``)."""

    def handle(self, connection: GrpcConnection, stream: GrpcStream, call: WorkerGrpcCall, data: bytes) -> None:
        self._link.start_infer_call(call, data)


class WorkerModelStatistics(_UnaryHandler):
    """ModelStatistics' calls in the worker: answered from the figures the main process
    publishes (``statistics``), with its own code (``statistics_response``), or relayed
    when those cannot tell (``StatisticsCopy.read``)."""

    def __init__(self, link: GrpcMainLink, statistics: StatisticsCopy) -> None:
        super().__init__(link)
        self._statistics = statistics

    def handle(self, connection: GrpcConnection, stream: GrpcStream, call: WorkerGrpcCall, data: bytes) -> None:
        try:
            request = service_pb2.ModelStatisticsRequest.FromString(data)
        except DecodeError:
            request = None
        picture = self._statistics.read(request.name or None) if request is not None else None
        if picture is None:  # the main process answers it (a bad message too, in its words)
            self._link.relay_request(call, data)
            return
        try:
            response = statistics_response(picture, request).SerializeToString()
        except NereidError as exc:
            call.end(status_of(exc).value[0], exc.message)
            return
        stream.call = None
        connection.respond(stream, response)
