"""perf/h2_grpc_connection.py (the h2-based candidate transport behind perf/serve_h2.py)
still speaks the interface NativeGrpcServer drives: swapped in for GrpcConnection the way
serve_h2.py does it, and fed by h2's client through a fake transport, it carries a unary
ModelInfer whose answer is larger than the client's first window, a streaming call, the
server's sweep, and GOAWAY to the end."""

from __future__ import annotations

import asyncio
import importlib.util
import struct
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import h2.config
import h2.connection
import h2.events
import pytest
from tritonclient.grpc import service_pb2

import nereid.grpc.native
from nereid.grpc.native import NativeGrpcServer
from nereid.options import ServerOptions
from tests.unit.manual_clock import next_turn

_CANDIDATE = Path(__file__).resolve().parents[4] / "perf" / "h2_grpc_connection.py"
_SERVICE = "/inference.GRPCInferenceService"
#: larger than h2's default window (65,535) and frame (16,384): the answer waits for WINDOW_UPDATEs
_ANSWER_SIZE = 200_000


def _candidate_class() -> type:
    spec = importlib.util.spec_from_file_location("h2_grpc_connection", _CANDIDATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.H2GrpcConnection  # type: ignore[no-any-return]


class _Ticket:
    def withdraw(self) -> None:
        pass


class _Infer:
    """ModelInfer: an answer whose one output holds ``int(request.id)`` bytes."""

    @staticmethod
    def start(
        request: Any, received_ns: int, answer: Callable[[Any, BaseException | None], None], data: bytes | None = None,
    ) -> _Ticket:
        size = int(request.id)
        asyncio.get_running_loop().call_soon(answer, service_pb2.ModelInferResponse(
            model_name=request.model_name, id=request.id, raw_output_contents=[bytes(size)],
        ).SerializeToString(), None)
        return _Ticket()


class _Service:
    infer = _Infer()

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:  # noqa: N802
        async for request in requests:
            yield service_pb2.ModelStreamInferResponse(infer_response=service_pb2.ModelInferResponse(id=request.id))

    def __getattr__(self, name: str) -> Any:
        async def unused(request: Any, context: Any) -> Any:
            raise AssertionError(f"{name} was not expected")
        return unused


class _Transport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _message(payload: bytes) -> bytes:
    return struct.pack(">BL", 0, len(payload)) + payload


def _unframed(data: bytes) -> list[bytes]:
    messages, position = [], 0
    while position < len(data):
        _, size = struct.unpack_from(">BL", data, position)
        messages.append(data[position + 5:position + 5 + size])
        position += 5 + size
    return messages


async def _exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nereid.grpc.native, "GrpcConnection", _candidate_class())  # as perf/serve_h2.py does
    server = NativeGrpcServer(_Service(), ServerOptions())  # type: ignore[arg-type]
    connection: Any = server._connection()
    assert type(connection).__name__ == "H2GrpcConnection"
    transport = _Transport()
    connection.connection_made(transport)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    data: dict[int, bytearray] = {}
    trailers: dict[int, dict[bytes, bytes]] = {}
    goaway: list[h2.events.ConnectionTerminated] = []

    async def pump(done: Callable[[], bool]) -> None:
        for _ in range(500):
            outgoing = client.data_to_send()
            if outgoing:
                connection.data_received(outgoing)
            await next_turn()
            incoming, transport.written = bytes(transport.written), bytearray()
            for event in client.receive_data(incoming) if incoming else ():
                if isinstance(event, h2.events.DataReceived):
                    data.setdefault(event.stream_id, bytearray()).extend(event.data)
                    client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers[event.stream_id] = dict(event.headers)
                elif isinstance(event, h2.events.ConnectionTerminated):
                    goaway.append(event)
            if done():
                return
        raise AssertionError(f"no answer: data {[(k, len(v)) for k, v in data.items()]}, trailers {trailers}")

    def open_call(method: str) -> int:
        stream_id: int = client.get_next_available_stream_id()
        client.send_headers(stream_id, [
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", f"{_SERVICE}/{method}".encode()),
            (b":authority", b"localhost"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
        ])
        return stream_id

    unary = open_call("ModelInfer")
    request = service_pb2.ModelInferRequest(model_name="identity", id=str(_ANSWER_SIZE))
    client.send_data(unary, _message(request.SerializeToString()), end_stream=True)
    await pump(lambda: unary in trailers)
    assert trailers[unary][b"grpc-status"] == b"0"
    [answer] = _unframed(bytes(data[unary]))
    response = service_pb2.ModelInferResponse.FromString(answer)
    assert (response.model_name, len(response.raw_output_contents[0])) == ("identity", _ANSWER_SIZE)

    streaming = open_call("ModelStreamInfer")
    for index in range(3):
        client.send_data(streaming, _message(service_pb2.ModelInferRequest(id=f"s{index}").SerializeToString()))
    await pump(lambda: len(_unframed(bytes(data.get(streaming, b"")))) == 3)
    client.end_stream(streaming)
    await pump(lambda: streaming in trailers)
    assert trailers[streaming][b"grpc-status"] == b"0"
    ids = [service_pb2.ModelStreamInferResponse.FromString(m).infer_response.id for m in _unframed(bytes(data[streaming]))]
    assert ids == ["s0", "s1", "s2"]

    connection.tick(server.now, server.keepalive)  # the server's sweep: nothing due
    assert not transport.closed
    connection.go_away()  # shutdown: GOAWAY, and closed with no call open
    await pump(lambda: bool(goaway))
    assert goaway[0].error_code == 0 and transport.closed
    connection.connection_lost(None)
    assert connection not in server.connections


def test_the_h2_candidate_carries_unary_and_streaming_calls_for_the_native_server(monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(_exchange(monkeypatch))
