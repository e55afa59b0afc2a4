"""The main process's end of a worker's link with gRPC (GrpcWorkerLink, RelayedConnection)
and a real model and gRPC server behind it: relayed calls are answered by the server's own
service (responses, statuses, streams), a relayed ModelInfer announces its model, and a
decoded gRPC request's error goes back as a gRPC status."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from nereid.frontends.arena import Arena
from nereid.frontends.grpc_link import GrpcWorkerLink
from nereid.frontends.layout import write_arrays
from nereid.frontends.messages import Kind, frame
from nereid.grpc.native import NativeGrpcServer
from nereid.grpc.service import InferenceService
from nereid.tensors.shared_memory import SharedMemoryManager
from tests.unit.frontends.test_link import Worker, served_double
from tests.unit.manual_clock import next_turn

_PATH = b"/inference.GRPCInferenceService/"
_TEMPLATE = (1, None, (), 0, None, True, (("X", 0, "<f4", (1, 2)),))


def _headers(method: str) -> dict[bytes, bytes]:
    return {b":path": _PATH + method.encode(), b"content-type": b"application/grpc"}


def _infer_request(values: list[float], model: str = "double") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[1, 2])
    assert tensor is not None
    request.raw_input_contents.append(np.array([values], np.float32).tobytes())
    return request.SerializeToString()


async def _linked(tmp_path: Path, delay_us: int = 0, policy: str = "") -> AsyncIterator[tuple[GrpcWorkerLink, Worker, Arena]]:
    async with served_double(tmp_path, delay_us, policy) as (server, app):
        shm = SharedMemoryManager()
        grpc_server = NativeGrpcServer(InferenceService(server.manager, server.options, shm), server.options)
        arena = Arena.create(64 * 1024)
        worker = Worker()
        link = GrpcWorkerLink(app, arena, {}, 0, grpc_server)  # type: ignore[arg-type]
        link.connection_made(worker)
        try:
            yield link, worker, arena
        finally:
            link.close()
            shm.close()


def _relay(id: int, method: str, *messages: bytes, end: bool = True, model: str | None = None) -> bytes:
    parts: list[tuple[Any, ...]] = [(Kind.GRPC_OPEN.value, id, _headers(method))]
    parts += [(Kind.GRPC_MESSAGE.value, id, message) for message in messages]
    if end:
        parts.append((Kind.GRPC_END.value, id, model))
    return frame(*parts)


def run(scenario: Any) -> None:
    asyncio.run(scenario)


def test_a_relayed_model_infer_is_answered_by_the_servers_service_and_announces_its_model(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, _ in _linked(tmp_path):
            link.data_received(_relay(1, "ModelInfer", _infer_request([1.0, -2.0]), model="double"))
            (respond,) = await worker.wait_for(Kind.GRPC_RESPOND)
            response = service_pb2.ModelInferResponse.FromString(respond[2])
            assert respond[1] == 1 and response.model_name == "double"
            assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [2.0, -4.0]
            (model,) = await worker.wait_for(Kind.MODEL)
            assert model[1] == "double"
            assert link.requests == 1 and not link.relay.streams

    run(scenario())


def test_relayed_calls_end_with_the_servers_own_statuses(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, _ in _linked(tmp_path):
            link.data_received(_relay(1, "NoSuchMethod", b""))
            link.data_received(_relay(2, "ModelInfer", _infer_request([1.0, 2.0], model="missing"), model="missing"))
            link.data_received(_relay(3, "ModelMetadata", b"\xff\xff"))
            finished = {message[1]: message[2:] for message in await worker.wait_for(Kind.GRPC_FINISH, 3)}
            assert finished == {
                1: (12, f"Method not found: {(_PATH + b'NoSuchMethod').decode()}"),
                2: (5, "Request for unknown model: 'missing' is not found"),
                3: (13, "Unable to parse request"),
            }

    run(scenario())


def test_a_relayed_stream_takes_each_message_and_answers_each(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, _ in _linked(tmp_path):
            link.data_received(_relay(1, "ModelStreamInfer", _infer_request([1.0, 1.0]), end=False))
            link.data_received(frame((Kind.GRPC_MESSAGE.value, 1, _infer_request([3.0, 3.0]))))
            sent = await worker.wait_for(Kind.GRPC_SEND, 2)
            values = sorted(np.frombuffer(service_pb2.ModelStreamInferResponse.FromString(message[2])
                                          .infer_response.raw_output_contents[0], np.float32).tolist() for message in sent)
            assert values == [[2.0, 2.0], [6.0, 6.0]]
            assert [message[1] for message in worker.of(Kind.GRPC_TAKEN)] == [1, 1]
            link.data_received(frame((Kind.GRPC_END.value, 1, None)))
            (finish,) = await worker.wait_for(Kind.GRPC_FINISH)
            assert finish[1:] == (1, 0, "")

    run(scenario())


def test_a_reset_relayed_call_is_withdrawn_and_answers_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, _ in _linked(tmp_path, delay_us=10_000_000, policy="preferred_batch_size = [8]"):
            link.data_received(_relay(1, "ModelInfer", _infer_request([1.0, 2.0]), model="double"))
            await worker.wait_for(Kind.MODEL)
            assert 1 in link.relay.streams
            link.data_received(frame((Kind.GRPC_RESET.value, 1)))
            assert not link.relay.streams
            await next_turn()
            assert not worker.of(Kind.GRPC_RESPOND) and not worker.of(Kind.GRPC_FINISH)

    run(scenario())


@pytest.mark.parametrize("grpc", [True, False], ids=["grpc", "http"])
def test_a_decoded_requests_error_goes_back_in_its_own_protocol(tmp_path: Path, grpc: bool) -> None:
    policy = "\n[dynamic_batching.default_queue_policy]\nmax_queue_size = 1\n"

    async def scenario() -> None:
        async for link, worker, arena in _linked(tmp_path, delay_us=10_000_000, policy=policy):
            link.data_received(frame((Kind.INFER.value, 0, "double", None, (None, None, None), 0, -1, 0, b"")))
            token = (await worker.wait_for(Kind.MODEL))[0][2]
            messages = []
            for id in (1, 2):
                write_arrays(arena.requests[64 * id:64 * id + 64], {"X": np.array([[id, id]], np.float32)})
                message: tuple[Any, ...] = (Kind.DECODED.value, id, token, 0, _TEMPLATE if id == 1 else None, 64 * id,
                                            "", 0)
                messages.append(message + (True,) if grpc else message)
            link.data_received(frame(*messages))
            if grpc:
                (finish,) = await worker.wait_for(Kind.GRPC_FINISH)
                assert finish[1:3] == (2, 14) and "Exceeds maximum queue size" in finish[3]
            else:
                (answer,) = await worker.wait_for(Kind.ANSWER)
                assert answer[1:3] == (2, 503) and b"Exceeds maximum queue size" in answer[6]

    run(scenario())


def test_a_relayed_streams_writer_waits_for_the_workers_credit_and_its_end_releases_it() -> None:
    from nereid.frontends.grpc_link import RelayedConnection
    from nereid.frontends.send_windows import SendWindows
    from nereid.grpc.h2.stream import GrpcStream

    async def scenario() -> None:
        sent: list[tuple[Any, ...]] = []
        link: Any = SimpleNamespace(windows=SendWindows(per_stream=4, whole=100), send=sent.append, index=0)
        relay = RelayedConnection(None, link)  # type: ignore[arg-type]
        streams = []
        for id in (1, 2):
            stream = GrpcStream(id, {}, 0, 0)
            stream.handler = SimpleNamespace(reset=lambda *args: None)
            relay.streams[id] = stream
            streams.append(stream)
        relay.send_message(streams[0], b"abcde")  # past the stream's window (4 bytes here)
        writer = asyncio.ensure_future(relay.writable(streams[0]))
        await next_turn()
        assert not writer.done()
        await relay.writable(streams[1])  # another stream goes on
        link.windows.returned(1, 5)  # the worker's CREDIT: its client took them
        await next_turn()
        assert writer.done()
        relay.send_message(streams[0], b"fghij")
        relay.send_message(streams[1], b"klmno")
        writers = [asyncio.ensure_future(relay.writable(stream)) for stream in streams]
        await next_turn()
        assert not any(writer.done() for writer in writers)
        relay.reset(1)  # the client reset it
        relay.finish(streams[1], 0, "")  # ended
        await asyncio.gather(*writers)
        assert link.windows.total == 0
        assert [message[0] for message in sent] == [Kind.GRPC_SEND] * 3 + [Kind.GRPC_FINISH]

    asyncio.run(scenario())
