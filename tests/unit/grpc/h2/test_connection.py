"""GrpcConnection (nereid's HTTP/2 for gRPC) driven by h2's client on a fake transport:
framing, flow control, the header-block cache, and the calls it reports."""

from __future__ import annotations

import asyncio
import gzip
import struct
import zlib
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest

from nereid.grpc.h2.limits import TransportLimits
from nereid.network.request_budget import RequestBudget
from nereid.grpc.h2.connection import (
    MAX_CONCURRENT_STREAMS,
    STREAM_HIGH_WATER,
    GrpcConnection,
    GrpcStream,
    Keepalive,
    PingPolicy,
    Status,
)
from tests.unit.manual_clock import next_turn, until

PATH = "/inference.GRPCInferenceService/ModelInfer"


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True
        self.scheduled: list[Any] = []

    def schedule(self, callback: Any) -> None:
        """The connection's ``call_soon``: run by ``run_scheduled``."""
        self.scheduled.append(callback)

    def run_scheduled(self) -> None:
        while self.scheduled:
            self.scheduled.pop(0)()

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class RecordingCalls:
    """Calls that remember what the connection told them; ``on_end`` answers."""

    def __init__(self, max_message_size: int = 1 << 20, pings: PingPolicy = PingPolicy(),
                 limits: TransportLimits = TransportLimits(), budget: RequestBudget | None = None) -> None:
        self.max_message_size = max_message_size
        self.pings = pings
        self.limits = limits
        self.budget = budget if budget is not None else RequestBudget(1 << 30)
        self.now = 0.0
        #: work handed off the loop, run by ``run_offloaded`` (or at once when ``offload_now``)
        self.offloaded: list[tuple[Any, Any]] = []
        self.offload_now = True
        self.events: list[tuple[str, int, Any]] = []
        self.messages: dict[int, list[bytes]] = {}
        self.on_end: Any = None
        self.closed_connections = 0
        self.routes: dict[bytes, Any] = {}

    def open(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        self.events.append(("open", stream.id, stream.headers))
        self.messages[stream.id] = []

    def message(self, connection: GrpcConnection, stream: GrpcStream, data: bytes) -> None:
        self.events.append(("message", stream.id, data))
        self.messages[stream.id].append(data)

    def end(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        self.events.append(("end", stream.id, None))
        if self.on_end is not None:
            self.on_end(connection, stream)

    def reset(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        self.events.append(("reset", stream.id, None))

    def closed(self, connection: GrpcConnection) -> None:
        self.closed_connections += 1

    def offload(self, work: Any, done: Any) -> None:
        self.offloaded.append((work, done))
        if self.offload_now:
            self.run_offloaded()

    def run_offloaded(self) -> None:
        while self.offloaded:
            work, done = self.offloaded.pop(0)
            done(work())


class Client:
    """h2's client connection wired to a GrpcConnection through a fake transport."""

    def __init__(self, calls: RecordingCalls, settings: dict[int, int] | None = None) -> None:
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        if settings:
            self.h2.update_settings(settings)
        self.transport = FakeTransport()
        self.server = connect(calls, self.transport)
        self.events: list[Any] = []
        self.pump()

    def pump(self, split: int | None = None) -> list[Any]:
        """Move bytes both ways until quiet; ``split`` feeds the server that many bytes at a time."""
        new: list[Any] = []
        for _ in range(50):
            outgoing = self.h2.data_to_send()
            self.transport.run_scheduled()
            incoming = bytes(self.transport.written)
            self.transport.written.clear()
            if not outgoing and not incoming:
                break
            if outgoing:
                step = split or len(outgoing)
                for offset in range(0, len(outgoing), step):
                    self.server.data_received(outgoing[offset:offset + step])
            if incoming:
                try:
                    new += self.h2.receive_data(incoming)
                except Exception:
                    raise
        self.events += new
        return new

    def call(self, payload: bytes, *, path: str = PATH, headers: list[tuple[str, str]] = (), end: bool = True,
             compressed: bool = False) -> int:  # type: ignore[assignment]
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, [
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
            ("content-type", "application/grpc"), ("te", "trailers"), *headers,
        ])
        if payload is not None:
            self.h2.send_data(stream_id, grpc_message(payload, compressed), end_stream=end)
        return stream_id

    def responses(self, stream_id: int) -> tuple[list[dict[bytes, bytes]], bytes, bool]:
        """(header blocks, data, ended) the client received on a stream."""
        blocks, data, ended = [], b"", False
        for event in self.events:
            if getattr(event, "stream_id", None) != stream_id:
                continue
            if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                blocks.append(dict(event.headers))
            elif isinstance(event, h2.events.DataReceived):
                data += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                ended = True
        return blocks, data, ended


def connect(calls: RecordingCalls, transport: FakeTransport) -> GrpcConnection:
    server = GrpcConnection(calls, schedule=transport.schedule)
    server.connection_made(transport)
    return server


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BL", int(compressed), len(payload)) + payload


def answer_with(reply: bytes) -> Any:
    def on_end(connection: GrpcConnection, stream: GrpcStream) -> None:
        connection.respond(stream, reply)

    return on_end


def test_a_unary_call_is_answered_with_headers_one_message_and_ok_trailers() -> None:
    calls = RecordingCalls()
    calls.on_end = answer_with(b"pong")
    client = Client(calls)
    stream_id = client.call(b"ping")
    client.pump()
    assert [kind for kind, _, _ in calls.events] == ["open", "message", "end"]
    assert calls.events[0][2][b":path"] == PATH.encode()
    assert calls.messages[stream_id] == [b"ping"]
    blocks, data, ended = client.responses(stream_id)
    assert blocks[0][b":status"] == b"200" and blocks[0][b"content-type"] == b"application/grpc"
    assert blocks[1] == {b"grpc-status": b"0"}
    assert data == grpc_message(b"pong") and ended
    assert not client.server.streams


@pytest.mark.parametrize("split", [1, 7, 4096])
def test_frames_and_messages_split_anywhere_arrive_whole(split: int) -> None:
    calls = RecordingCalls()
    client = Client(calls)
    stream_id = client.h2.get_next_available_stream_id()
    client.h2.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":path", PATH),
                                       (":authority", "x"), ("content-type", "application/grpc")])
    wire = grpc_message(b"a" * 10) + grpc_message(b"") + grpc_message(b"b" * 70000)
    for offset in range(0, len(wire), 5000):
        client.h2.send_data(stream_id, wire[offset:offset + 5000])
    client.h2.end_stream(stream_id)
    client.pump(split=split)
    assert calls.messages[stream_id] == [b"a" * 10, b"", b"b" * 70000]
    assert calls.events[-1] == ("end", stream_id, None)


def test_a_response_larger_than_the_clients_window_waits_for_window_updates() -> None:
    calls = RecordingCalls()
    big = bytes(range(256)) * 1000  # 256 kB, past the default 64 KiB windows
    calls.on_end = answer_with(big)
    client = Client(calls)
    stream_id = client.call(b"x")
    client.pump()
    blocks, data, ended = client.responses(stream_id)
    assert len(data) < len(big) and not ended  # held back by the window
    for _ in range(20):  # the client acknowledges what it read (responses() did), and the rest flows
        client.pump()
        blocks, data, ended = client.responses(stream_id)
        if ended:
            break
    assert data == grpc_message(big) and ended
    assert blocks[-1] == {b"grpc-status": b"0"}


def test_a_larger_initial_window_from_the_client_lets_the_answer_out_at_once() -> None:
    calls = RecordingCalls()
    calls.on_end = answer_with(b"z" * 200_000)
    client = Client(calls, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    client.h2.increment_flow_control_window(1 << 20)
    stream_id = client.call(b"x")
    client.pump()
    _, data, ended = client.responses(stream_id)
    assert ended and data == grpc_message(b"z" * 200_000)


def test_compressed_messages_are_inflated_and_an_unknown_encoding_is_unimplemented() -> None:
    calls = RecordingCalls()
    client = Client(calls)
    first = client.call(gzip.compress(b"hello"), headers=[("grpc-encoding", "gzip")], compressed=True)
    second = client.call(zlib.compress(b"world"), headers=[("grpc-encoding", "deflate")], compressed=True)
    third = client.call(b"x", headers=[("grpc-encoding", "snappy")], compressed=True)
    client.pump()
    assert calls.messages[first] == [b"hello"] and calls.messages[second] == [b"world"]
    blocks, _, ended = client.responses(third)
    assert ended and blocks[0][b"grpc-status"] == str(Status.UNIMPLEMENTED).encode()
    assert b"snappy" in blocks[0][b"grpc-message"] and third not in calls.messages


def test_a_message_over_the_limit_is_resource_exhausted_and_the_connection_goes_on() -> None:
    calls = RecordingCalls(max_message_size=100)
    calls.on_end = answer_with(b"ok")
    client = Client(calls)
    big = client.call(b"x" * 101)
    small = client.call(b"x" * 100)
    client.pump()
    blocks, _, ended = client.responses(big)
    assert blocks[0][b"grpc-status"] == str(Status.RESOURCE_EXHAUSTED).encode()
    assert b"larger than max (101 vs. 100)" in blocks[0][b"grpc-message"]
    assert ("reset", big, None) in calls.events
    _, data, ended = client.responses(small)
    assert data == grpc_message(b"ok") and ended


def test_a_gzip_bomb_is_refused_at_the_limit() -> None:
    calls = RecordingCalls(max_message_size=1000)
    client = Client(calls)
    stream_id = client.call(gzip.compress(b"\0" * 100_000), headers=[("grpc-encoding", "gzip")], compressed=True)
    client.pump()
    blocks, _, _ = client.responses(stream_id)
    assert blocks[0][b"grpc-status"] == str(Status.RESOURCE_EXHAUSTED).encode()
    assert b"larger than max (inflated past 1000 bytes, --grpc-max-message-size)" in blocks[0][b"grpc-message"]


def test_error_trailers_are_trailers_only_and_percent_encoded() -> None:
    calls = RecordingCalls()
    calls.on_end = lambda connection, stream: connection.finish(stream, Status.INVALID_ARGUMENT, "bad 'x' 100% ünï")
    client = Client(calls)
    stream_id = client.call(b"x")
    client.pump()
    blocks, data, ended = client.responses(stream_id)
    assert len(blocks) == 1 and ended and not data
    assert blocks[0][b":status"] == b"200" and blocks[0][b"grpc-status"] == b"3"
    assert blocks[0][b"grpc-message"] == b"bad 'x' 100%25 %C3%BCn%C3%AF"


def test_a_client_reset_reaches_the_calls_and_late_data_is_dropped() -> None:
    calls = RecordingCalls()
    client = Client(calls)
    stream_id = client.call(b"x", end=False)
    client.pump()
    client.h2.reset_stream(stream_id)
    client.pump()
    assert calls.events[-1] == ("reset", stream_id, None)
    assert not client.server.streams


def test_streaming_messages_go_out_as_they_come_then_the_status() -> None:
    calls = RecordingCalls()
    client = Client(calls)
    stream_id = client.call(b"one", end=False)
    client.pump()
    stream = client.server.streams[stream_id]
    client.server.send_message(stream, b"r1")
    client.server.send_message(stream, b"r2")
    client.pump()
    _, data, ended = client.responses(stream_id)
    assert data == grpc_message(b"r1") + grpc_message(b"r2") and not ended
    client.h2.end_stream(stream_id)
    client.pump()
    client.server.finish(stream, Status.OK, "")
    client.pump()
    blocks, _, ended = client.responses(stream_id)
    assert ended and blocks[-1] == {b"grpc-status": b"0"}


def test_a_streaming_writer_waits_past_the_high_water_mark_until_the_client_reads() -> None:
    import asyncio

    calls = RecordingCalls()
    client = Client(calls)
    stream_id = client.call(b"one", end=False)
    client.pump()
    stream = client.server.streams[stream_id]

    async def main() -> None:
        client.server.send_message(stream, b"x" * (STREAM_HIGH_WATER + 100_000))
        waiting = asyncio.ensure_future(client.server.writable(stream))
        await next_turn()
        assert not waiting.done()
        for _ in range(200):
            client.pump()
            client.responses(stream_id)  # reads and acknowledges
            await next_turn()
            if waiting.done():
                break
        assert waiting.done()

    asyncio.run(main())


def test_pings_are_answered_and_a_ping_ack_clears_ours() -> None:
    client = Client(RecordingCalls())
    client.h2.ping(b"12345678")
    events = client.pump()
    assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678" for e in events)
    client.server.ping(1.0)
    assert client.server.ping_sent_at == 1.0
    client.pump()
    assert client.server.ping_sent_at is None


def test_headers_in_continuation_frames_are_assembled() -> None:
    calls = RecordingCalls(limits=TransportLimits(max_header_list=64 << 10))
    calls.on_end = answer_with(b"ok")
    client = Client(calls)
    stream_id = client.call(b"x", headers=[("x-big", "v" * 40000)])  # past one 16 KiB frame
    client.pump()
    assert calls.events[0][2][b"x-big"] == b"v" * 40000
    _, data, ended = client.responses(stream_id)
    assert ended and data == grpc_message(b"ok")


def test_not_http2_is_refused_with_goaway_and_a_close() -> None:
    calls = RecordingCalls()
    transport = FakeTransport()
    server = connect(calls, transport)
    server.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert transport.closed
    assert b"preface" in bytes(transport.written)


def test_go_away_lets_calls_in_flight_finish_then_closes() -> None:
    calls = RecordingCalls()
    client = Client(calls)
    stream_id = client.call(b"x")
    client.pump()
    client.server.go_away()
    events = client.pump()
    assert any(isinstance(e, h2.events.ConnectionTerminated) for e in events)
    assert not client.transport.closed
    client.server.respond(client.server.streams[stream_id], b"done")
    assert client.transport.closed
    assert grpc_message(b"done") in client.transport.written  # sent before the close


def test_a_repeated_header_block_is_taken_from_the_cache() -> None:
    calls = RecordingCalls()
    calls.on_end = answer_with(b"ok")
    client = Client(calls)
    decodes = 0
    real = client.server._blocks._decoder.decode

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal decodes
        decodes += 1
        return real(*args, **kwargs)

    client.server._blocks._decoder.decode = counting  # type: ignore[method-assign]
    for _ in range(5):
        client.call(b"x")
        client.pump()
    # h2 indexes the fields on the first call; from the second on the blocks are identical
    assert decodes == 2
    assert len({id(headers) for kind, _, headers in calls.events if kind == "open"}) == 2


def test_pings_too_often_without_data_are_struck_then_the_connection_is_told_to_calm_down() -> None:
    calls = RecordingCalls(pings=PingPolicy(min_interval=10.0, max_strikes=2, without_calls=True))
    calls.on_end = answer_with(b"ok")
    client = Client(calls)
    for at in (0.0, 10.0, 20.0):  # far enough apart: no strike
        calls.now = at
        client.h2.ping(b"00000000")
        client.pump()
    assert not client.transport.closed
    for _ in range(2):  # early: two strikes, forgiven
        client.h2.ping(b"00000000")
        client.pump()
    client.call(b"x")  # an answer (HEADERS and DATA) clears the strikes and the last ping
    client.pump()
    for _ in range(3):  # the first sets the reference, the next two are strikes 1 and 2
        client.h2.ping(b"00000000")
        client.pump()
    assert not client.transport.closed
    client.h2.ping(b"00000000")  # strike 3 since the answer
    events = client.pump()
    closed = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert closed and closed[0].error_code == 11 and closed[0].additional_data == b"too_many_pings"
    assert client.transport.closed


def test_without_calls_the_allowed_ping_interval_is_two_hours() -> None:
    calls = RecordingCalls(pings=PingPolicy(min_interval=10.0, max_strikes=1, without_calls=False))
    client = Client(calls)
    for at in (0.0, 100.0, 200.0):  # past 10 s, but under 2 h with no call open
        calls.now = at
        client.h2.ping(b"00000000")
        client.pump()
    assert client.transport.closed


def test_what_a_client_sends_marks_when_it_was_last_heard() -> None:
    calls = RecordingCalls()
    client = Client(calls)
    calls.now = 42.0
    client.h2.ping(b"00000000")
    client.pump()
    assert client.server.last_heard == 42.0


def test_a_quiet_connection_is_pinged_and_closed_when_the_ping_is_not_answered() -> None:
    client = Client(RecordingCalls())
    server = client.server
    keepalive = Keepalive(time=10.0, timeout=5.0, without_calls=True)
    client.transport.written.clear()
    server.tick(9.0, keepalive)
    assert server.ping_sent_at is None
    server.tick(10.0, keepalive)
    client.transport.run_scheduled()
    assert server.ping_sent_at == 10.0
    assert bytes(client.transport.written) == struct.pack(">BHBBL", 0, 8, 6, 0, 0) + b"nereid\x00\x00"
    server.tick(14.0, keepalive)
    assert not client.transport.closed
    server.tick(15.0, keepalive)
    assert client.transport.closed


def test_an_answered_keepalive_ping_is_forgotten() -> None:
    client = Client(RecordingCalls())
    client.server.tick(10.0, Keepalive(time=10.0, timeout=5.0, without_calls=True))
    client.pump()  # h2's client acknowledges the PING
    assert client.server.ping_sent_at is None
    client.server.tick(15.0, Keepalive(time=100.0, timeout=5.0, without_calls=True))
    assert not client.transport.closed


def test_the_native_server_reads_its_keepalive_from_the_options() -> None:
    from nereid.grpc.native import NativeGrpcServer
    from nereid.options import ServerOptions

    class Service:
        class infer:  # noqa: N801  # ModelInfer: its start is taken, not called
            start = None

        def __getattr__(self, name: str) -> Any:
            return lambda request, context: None

    server = NativeGrpcServer(Service(), ServerOptions(  # type: ignore[arg-type]
        grpc_keepalive_time=10_000, grpc_keepalive_timeout=5_000, grpc_keepalive_permit_without_calls=True,
    ))
    assert server.keepalive == Keepalive(time=10.0, timeout=5.0, without_calls=True)


def test_streams_past_the_advertised_limit_are_refused_and_the_others_go_on() -> None:
    calls = RecordingCalls()
    client = Client(calls)
    assert client.h2.remote_settings.max_concurrent_streams == MAX_CONCURRENT_STREAMS
    for _ in range(MAX_CONCURRENT_STREAMS):
        client.call(b"x", end=False)
    client.pump()
    assert len(client.server.streams) == MAX_CONCURRENT_STREAMS
    # a client that ignores the setting opens one more (written by hand: h2 would not)
    from nereid.grpc.h2.frames import literal

    block = b"\x83\x86" + literal(b":path", PATH.encode()) + literal(b":authority", b"x")  # POST, http
    stream_id = 2 * MAX_CONCURRENT_STREAMS + 1
    client.transport.written.clear()
    client.server.data_received(struct.pack(">BHBBL", 0, len(block), 1, 0x4, stream_id) + block)
    client.transport.run_scheduled()
    assert bytes(client.transport.written) == struct.pack(">BHBBL", 0, 4, 3, 0, stream_id) + struct.pack(">L", 7)
    assert len(client.server.streams) == MAX_CONCURRENT_STREAMS  # REFUSED_STREAM; the others stay open


def test_a_routed_path_goes_to_its_handler_and_every_other_to_the_calls() -> None:
    calls, routed = RecordingCalls(), RecordingCalls()
    calls.routes = {PATH.encode(): routed}
    routed.on_end = answer_with(b"routed")
    calls.on_end = answer_with(b"general")
    client = Client(calls)
    first = client.call(b"a")
    second = client.call(b"b", path="/inference.GRPCInferenceService/ServerLive")
    client.pump()
    assert [(kind, stream) for kind, stream, _ in routed.events] == [("open", first), ("message", first), ("end", first)]
    assert [(kind, stream) for kind, stream, _ in calls.events] == [("open", second), ("message", second), ("end", second)]
    assert client.responses(first)[1] == grpc_message(b"routed")
    assert client.responses(second)[1] == grpc_message(b"general")


def test_a_call_past_its_grpc_timeout_is_reset_and_told_deadline_exceeded() -> None:
    async def scenario() -> None:
        calls = RecordingCalls()  # never answers
        client = Client(calls)
        late = client.call(b"x", headers=[("grpc-timeout", "1n")])
        in_time = client.call(b"y", headers=[("grpc-timeout", "100S")])
        client.pump()
        await until(lambda: ("reset", late, None) in calls.events)  # the 1 ns timer is due at once
        client.pump()
        assert ("reset", late, None) in calls.events and ("reset", in_time, None) not in calls.events
        blocks, _, ended = client.responses(late)
        assert ended and blocks[-1][b"grpc-status"] == str(Status.DEADLINE_EXCEEDED).encode()
        assert blocks[-1][b"grpc-message"] == b"Deadline Exceeded"
        deadline = client.server.streams[in_time].deadline
        assert deadline is not None
        client.server.respond(client.server.streams[in_time], b"done")
        assert deadline.cancelled()  # answered: its timer goes with the stream

    asyncio.run(scenario())


def test_a_grpc_timeout_that_does_not_parse_is_internal_and_the_call_never_opens() -> None:
    async def scenario() -> None:
        calls = RecordingCalls()
        client = Client(calls)
        stream_id = client.call(b"x", headers=[("grpc-timeout", "soon")])
        client.pump()
        assert not calls.events
        blocks, _, ended = client.responses(stream_id)
        assert ended and blocks[-1][b"grpc-status"] == str(Status.INTERNAL).encode()
        assert blocks[-1][b"grpc-message"] == b"Invalid grpc-timeout 'soon'"

    asyncio.run(scenario())
