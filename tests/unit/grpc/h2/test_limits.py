"""GrpcConnection against hostile and broken peers, frame by frame: RFC 9113's answers
(connection errors as GOAWAY, stream errors as RST_STREAM), enforced windows, the
server-wide request budget, the allowances for cheap frames (GOAWAY ENHANCE_YOUR_CALM),
inflation off the loop, a streaming call's backlog, the timers, and answers larger than
one 64 KiB frame for a client that allows large frames."""

from __future__ import annotations

import gzip
import random
import struct
from typing import Any

import h2.settings
import hpack
import pytest

from nereid.grpc.h2.frames import PREFACE, ErrorCode, FrameType, literal
from nereid.grpc.h2.limits import TransportLimits
from nereid.grpc.h2.connection import ConnectionState, GrpcConnection, GrpcStream, Status
from nereid.network.request_budget import RequestBudget
from tests.unit.grpc.h2.test_connection import PATH, Client, FakeTransport, RecordingCalls, answer_with, grpc_message

HEAD = b"\x83\x86" + literal(b":path", PATH.encode()) + literal(b":authority", b"x")  # POST, http, path


def raw(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">BHBBL", len(payload) >> 16, len(payload) & 0xFFFF, kind, flags, stream_id) + payload


class Raw:
    """A peer that writes frames by hand (h2 would refuse to send most of these)."""

    def __init__(self, calls: RecordingCalls | None = None, settings: bytes = b"") -> None:
        self.calls = calls or RecordingCalls()
        self.transport = FakeTransport()
        self.server = GrpcConnection(self.calls, schedule=self.transport.schedule)
        self.server.connection_made(self.transport)
        self.send(PREFACE + raw(FrameType.SETTINGS, 0, 0, settings))
        self.frames()

    def send(self, data: bytes) -> None:
        self.server.data_received(data)

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """What the server wrote since the last look: (type, flags, stream, payload)."""
        self.transport.run_scheduled()
        data, out = bytes(self.transport.written), []
        self.transport.written.clear()
        position = 0
        while position + 9 <= len(data):
            high, low, kind, flags, stream_id = struct.unpack_from(">BHBBL", data, position)
            size = high << 16 | low
            out.append((kind, flags, stream_id, data[position + 9:position + 9 + size]))
            position += 9 + size
        return out

    def goaway(self) -> tuple[int, bytes] | None:
        for kind, _, _, payload in self.frames():
            if kind == FrameType.GOAWAY:
                return struct.unpack_from(">L", payload, 4)[0], payload[8:]
        return None

    def resets(self) -> dict[int, int]:
        return {stream: struct.unpack(">L", payload)[0] for kind, _, stream, payload in self.frames()
                if kind == FrameType.RST_STREAM}


# -- RFC 9113's answers --------------------------------------------------------------------

@pytest.mark.parametrize("frames, code, reason", [
    (raw(FrameType.PRIORITY, 0, 0, b"\0" * 5), ErrorCode.PROTOCOL_ERROR, b"PRIORITY on stream 0"),
    (raw(FrameType.SETTINGS, 1, 0, b"\0" * 6), ErrorCode.FRAME_SIZE_ERROR, b"SETTINGS ACK with a payload"),
    (raw(FrameType.SETTINGS, 0, 0, struct.pack(">HL", 2, 2)), ErrorCode.PROTOCOL_ERROR, b"ENABLE_PUSH of 2"),
    (raw(FrameType.GOAWAY, 0, 1, b"\0" * 8), ErrorCode.PROTOCOL_ERROR, b"GOAWAY on a stream"),
    (raw(FrameType.HEADERS, 4, 2, HEAD), ErrorCode.PROTOCOL_ERROR, b"HEADERS on stream 2"),
    (raw(FrameType.DATA, 0, 5, b"x"), ErrorCode.PROTOCOL_ERROR, b"DATA on idle stream 5"),
    (raw(FrameType.RST_STREAM, 0, 9, b"\0" * 4), ErrorCode.PROTOCOL_ERROR, b"RST_STREAM on idle stream 9"),
    (raw(FrameType.WINDOW_UPDATE, 0, 0, b"\0" * 4), ErrorCode.PROTOCOL_ERROR, b"WINDOW_UPDATE of 0"),
    (raw(FrameType.WINDOW_UPDATE, 0, 0, struct.pack(">L", 2**31 - 1)), ErrorCode.FLOW_CONTROL_ERROR, b"past 2^31-1"),
    (raw(FrameType.CONTINUATION, 4, 1, HEAD), ErrorCode.PROTOCOL_ERROR, b"unexpected CONTINUATION"),
    (raw(FrameType.PUSH_PROMISE, 4, 1, b"\0" * 4), ErrorCode.PROTOCOL_ERROR, b"may not push"),
    (raw(FrameType.DATA, 0, 1, b"x" * 16385), ErrorCode.FRAME_SIZE_ERROR, b"exceeds 16384"),
])
def test_connection_errors_are_goaway_with_the_code_rfc_9113_names(frames: bytes, code: int, reason: bytes) -> None:
    peer = Raw()
    peer.send(frames)
    goaway = peer.goaway()
    assert goaway is not None and goaway[0] == code and reason in goaway[1]
    assert peer.transport.closed


def test_a_preface_must_be_followed_by_settings() -> None:
    transport = FakeTransport()
    server = GrpcConnection(RecordingCalls(), schedule=transport.schedule)
    server.connection_made(transport)
    server.data_received(PREFACE + raw(FrameType.PING, 0, 0, b"\0" * 8))
    transport.run_scheduled()
    assert b"must end with SETTINGS" in bytes(transport.written) and transport.closed


def test_a_settings_change_past_the_largest_window_is_a_flow_control_error() -> None:
    peer = Raw()
    peer.send(raw(FrameType.HEADERS, 4, 1, HEAD))
    peer.send(raw(FrameType.WINDOW_UPDATE, 0, 1, struct.pack(">L", 2**31 - 1 - 65535)))
    peer.send(raw(FrameType.SETTINGS, 0, 0, struct.pack(">HL", 4, 65536)))
    assert peer.goaway() == (ErrorCode.FLOW_CONTROL_ERROR, b"a stream's window past 2^31-1")


@pytest.mark.parametrize("header", [b"X-Upper", b"connection"])
def test_a_malformed_request_is_a_stream_error_and_the_connection_goes_on(header: bytes) -> None:
    peer = Raw()
    peer.calls.on_end = answer_with(b"ok")
    peer.send(raw(FrameType.HEADERS, 4, 1, HEAD + literal(header, b"1")))
    assert peer.resets() == {1: ErrorCode.PROTOCOL_ERROR}
    peer.send(raw(FrameType.HEADERS, 4, 3, HEAD) + raw(FrameType.DATA, 1, 3, grpc_message(b"x")))
    assert any(kind == FrameType.DATA and stream == 3 for kind, _, stream, _ in peer.frames())
    assert not peer.transport.closed


def test_headers_on_a_stream_already_closed_are_a_stream_error() -> None:
    peer = Raw()
    peer.calls.on_end = answer_with(b"ok")
    peer.send(raw(FrameType.HEADERS, 4, 1, HEAD) + raw(FrameType.DATA, 1, 1, grpc_message(b"x")))
    peer.frames()
    peer.send(raw(FrameType.HEADERS, 5, 1, HEAD))
    assert peer.resets() == {1: ErrorCode.STREAM_CLOSED}
    assert not peer.transport.closed


def test_trailers_without_end_stream_are_a_stream_error() -> None:
    peer = Raw()
    peer.send(raw(FrameType.HEADERS, 4, 1, HEAD))
    peer.send(raw(FrameType.HEADERS, 4, 1, literal(b"x-trailer", b"1")))
    assert peer.resets() == {1: ErrorCode.PROTOCOL_ERROR}
    assert ("reset", 1, None) in peer.calls.events


# -- windows and the budget ------------------------------------------------------------------

class Streaming(RecordingCalls):
    """Calls that open every stream as a streaming call (messages held until taken)."""

    def open(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        super().open(connection, stream)
        stream.streaming = True


def send_in_frames(client: Client, stream_id: int, data: bytes, end: bool = False) -> None:
    for offset in range(0, len(data), 16384):
        client.h2.send_data(stream_id, data[offset:offset + 16384], end_stream=end and offset + 16384 >= len(data))


def test_data_past_a_streams_window_is_a_flow_control_error_for_that_stream() -> None:
    """A streaming call that has not taken its messages gets no window back; a peer that
    sends past what it was given is reset with FLOW_CONTROL_ERROR, and only that stream."""
    limits = TransportLimits(stream_window=65536, stream_backlog=1)
    peer = Raw(calls=Streaming(limits=limits))
    peer.send(raw(FrameType.HEADERS, 4, 1, HEAD) + raw(FrameType.HEADERS, 4, 3, HEAD))
    message = grpc_message(b"m" * 16379)  # one whole frame
    for _ in range(4):
        peer.send(raw(FrameType.DATA, 0, 1, message))
    assert not any(kind == FrameType.WINDOW_UPDATE and stream == 1 for kind, _, stream, _ in peer.frames())
    peer.send(raw(FrameType.DATA, 0, 1, grpc_message(b"x")))  # 4 x 16384 + 6 > 65536
    assert peer.resets() == {1: ErrorCode.FLOW_CONTROL_ERROR}
    assert ("reset", 1, None) in peer.calls.events and peer.calls.budget.held == 0
    peer.send(raw(FrameType.DATA, 0, 3, message))
    assert len(peer.calls.messages[3]) == 1 and not peer.transport.closed


def test_data_past_the_connections_window_is_a_connection_error() -> None:
    """Bytes held by streams that have not taken them keep the connection's window too."""
    limits = TransportLimits(connection_window=65535, stream_window=1 << 20, stream_backlog=1)
    peer = Raw(calls=Streaming(limits=limits))
    message = grpc_message(b"m" * 16379)
    for stream_id in (1, 3, 5):
        peer.send(raw(FrameType.HEADERS, 4, stream_id, HEAD) + raw(FrameType.DATA, 0, stream_id, message))
    peer.send(raw(FrameType.HEADERS, 4, 7, HEAD) + raw(FrameType.DATA, 0, 7, message[:-1]))
    assert not peer.server.gone  # 65535 bytes: the whole window
    peer.send(raw(FrameType.DATA, 0, 7, b"m"))
    assert peer.goaway() == (ErrorCode.FLOW_CONTROL_ERROR, b"DATA past the connection's window")


def test_large_messages_are_refused_past_the_budget_and_every_byte_comes_back() -> None:
    budget = RequestBudget(300_000)
    calls = RecordingCalls(max_message_size=1 << 20, budget=budget)
    client = Client(calls)
    held = client.call(None, end=False)  # type: ignore[arg-type]
    send_in_frames(client, held, grpc_message(b"a" * 200_000))  # charged while its call is open
    client.pump()
    assert budget.held == 200_000
    refused = client.call(None, end=False)  # type: ignore[arg-type]
    send_in_frames(client, refused, grpc_message(b"b" * 200_000), end=True)
    small = client.call(b"c" * 1000, end=False)  # small requests always pass
    client.pump()
    blocks, _, _ = client.responses(refused)
    assert blocks[0][b"grpc-status"] == str(Status.RESOURCE_EXHAUSTED).encode()
    assert b"--max-request-bytes-in-flight" in blocks[0][b"grpc-message"]
    assert calls.messages[small] == [b"c" * 1000]
    assert budget.held == 201_000
    client.server.respond(client.server.streams[small], b"ok")
    client.h2.end_stream(held)
    client.pump()
    client.server.respond(client.server.streams[held], b"ok")
    client.pump()
    assert budget.held == 0
    last = client.call(None, end=False)  # type: ignore[arg-type]
    send_in_frames(client, last, grpc_message(b"d" * 100_000))
    client.pump()
    assert budget.held == 100_000
    client.server.connection_lost(None)
    assert budget.held == 0


# -- allowances ------------------------------------------------------------------------------

def test_rapid_reset_is_told_to_calm_down() -> None:
    peer = Raw()
    burst = TransportLimits().resets[0]
    for stream_id in range(1, 2 * burst + 5, 2):
        peer.send(raw(FrameType.HEADERS, 4, stream_id, HEAD) + raw(FrameType.DATA, 1, stream_id, grpc_message(b"x"))
                  + raw(FrameType.RST_STREAM, 0, stream_id, struct.pack(">L", ErrorCode.CANCEL)))
        if peer.server.gone:
            break
    assert peer.goaway() == (ErrorCode.ENHANCE_YOUR_CALM, b"too many RST_STREAM frames")
    assert sum(kind == "reset" for kind, _, _ in peer.calls.events) == burst


@pytest.mark.parametrize("flood, reason", [
    (raw(FrameType.CONTINUATION, 0, 1), b"header block in over 32 CONTINUATION frames"),
    (raw(FrameType.DATA, 0, 1), b"too many empty frames"),
    (raw(FrameType.PRIORITY, 0, 1, b"\0\0\0\0\x10"), b"too many PRIORITY frames"),
    (raw(FrameType.SETTINGS, 0, 0), b"too many SETTINGS frames"),
    (raw(0x20, 0, 0, b"??"), b"too many frames of unknown types"),
])
def test_floods_of_frames_that_bring_nothing_are_told_to_calm_down(flood: bytes, reason: bytes) -> None:
    peer = Raw()
    opening = raw(FrameType.HEADERS, 0, 1, HEAD[:3]) if flood[3] == FrameType.CONTINUATION else raw(FrameType.HEADERS, 4, 1, HEAD)
    peer.send(opening + flood * 5000)
    assert peer.goaway() == (ErrorCode.ENHANCE_YOUR_CALM, reason)


def test_allowances_refill_with_the_clock() -> None:
    peer = Raw()
    peer.send(raw(FrameType.HEADERS, 4, 1, HEAD))
    burst, rate = TransportLimits().idle_frames
    peer.send(raw(FrameType.PRIORITY, 0, 1, b"\0\0\0\0\x10") * burst)
    peer.calls.now = 1.0
    peer.send(raw(FrameType.PRIORITY, 0, 1, b"\0\0\0\0\x10") * int(rate))
    assert not peer.server.gone


# -- inflation off the loop, a streaming call's backlog ---------------------------------------

def test_a_large_compressed_message_inflates_off_the_loop_and_what_follows_keeps_its_order() -> None:
    calls = RecordingCalls()
    calls.offload_now = False
    client = Client(calls)
    stream_id = client.h2.get_next_available_stream_id()
    client.h2.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":path", PATH),
                                       (":authority", "x"), ("grpc-encoding", "gzip")])
    original = random.Random(1).randbytes(20_000)
    big = gzip.compress(original)
    assert len(big) > 8192
    send_in_frames(client, stream_id, grpc_message(big, compressed=True) + grpc_message(b"after"), end=True)
    later = client.call(b"other stream")
    client.pump()
    assert calls.messages[stream_id] == [] and later not in calls.messages  # held until inflated
    assert not client.transport.reading and calls.offloaded
    calls.run_offloaded()
    client.pump()
    assert calls.messages[stream_id] == [original, b"after"]
    assert [kind for kind, sid, _ in calls.events if sid == stream_id][-1] == "end"
    assert calls.messages[later] == [b"other stream"] and client.transport.reading


def test_a_streaming_call_that_does_not_take_its_messages_gets_no_more_window() -> None:
    limits = TransportLimits(stream_window=65536, stream_backlog=2)
    calls = Streaming(limits=limits)
    client = Client(calls)
    stream_id = client.call(None, end=False)  # type: ignore[arg-type]
    client.pump()
    message = b"m" * 16000
    sent = 0
    while client.h2.local_flow_control_window(stream_id) >= len(message) + 5 and sent < 50:
        client.h2.send_data(stream_id, grpc_message(message))
        sent += 1
        client.pump()
    assert sent < 50 and len(calls.messages[stream_id]) == sent  # stalled on the window
    stream = client.server.streams[stream_id]
    for _ in range(sent):
        client.server.taken(stream, len(message))
    client.pump()
    assert client.h2.local_flow_control_window(stream_id) >= 65536 // 2
    assert calls.budget.held == 0


# -- exceptions, answers larger than a frame, timers, the connection limit --------------------

def test_an_exception_in_the_calls_fails_that_call_alone() -> None:
    calls = RecordingCalls()

    def broken(connection: GrpcConnection, stream: GrpcStream) -> None:
        if stream.id == 1:
            raise RuntimeError("boom")
        connection.respond(stream, b"ok")

    calls.on_end = broken
    client = Client(calls)
    first, second = client.call(b"x"), client.call(b"y")
    client.pump()
    blocks, _, _ = client.responses(first)
    assert blocks[0][b"grpc-status"] == str(Status.INTERNAL).encode() and b"boom" in blocks[0][b"grpc-message"]
    _, data, ended = client.responses(second)
    assert data == grpc_message(b"ok") and ended


@pytest.mark.parametrize("size", [65531, 65536, 1 << 20])
def test_an_answer_larger_than_64_kib_goes_out_in_frames_the_client_allows(size: int) -> None:
    calls = RecordingCalls()
    answer = bytes(range(256)) * (size // 256) + b"e" * (size % 256)
    calls.on_end = answer_with(answer)
    client = Client(calls, {h2.settings.SettingCodes.MAX_FRAME_SIZE: 16777215,
                            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 8 << 20})
    client.h2.increment_flow_control_window(8 << 20)
    client.pump()
    stream_id = client.call(b"x")
    client.pump()
    blocks, data, ended = client.responses(stream_id)
    assert data == grpc_message(answer) and ended and blocks[-1] == {b"grpc-status": b"0"}


def test_a_connection_that_does_not_finish_its_handshake_is_closed() -> None:
    calls = RecordingCalls()
    transport = FakeTransport()
    server = GrpcConnection(calls, schedule=transport.schedule)
    server.connection_made(transport)
    server.data_received(PREFACE[:10])
    server.tick(calls.limits.handshake_timeout - 1)
    assert not transport.closed
    server.tick(calls.limits.handshake_timeout)
    assert transport.closed and server.state is ConnectionState.CLOSED


def test_an_idle_connection_is_told_goaway_and_a_stalled_reader_is_closed() -> None:
    peer = Raw()
    limits = peer.calls.limits
    peer.server.tick(limits.idle_timeout - 1)
    assert not peer.transport.closed
    peer.server.tick(limits.idle_timeout)
    assert peer.transport.closed  # GOAWAY, and no call to wait for
    busy = Raw()
    busy.send(raw(FrameType.HEADERS, 4, 1, HEAD))
    busy.server.pause_writing()
    busy.server.tick(limits.write_stall_timeout - 1)
    assert not busy.transport.closed and not busy.transport.reading
    busy.server.tick(limits.write_stall_timeout)
    assert busy.transport.closed


def test_a_connection_past_the_servers_limit_is_told_goaway() -> None:
    transport = FakeTransport()
    server = GrpcConnection(RecordingCalls(), schedule=transport.schedule, refusal="server has 1 open gRPC connections")
    server.connection_made(transport)
    transport.run_scheduled()
    assert b"server has 1 open gRPC connections" in bytes(transport.written) and transport.closed


@pytest.mark.parametrize("huffman, code", [(False, ErrorCode.ENHANCE_YOUR_CALM), (True, ErrorCode.COMPRESSION_ERROR)])
def test_header_lists_past_the_advertised_size_close_the_connection(huffman: bool, code: int) -> None:
    """A block over the size in CONTINUATION frames is refused as it arrives; one that fits
    the frames but decodes past the size is refused by the decoder."""
    peer = Raw()
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/p"), (b"x-a", b"v" * 17000)]
    block = hpack.Encoder().encode(fields, huffman=huffman)
    peer.send(raw(FrameType.HEADERS, 0, 1, block[:16384]) + raw(FrameType.CONTINUATION, 4, 1, block[16384:]))
    goaway = peer.goaway()
    assert goaway is not None and goaway[0] == code


def test_a_call_reset_in_the_read_that_ended_it_is_never_started() -> None:
    peer = Raw()
    peer.calls.on_end = answer_with(b"ok")
    reset = raw(FrameType.RST_STREAM, 0, 1, struct.pack(">L", ErrorCode.CANCEL))
    peer.send(raw(FrameType.HEADERS, 4, 1, HEAD) + raw(FrameType.DATA, 1, 1, grpc_message(b"x")) + reset
              + raw(FrameType.HEADERS, 4, 3, HEAD) + raw(FrameType.DATA, 1, 3, grpc_message(b"y")))
    assert [(kind, stream) for kind, stream, _ in peer.calls.events if kind in ("end", "reset")] == [
        ("reset", 1), ("end", 3)]
