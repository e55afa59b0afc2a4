"""ModelInfer, gRPC's one infer path: decode, submit, encode (both gRPC engines use it);
``ModelInferCalls``, its calls on the native engine; ``InferMemo``, what it remembers of
a steady client's requests and answers.

``ModelInfer.start`` takes a ModelInferRequest to the model's batcher and, from the batch
that answers it, answers the serialized ModelInferResponse. A request the memo knows
(everything but its raw input contents as before, byte for byte) is made from its plan,
and an answer shaped like one before is its remembered bytes with the new output blobs:
neither goes through the full decoder and encoder (``infer_messages``), whose checks
decided the same the first time. ``status_of`` is the gRPC status of a NereidError.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import weakref
from typing import Any, Callable, Mapping, Sequence

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from nereid.config.schema import ModelConfig
from nereid.datatypes import BY_WIRE_NAME
from nereid.errors import (
    ExecutionTimeoutError,
    InternalError,
    InvalidInputError,
    MalformedRequestError,
    ModelExecutionError,
    ModelLoadError,
    ModelNotFoundError,
    NereidError,
    RequestCancelledError,
    UnavailableError,
    UnsupportedError,
)
from nereid.grpc.h2.calls import Status
from nereid.grpc.h2.connection import GrpcConnection
from nereid.grpc.h2.stream import GrpcStream
from nereid.grpc.infer_messages import decode_request, encode_response
from nereid.inference import InferRequest, ParameterValue, RequestedOutput
from nereid.models.admin import parse_version
from nereid.models.manager import ModelManager, ServingModel
from nereid.models.serving import Ticket
from nereid.tensors import wire_inputs, wire_outputs
from nereid.tensors.assembly import outputs_key
from nereid.tensors.shared_memory import SharedMemoryManager
from nereid.tensors.tables import ModelTables
from nereid.tensors.wire_inputs import RegionLeaseOnDemand

__all__ = ["GrpcModelTables", "InferMemo", "ModelInfer", "ModelInferCalls", "OnResponse", "status_of"]

_log = logging.getLogger("nereid")

#: How ``ModelInfer.start`` answers: (the serialized ModelInferResponse, None) or (None, the error).
OnResponse = Callable[[Any, "BaseException | None"], None]

_STATUS: tuple[tuple[type[NereidError], grpc.StatusCode], ...] = (
    (ModelNotFoundError, grpc.StatusCode.NOT_FOUND),
    (InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (MalformedRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (UnsupportedError, grpc.StatusCode.UNIMPLEMENTED),
    (RequestCancelledError, grpc.StatusCode.CANCELLED),
    (ModelExecutionError, grpc.StatusCode.INTERNAL),
    (ExecutionTimeoutError, grpc.StatusCode.INTERNAL),
    (ModelLoadError, grpc.StatusCode.INTERNAL),
    (InternalError, grpc.StatusCode.INTERNAL),
)


def status_of(error: NereidError) -> grpc.StatusCode:
    """Triton's gRPC status for an error (protocol.md, gRPC)."""
    for kind, code in _STATUS:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


class ModelInfer:
    """ModelInfer on one server: its models (``manager``), shared memory and the tables
    (with their memo) made once per model version from its config."""

    def __init__(self, manager: ModelManager, shm: SharedMemoryManager) -> None:
        self.manager = manager
        self.shm = shm
        self._tables: weakref.WeakKeyDictionary[ServingModel, GrpcModelTables] = weakref.WeakKeyDictionary()

    def tables(self, serving: ServingModel) -> GrpcModelTables:
        """The version's tables, made once (held weakly: they go with the version)."""
        tables = self._tables.get(serving)
        if tables is None:
            tables = self._tables[serving] = GrpcModelTables.for_config(serving.config)
        return tables

    def serving(self, request: Any) -> ServingModel:
        """The model version a request names (the latest when it names none)."""
        version = request.model_version
        serving = None if version else self.manager.latest.get(request.model_name)  # a dict read, the common case
        if serving is None:  # a version named, or none ready: get() raises Triton's error for why
            serving = self.manager.get(request.model_name, parse_version(version) if version else None)
        return serving

    def start(self, request: Any, received_ns: int, answer: OnResponse, data: bytes | None = None) -> Ticket:
        """Decode, queue, and (from the batch that answers it) encode.
        ``answer(response, error)`` is called once with the serialized response (error: a
        NereidError, or the CancelledError of a withdrawn ticket); what is refused before
        queueing raises NereidError instead. ``ticket.withdraw()`` if the caller goes
        away. ``data``: the request's bytes as received, for the memo (None: not kept)."""
        serving = self.serving(request)
        if serving.config.decoupled:
            raise UnsupportedError(
                f"ModelInfer RPC doesn't support models with decoupled transaction policy ('{serving.name}'); "
                "use ModelStreamInfer"
            )
        tables = self.tables(serving)
        call = _InferCall(serving, tables, self.shm, answer)
        memo = tables.memo
        key = memo.request_key(request, data) if data is not None else None
        try:
            infer_request = memo.request(key, request, serving.version) if key is not None else None
            if infer_request is None:
                infer_request = decode_request(request, tables, serving.version, call.resolve_shm)
                if key is not None:
                    memo.learn_request(key, request, infer_request)
            call.request = infer_request
            return serving.submit(infer_request, received_ns, call.answer)
        except BaseException:
            call.release()
            raise


class _InferCall(RegionLeaseOnDemand):
    """One request on its way through the model; ``answer`` encodes its outcome. A lease
    on the server's shared-memory regions is taken only when the request names one."""

    __slots__ = ("serving", "tables", "on_response", "request")

    def __init__(
        self, serving: ServingModel, tables: GrpcModelTables, regions: SharedMemoryManager, on_response: OnResponse,
    ) -> None:
        self.serving = serving
        self.tables = tables
        self.regions = regions
        self.on_response = on_response
        self.request: InferRequest
        self.lease = None

    def answer(self, outputs: Any, error: BaseException | None) -> None:
        response = None
        try:
            if error is None:
                response = self._encode(outputs)
        except NereidError as exc:
            error = exc
        finally:
            self.release()
        self.on_response(response, error)

    def _encode(self, outputs: Mapping[str, Any]) -> bytes:
        """The serialized response: from the memo when its shape is known, else the full
        encoder's (which the memo learns from)."""
        serving, request, memo = self.serving, self.request, self.tables.memo
        data = memo.answer(request, outputs, serving.version)
        if data is None:
            response = encode_response(outputs, request, self.tables, serving.version, serving.labels, self.write_shm)
            data = response.SerializeToString()
            memo.learn_answer(request, outputs, serving.version, response, data, self.tables)
        return data


class ModelInferCalls:
    """ModelInfer's calls on the native engine (an ``h2.calls.CallHandler``, routed to by
    ``:path``): the request's bytes go to ``ModelInfer.start`` when the client ends its
    side, and the answer back through ``GrpcConnection.respond``. No task, Future or
    context per call; ``stream.call`` is the call's ``_UnaryCall``."""

    def __init__(self, infer: ModelInfer) -> None:
        self._start = infer.start

    def open(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        stream.call = _UnaryCall(time.monotonic_ns())

    def message(self, connection: GrpcConnection, stream: GrpcStream, data: bytes) -> None:
        call: _UnaryCall | None = stream.call
        if call is None:
            return
        if call.data is None:
            call.data = data
        else:
            self._fail(connection, stream, Status.UNIMPLEMENTED, "More than one request message in a unary call")

    def end(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        call: _UnaryCall | None = stream.call
        if call is None:
            return
        data, call.data = call.data, None
        if data is None:
            self._fail(connection, stream, Status.UNIMPLEMENTED, "No request message in a unary call")
            return
        try:
            request = service_pb2.ModelInferRequest.FromString(data)
        except DecodeError:
            self._fail(connection, stream, Status.INTERNAL, "Unable to parse request")
            return

        def answer(response: bytes | None, error: BaseException | None) -> None:
            if stream.call is not call:  # reset, or past its deadline
                return
            stream.call = call.ticket = None  # the ticket's callback refers back to the call: no cycle
            if response is not None:
                connection.respond(stream, response)
            elif isinstance(error, NereidError):
                connection.finish(stream, status_of(error).value[0], error.message)
            elif not isinstance(error, asyncio.CancelledError):  # cancelled: withdrawn, nobody waits
                _log.error("gRPC: ModelInfer failed", exc_info=error)
                connection.finish(stream, Status.INTERNAL, f"internal error: {error}")

        try:
            ticket = self._start(request, call.received_ns, answer, data)
        except NereidError as exc:
            self._fail(connection, stream, status_of(exc).value[0], exc.message)
            return
        if stream.call is call:
            call.ticket = ticket

    def reset(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        call: _UnaryCall | None = stream.call
        if call is None:
            return
        stream.call = None
        if call.ticket is not None:
            ticket, call.ticket = call.ticket, None
            ticket.withdraw()

    @staticmethod
    def _fail(connection: GrpcConnection, stream: GrpcStream, status: int, message: str) -> None:
        """End a call that never started running (nothing to withdraw)."""
        stream.call = None
        connection.finish(stream, status, message)


class _UnaryCall:
    """A ModelInfer call: when it came, its request's bytes (once they are in), the
    batcher ticket that runs it."""

    __slots__ = ("received_ns", "data", "ticket")

    def __init__(self, received_ns: int) -> None:
        self.received_ns = received_ns
        self.data: bytes | None = None
        self.ticket: Ticket | None = None


# -- the memo ------------------------------------------------------------------------------

#: requests and answers remembered per model version; past it the memo starts afresh.
_CACHE_SIZE = 256
#: the tags of ModelInferRequest.raw_input_contents (7) and ModelInferResponse.raw_output_contents (6)
_RAW_INPUT_TAG, _RAW_OUTPUT_TAG = b"\x3a", b"\x32"
#: the tags of model_name (1), model_version (2) and id (3), strings in requests and responses alike
_NAME_TAG, _VERSION_TAG, _ID_TAG = b"\x0a", b"\x12", b"\x1a"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string_field(tag: bytes, text: str) -> bytes:
    """A proto3 string field as protobuf writes it (nothing for the empty string)."""
    if not text:
        return b""
    encoded = text.encode()
    return tag + _varint(len(encoded)) + encoded


def _split_at_id(data: bytes, name: str, version: str, id_: str) -> tuple[bytes, bytes] | None:
    """``data`` (a serialized request or response of model ``name``, ``version`` and id
    ``id_``) as what comes before its id field and what comes after, when those three
    fields lead it in order, as protobuf's encoders write them; None when they do not."""
    lead = _string_field(_NAME_TAG, name) + _string_field(_VERSION_TAG, version)
    whole = lead + _string_field(_ID_TAG, id_)
    return (lead, data[len(whole):]) if data.startswith(whole) else None


def _without_raw(data: bytes, raw: Sequence[bytes], tag: bytes) -> bytes | None:
    """``data`` (a serialized message) without its raw contents, when they come last
    and in order, as protobuf's encoders write them; None when they do not."""
    end = len(data)
    for blob in reversed(raw):
        head = tag + _varint(len(blob))
        end -= len(head) + len(blob)
        if end < 0 or data[end:end + len(head)] != head:
            return None
    return data[:end]


@dataclasses.dataclass(slots=True)
class _Plan:
    """What the full decoder made of a request, but its raw input contents and its id."""

    inputs: tuple[wire_inputs.WireInput, ...]  # in request order, their buffer unset
    rows: int
    outputs: tuple[RequestedOutput, ...] | None
    parameters: dict[str, ParameterValue]
    priority: int
    timeout_us: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class _Answer:
    """A remembered answer: ``requested`` is the very ``request.outputs`` object it was
    made for; ``lead`` and ``rest`` the response's bytes before and after its id, without
    the blobs of the outputs ``sent``."""

    requested: tuple[RequestedOutput, ...] | None
    lead: bytes
    rest: bytes
    sent: tuple[str, ...]


class InferMemo:
    """What one served model version remembers of the requests and answers clients
    repeat. A request is planned when all its inputs are raw contents, none of its
    outputs goes to shared memory and it belongs to no sequence; an answer, when every
    output it sends is a small numeric array of its config datatype (one ``tobytes``
    each, ``wire_outputs.copied_whole``). Neither depends on the request's id: clients that
    number their requests (perf_analyzer's async mode) repeat too, each answered with its own
    id. None means "not known": the full path decides."""

    __slots__ = ("_plans", "_answers", "requests_planned", "answers_remembered")

    def __init__(self) -> None:
        self._plans: dict[tuple[bytes, tuple[int, ...]], _Plan] = {}
        self._answers: dict[tuple[Any, ...], _Answer] = {}
        #: how often each shortcut was taken (tests read these)
        self.requests_planned = self.answers_remembered = 0

    @staticmethod
    def request_key(message: Any, data: bytes) -> tuple[bytes, tuple[int, ...]] | None:
        """What a request's plan is found by: its bytes but its raw contents (and its id,
        where it leads them as protobuf writes it), and the contents' sizes."""
        raw = message.raw_input_contents
        head = _without_raw(data, raw, _RAW_INPUT_TAG) if raw else None
        if head is None:
            return None
        if message.id:
            split = _split_at_id(head, message.model_name, message.model_version, message.id)
            if split is not None:
                head = split[0] + split[1]
        return head, tuple(map(len, raw))

    def request(self, key: tuple[bytes, tuple[int, ...]], message: Any, version: int) -> InferRequest | None:
        plan = self._plans.get(key)
        if plan is None:
            return None
        model, raw = message.model_name, message.raw_input_contents
        prefix = f"[request id: {message.id or '<id_unknown>'}] "
        arrays = {
            item.name: wire_inputs.to_array(
                wire_inputs.WireInput(item.name, item.dt, item.shape, wire_inputs.BINARY, blob, 0, len(blob)), model, prefix,
            )
            for item, blob in zip(plan.inputs, raw)
        }
        self.requests_planned += 1
        return InferRequest(
            model, arrays, plan.rows, message.id, version, plan.outputs, dict(plan.parameters) if plan.parameters else {},
            plan.priority, plan.timeout_us, True,
        )

    def learn_request(self, key: tuple[bytes, tuple[int, ...]], message: Any, request: InferRequest) -> None:
        if request.sequence is not None or any(tensor.HasField("contents") or tensor.parameters for tensor in message.inputs):
            return
        if request.outputs is not None and any(out.shm_region is not None for out in request.outputs):
            return
        inputs = tuple(
            wire_inputs.WireInput(tensor.name, BY_WIRE_NAME[tensor.datatype], tuple(tensor.shape), wire_inputs.BINARY)
            for tensor in message.inputs
        )
        if len(self._plans) >= _CACHE_SIZE:
            self._plans.clear()  # ever-changing requests must not pile up
        self._plans[key] = _Plan(
            inputs, request.rows, request.outputs, dict(request.parameters), request.priority, request.timeout_us,
        )

    def answer(self, request: InferRequest, outputs: Mapping[str, Any], version: int) -> bytes | None:
        key = outputs_key([id(request.outputs), version], outputs)
        known = self._answers.get(key) if key is not None else None
        if known is None or known.requested is not request.outputs:
            return None
        parts = [known.lead, _string_field(_ID_TAG, request.id) if request.id else b"", known.rest]
        for name in known.sent:
            blob = outputs[name].tobytes()
            parts.append(_RAW_OUTPUT_TAG + _varint(len(blob)))
            parts.append(blob)
        self.answers_remembered += 1
        return b"".join(parts)

    def learn_answer(
        self, request: InferRequest, outputs: Mapping[str, Any], version: int, response: Any, data: bytes,
        tables: ModelTables,
    ) -> None:
        key = outputs_key([id(request.outputs), version], outputs)
        if key is None or (request.outputs is not None and any(
            out.shm_region is not None or out.classification for out in request.outputs
        )):
            return
        sent = tuple(tensor.name for tensor in response.outputs)
        for name in sent:
            value, dt = outputs[name], tables.output_types.get(name)
            if dt is None or value.dtype != dt.numpy or not wire_outputs.copied_whole(dt, value.nbytes):
                return
        head = _without_raw(data, response.raw_output_contents, _RAW_OUTPUT_TAG)
        split = _split_at_id(head, response.model_name, response.model_version, response.id) if head else None
        if split is None:
            return
        if len(self._answers) >= _CACHE_SIZE:
            self._answers.clear()
        self._answers[key] = _Answer(request.outputs, split[0], split[1], sent)


@dataclasses.dataclass(frozen=True, slots=True)
class GrpcModelTables(ModelTables):
    """What gRPC's infer path needs of one served model version, made once: its lookup
    tables (ModelTables) and the memo of its repeated requests and answers."""

    memo: InferMemo

    @classmethod
    def for_config(cls, config: ModelConfig) -> GrpcModelTables:
        return cls(**ModelTables.fields_for(config), memo=InferMemo())  # type: ignore[arg-type]
