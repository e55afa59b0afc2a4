"""The worker's side of gRPC (GrpcMainLink, WorkerModelInfer, WorkerGrpcServer): what it
decodes, what it relays, and how the main process's answers reach the stream (a fake
transport in place of the socket pair, a recording connection in place of the client's)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from nereid.config.load import parse_model_config
from nereid.frontends.arena import Arena
from nereid.frontends.directory_sync import DirectoryCopy, SharedGeneration
from nereid.frontends.grpc_front import GrpcMainLink, WorkerGrpcServer
from nereid.frontends.layout import read_arrays, write_arrays
from nereid.frontends.messages import Kind, frame
from nereid.grpc.h2.stream import GrpcStream
from nereid.network.request_budget import RequestBudget
from nereid.options import ServerOptions
from tests.unit.frontends.test_forwarding import FakeTransport
from tests.unit.manual_clock import next_turn

CONFIG = parse_model_config(
    {
        "name": "acc",
        "max_batch_size": 4,
        "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [2]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [2]}],
    },
    source="config.toml",
    folder_name="acc",
)
_INFER = b"/inference.GRPCInferenceService/ModelInfer"


class Connection:
    """What the worker's calls do to the client's connection, recorded."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def respond(self, stream: GrpcStream, message: bytes) -> None:
        self.events.append(("respond", stream.id, message))

    def send_message(self, stream: GrpcStream, message: bytes) -> None:
        self.events.append(("send", stream.id, message))

    def finish(self, stream: GrpcStream, status: int, message: str) -> None:
        self.events.append(("finish", stream.id, status, message))

    def taken(self, stream: GrpcStream, size: int) -> None:
        self.events.append(("taken", stream.id, size))


def _request(values: list[int], model: str = "acc", version: str = "") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id="r")
    request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 2])
    request.raw_input_contents.append(np.array([values], np.int32).tobytes())
    return request.SerializeToString()


def run(test: Any, options: ServerOptions | None = None) -> None:
    async def main() -> None:
        arena = Arena.create(1 << 16)
        generation = SharedGeneration.create()
        link = GrpcMainLink(arena, DirectoryCopy(generation))
        transport = FakeTransport()
        link.connection_made(transport)
        server = WorkerGrpcServer(link, options or ServerOptions(), RequestBudget(1 << 30))
        try:
            await test(link, server, transport, arena)
        finally:
            arena.close()
            generation.close()

    asyncio.run(main())


def _call(server: WorkerGrpcServer, connection: Connection, id: int, path: bytes, *messages: bytes) -> GrpcStream:
    """A call as the connection hands it over: opened, its messages, its end."""
    stream = GrpcStream(id, {b":path": path}, 0, 0)
    handler = server.routes.get(path, server)
    stream.handler = handler
    handler.open(connection, stream)  # type: ignore[arg-type]
    for message in messages:
        handler.message(connection, stream, message)  # type: ignore[arg-type]
    handler.end(connection, stream)  # type: ignore[arg-type]
    return stream


def _announce(link: GrpcMainLink) -> None:
    link.data_received(frame((Kind.MODEL.value, "acc", 7, 1, CONFIG, {})))


def test_a_model_infer_for_a_model_not_announced_is_relayed_whole() -> None:
    async def test(link: GrpcMainLink, server: WorkerGrpcServer, transport: FakeTransport, arena: Arena) -> None:
        connection = Connection()
        data = _request([1, 2])
        _call(server, connection, 1, _INFER, data)
        await next_turn()
        (opened, message, end) = transport.sent
        id = opened[1]
        assert (opened[0], opened[2][b":path"]) == (Kind.GRPC_OPEN, _INFER)
        assert message == (Kind.GRPC_MESSAGE, id, data) and end == (Kind.GRPC_END, id, "acc")
        link.data_received(frame((Kind.GRPC_RESPOND.value, id, b"answer")))
        assert connection.events == [("respond", 1, b"answer")]

    run(test)


def test_an_announced_models_infer_is_decoded_here_and_its_outputs_encoded_here() -> None:
    async def test(link: GrpcMainLink, server: WorkerGrpcServer, transport: FakeTransport, arena: Arena) -> None:
        _announce(link)
        connection = Connection()
        _call(server, connection, 1, _INFER, _request([3, 4]))
        await next_turn()
        (decoded,) = transport.sent
        kind, id, token, number, template, offset, request_id, _, grpc = decoded
        assert (kind, token, number, request_id, grpc) == (Kind.DECODED, 7, 0, "r", True)
        assert read_arrays(arena.requests, offset, template[6])["INPUT"].tolist() == [[3, 4]]
        layout = write_arrays(arena.answers[0:64], {"OUTPUT": np.array([[6, 8]], np.int32)})
        link.data_received(frame((Kind.RESULT.value, id, 1, 0, layout, None)))
        ((event, stream_id, data),) = connection.events
        response = service_pb2.ModelInferResponse.FromString(data)
        assert (event, stream_id, response.model_name, response.model_version, response.id) == ("respond", 1, "acc", "1", "r")
        assert np.frombuffer(response.raw_output_contents[0], np.int32).tolist() == [6, 8]
        assert link.ring.blocks == 0

    run(test)


def test_what_the_worker_cannot_decode_is_relayed() -> None:
    async def test(link: GrpcMainLink, server: WorkerGrpcServer, transport: FakeTransport, arena: Arena) -> None:
        _announce(link)
        connection = Connection()
        _call(server, connection, 1, _INFER, _request([1, 2], version="1"))  # a version named
        _call(server, connection, 3, _INFER, _request([1, 2, 3]))  # a bad shape: the main process says what is wrong
        _call(server, connection, 5, _INFER, b"\xff\xff")  # not a ModelInferRequest
        await next_turn()
        assert [message[0] for message in transport.sent] == [Kind.GRPC_OPEN, Kind.GRPC_MESSAGE, Kind.GRPC_END] * 3

    run(test)


def test_a_decoded_requests_error_and_a_retry() -> None:
    async def test(link: GrpcMainLink, server: WorkerGrpcServer, transport: FakeTransport, arena: Arena) -> None:
        _announce(link)
        connection = Connection()
        data = _request([1, 2])
        _call(server, connection, 1, _INFER, data)
        _call(server, connection, 3, _INFER, data)
        await next_turn()
        first, second = (message[1] for message in transport.sent)
        transport.sent.clear()
        link.data_received(frame((Kind.GRPC_FINISH.value, first, 14, "Exceeds maximum queue size")))
        assert connection.events == [("finish", 1, 14, "Exceeds maximum queue size")]
        link.data_received(frame((Kind.RETRY.value, second)))  # its model changed: sent again whole
        await next_turn()
        assert [message[0] for message in transport.sent] == [Kind.GRPC_OPEN, Kind.GRPC_MESSAGE, Kind.GRPC_END]
        assert transport.sent[1][2] == data
        assert link.ring.blocks == 0

    run(test)


def test_a_reset_call_is_withdrawn_or_reset_in_the_main_process() -> None:
    async def test(link: GrpcMainLink, server: WorkerGrpcServer, transport: FakeTransport, arena: Arena) -> None:
        connection = Connection()
        relayed = _call(server, connection, 1, b"/inference.GRPCInferenceService/ModelMetadata", b"")
        _announce(link)
        decoded = _call(server, connection, 3, _INFER, _request([1, 2]))
        await next_turn()
        transport.sent.clear()
        relayed.handler.reset(connection, relayed)
        decoded.handler.reset(connection, decoded)
        await next_turn()
        assert [message[0] for message in transport.sent] == [Kind.GRPC_RESET, Kind.WITHDRAW]
        link.data_received(frame((Kind.DONE.value, transport.sent[1][1])))
        assert link.ring.blocks == 0 and not connection.events

    run(test)


def test_a_stream_holds_its_messages_until_the_main_process_takes_them() -> None:
    async def test(link: GrpcMainLink, server: WorkerGrpcServer, transport: FakeTransport, arena: Arena) -> None:
        connection = Connection()
        stream = GrpcStream(1, {b":path": b"/inference.GRPCInferenceService/ModelStreamInfer"}, 0, 0)
        server.open(connection, stream)  # type: ignore[arg-type]
        assert stream.streaming
        server.message(connection, stream, b"one")  # type: ignore[arg-type]
        await next_turn()
        id = transport.sent[0][1]
        link.data_received(frame((Kind.GRPC_TAKEN.value, id, 3), (Kind.GRPC_SEND.value, id, b"out"),
                                 (Kind.GRPC_FINISH.value, id, 0, "")))
        assert connection.events == [("taken", 1, 3), ("send", 1, b"out"), ("finish", 1, 0, "")]

    run(test)


def test_the_main_process_gone_ends_every_call_unavailable() -> None:
    async def test(link: GrpcMainLink, server: WorkerGrpcServer, transport: FakeTransport, arena: Arena) -> None:
        connection = Connection()
        _call(server, connection, 1, b"/inference.GRPCInferenceService/ServerLive", b"")
        link.connection_lost(None)
        _call(server, connection, 3, _INFER, _request([1, 2]))
        message = "the server's main process is gone (it is restarting or stopping)"
        assert connection.events == [("finish", 1, 14, message), ("finish", 3, 14, message)]

    run(test)


def test_a_restricted_model_infer_is_relayed_for_the_main_process_to_check() -> None:
    from nereid.network.access import parse_restriction

    async def test(link: GrpcMainLink, server: WorkerGrpcServer, transport: FakeTransport, arena: Arena) -> None:
        assert not server.routes  # no ModelInfer decoded here: every call relayed

    run(test, ServerOptions(grpc_restricted_protocol=(parse_restriction("inference:key=value"),)))


class SlowConnection(Connection):
    """A client connection whose window holds what is sent until ``read`` lets it out."""

    def __init__(self) -> None:
        super().__init__()
        self.drained = asyncio.Event()

    def send_message(self, stream: GrpcStream, message: bytes) -> None:
        super().send_message(stream, message)
        stream.pending_bytes += len(message) + 5

    def read(self, stream: GrpcStream) -> None:
        stream.pending_bytes = 0
        self.drained.set()

    async def writable(self, stream: GrpcStream, high_water: int | None = None) -> None:
        assert high_water == 0  # every byte out, not the engine's high-water mark
        while stream.pending_bytes > 0:
            self.drained.clear()
            await self.drained.wait()


def test_a_relayed_streams_answers_are_given_back_once_its_client_let_them_out() -> None:
    async def test(link: GrpcMainLink, server: WorkerGrpcServer, transport: FakeTransport, arena: Arena) -> None:
        fast, slow = Connection(), SlowConnection()
        streams = []
        for connection, number in ((fast, 1), (slow, 3)):
            stream = GrpcStream(number, {b":path": b"/inference.GRPCInferenceService/ModelStreamInfer"}, 0, 0)
            server.open(connection, stream)  # type: ignore[arg-type]
            streams.append(stream)
        await next_turn()
        fast_id, slow_id = (message[1] for message in transport.sent)
        link.data_received(frame((Kind.GRPC_SEND.value, fast_id, b"abc"), (Kind.GRPC_SEND.value, slow_id, b"defg"),
                                 (Kind.GRPC_SEND.value, slow_id, b"hi")))
        await next_turn()
        credits = [message for message in transport.sent if message[0] == Kind.CREDIT]
        assert credits == [(Kind.CREDIT, ((fast_id, 3),))]  # the slow client's window holds its answers
        slow.read(streams[1])
        await next_turn()
        await next_turn()
        credits = [message for message in transport.sent if message[0] == Kind.CREDIT]
        assert credits[1:] == [(Kind.CREDIT, ((slow_id, 6),))]
        link.data_received(frame((Kind.GRPC_SEND.value, slow_id, b"j"), (Kind.GRPC_FINISH.value, slow_id, 0, "")))
        await next_turn()
        await next_turn()
        assert [message for message in transport.sent if message[0] == Kind.CREDIT] == credits  # ended: nothing owed
        assert not link._draining


_STATISTICS = b"/inference.GRPCInferenceService/ModelStatistics"


def test_model_statistics_is_answered_here_from_the_shared_figures_or_relayed() -> None:
    from nereid.frontends.shared_stats import StatisticsCopy, StatsTable
    from nereid.models.directory import ModelFacts, VersionFacts
    from nereid.stats import ModelStats

    stats = ModelStats("acc", 1)
    stats.record_batch(2, 500, [10, 20], (1, 2, 3), None)

    async def main() -> None:
        arena, generation, table = Arena.create(1 << 16), SharedGeneration.create(), StatsTable.create()
        copy = DirectoryCopy(generation)
        facts = ModelFacts({1: VersionFacts(1, CONFIG, {}, None, True)}, frozenset({1}), "", {})
        copy.update(generation.read(), True, True, {"acc": facts}, True, {("acc", 1): 5})
        table.begin()
        table.write(5, -1, stats.counters())
        table.end()
        link = GrpcMainLink(arena, copy)
        transport = FakeTransport()
        link.connection_made(transport)
        server = WorkerGrpcServer(link, ServerOptions(), RequestBudget(1 << 30), statistics=StatisticsCopy(table, copy))
        connection = Connection()
        try:
            _call(server, connection, 1, _STATISTICS, service_pb2.ModelStatisticsRequest(name="acc").SerializeToString())
            _call(server, connection, 3, _STATISTICS, service_pb2.ModelStatisticsRequest(name="gone").SerializeToString())
            generation.bump()  # a change: this picture may be out of date
            asked = service_pb2.ModelStatisticsRequest(name="acc").SerializeToString()
            _call(server, connection, 5, _STATISTICS, asked)
            await next_turn()
            (answered, refused) = connection.events
            response = service_pb2.ModelStatisticsResponse.FromString(answered[2])
            assert answered[:2] == ("respond", 1)
            assert (response.model_stats[0].name, response.model_stats[0].version) == ("acc", "1")
            assert response.model_stats[0].inference_stats.success.count == 2
            assert response.model_stats[0].batch_stats[0].batch_size == 2
            assert refused == ("finish", 3, 3, "requested model 'gone' is not available")  # INVALID_ARGUMENT
            (opened, message, end) = transport.sent  # the third: relayed whole
            assert opened[2][b":path"] == _STATISTICS and message[2] == asked and end[0] == Kind.GRPC_END
        finally:
            arena.close()
            table.close()
            generation.close()

    asyncio.run(main())


def test_model_statistics_is_relayed_without_shared_figures_or_when_restricted() -> None:
    from nereid.frontends.shared_stats import StatisticsCopy, StatsTable
    from nereid.network.access import parse_restriction

    restricted = ServerOptions(grpc_restricted_protocol=(parse_restriction("statistics:key=value"),))

    async def test(link: GrpcMainLink, server: WorkerGrpcServer, transport: FakeTransport, arena: Arena) -> None:
        assert _STATISTICS not in server.routes  # no shared figures
        table = StatsTable.create()
        try:
            statistics = StatisticsCopy(table, link.directory)
            assert _STATISTICS in WorkerGrpcServer(link, ServerOptions(), RequestBudget(1), statistics=statistics).routes
            assert _STATISTICS not in WorkerGrpcServer(link, restricted, RequestBudget(1), statistics=statistics).routes
        finally:
            table.close()

    run(test)
