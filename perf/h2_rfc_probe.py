#!/usr/bin/env python3
"""Probe a gRPC server's HTTP/2 with raw frames: RFC 9113 violations and hostile floods.

Each case opens its own connection to the gRPC port, sends the client preface and then the
frames of the case, and reports what the server answered: ``GOAWAY <code>``,
``RST_STREAM <code>`` (on the probed stream), ``grpc-status N`` (trailers on the probed
stream), ``closed`` (the socket closed with no GOAWAY) or ``nothing`` (no answer within
``--timeout``). Every case names the answer RFC 9113 (or gRPC's PROTOCOL-HTTP2, or the
2023-24 flood fixes of nghttp2 / Go / grpc-core where the RFC names none) expects, and the
answer is marked ``✓`` (the expected answer), ``≈`` (safe, and allowed, but not the
expected one: a connection error where a stream error is named, a close without GOAWAY)
or ``✗``.

    python perf/h2_rfc_probe.py --port 8001                       # every case, one server
    python perf/h2_rfc_probe.py --port 8001 --case ping_flood     # one case (repeatable)
    python perf/h2_rfc_probe.py --target native=8001 --target grpcio=8002   # side by side
    python perf/h2_rfc_probe.py --port 8001 --json                # JSON instead of the table
    python perf/h2_rfc_probe.py --list                            # the cases and what they expect

Frames are built by hand (``struct``); header blocks are HPACK literals without indexing
and without Huffman (stateless, so a block can be resent and an uppercase name goes out as
written); the server's header blocks are decoded with ``hpack``. A reader thread drains
the socket all along, so a flood never stalls on the server's answers. Standard library
and ``hpack`` only. Exit status 0 whatever the server answers (2: bad arguments).
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = range(1, 7)
ERROR_CODES = (
    "NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT", "STREAM_CLOSED",
    "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR", "ENHANCE_YOUR_CALM",
    "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED",
)
CANCEL = 8
MAX_WINDOW = 2**31 - 1
SERVER_LIVE = b"/inference.GRPCInferenceService/ServerLive"
MODEL_INFER = b"/inference.GRPCInferenceService/ModelInfer"


def code_name(code: int) -> str:
    return ERROR_CODES[code] if code < len(ERROR_CODES) else f"0x{code:x}"


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return struct.pack(">BHBBL", size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def setting(key: int, value: int) -> bytes:
    return struct.pack(">HL", key, value)


def u32(value: int) -> bytes:
    return struct.pack(">L", value)


def grpc_message(body: bytes, compressed: bool = False, declared: int | None = None) -> bytes:
    return struct.pack(">BL", int(compressed), len(body) if declared is None else declared) + body


def _hpack_int(value: int, prefix_bits: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((value,))
    out = bytearray((limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """HPACK literals "without indexing, new name", no Huffman: stateless and verbatim."""
    return b"".join(
        b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value for name, value in headers
    )


def request_headers(authority: bytes, path: bytes = SERVER_LIVE, extra: list[tuple[bytes, bytes]] | None = None
                    ) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", authority),
        (b"content-type", b"application/grpc"), (b"te", b"trailers"), *(extra or []),
    ]


# ---------------------------------------------------------------------------------------
# one connection


@dataclass
class Event:
    at: float
    kind: str  # goaway, rst, status, closed, ping_ack, settings_ack
    stream: int = 0
    code: int = 0
    detail: str = ""


class Peer:
    """One client connection: a reader thread records what the server sends (and ACKs
    its SETTINGS and PINGs); ``send`` writes frames under a lock."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.authority = f"{host}:{port}".encode()
        self.events: list[Event] = []
        self.settings: dict[int, int] = {}
        self.settings_seen = threading.Event()
        self.connection_grants = 0
        self.stream_grants: dict[int, int] = {}
        self.window_updates = 0
        self.closed = False
        self.sent_frames = 0
        self._send_lock = threading.Lock()
        #: set once the client preface is out: the reader's ACKs must not go before it
        self._started = threading.Event()
        self._changed = threading.Condition()
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 1 << 24
        self._block: tuple[int, int, bytearray] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    # sending

    def send(self, data: bytes, frames: int = 1) -> bool:
        """False once the connection is closed (or the server stopped reading for the
        socket's timeout: a flood that stalls ends there)."""
        if self.closed:
            return False
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except (OSError, socket.timeout):
            return False
        self._started.set()
        self.sent_frames += frames
        return True

    def handshake(self, settings: bytes = b"", wait: float = 2.0) -> None:
        """Preface and SETTINGS; wait for the server's SETTINGS (ACKed by the reader)."""
        self.send(PREFACE + frame(SETTINGS, 0, 0, settings))
        self.settings_seen.wait(wait)

    def open_stream(self, stream_id: int, path: bytes = SERVER_LIVE, end_stream: bool = False,
                    extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
        block = header_block(request_headers(self.authority, path, extra))
        return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream_id, block)

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._reader.join(2)

    # what the server says

    def initial_window(self) -> int:
        return self.settings.get(INITIAL_WINDOW_SIZE, 65535)

    def max_frame(self) -> int:
        return self.settings.get(MAX_FRAME_SIZE, 16384)

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e.kind == kind)

    def wait(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def answer(self, stream: int, timeout: float, since: float = 0.0) -> Answer:
        """The server's answer about ``stream`` (or the connection): the first GOAWAY,
        RST_STREAM or trailers of the stream, or the close; "nothing" after ``timeout``."""

        def decisive() -> Event | None:
            for event in self.events:
                if event.at < since:
                    continue
                if event.kind in ("goaway", "closed") or (event.kind in ("rst", "status") and event.stream == stream):
                    return event
            return None

        self.wait(lambda: decisive() is not None, timeout)
        event = decisive()
        if event is None:
            return Answer("nothing")
        if event.kind == "goaway":
            self.wait(lambda: self.closed_by_server(), 0.5)
            return Answer(f"GOAWAY {code_name(event.code)}", event.detail, closed=self.closed_by_server())
        if event.kind == "rst":
            return Answer(f"RST_STREAM {code_name(event.code)}")
        if event.kind == "status":
            later = [e for e in self.events if e.kind == "rst" and e.stream == stream]
            return Answer(f"grpc-status {event.code}", event.detail + (
                f" (then RST_STREAM {code_name(later[0].code)})" if later else ""))
        return Answer("closed", event.detail)

    def closed_by_server(self) -> bool:
        return any(e.kind == "closed" for e in self.events)

    def _record(self, event: Event) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def _read(self) -> None:
        buffer = bytearray()
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                if self.closed:
                    return
                continue
            except OSError as exc:
                if not self.closed:
                    self._record(Event(time.monotonic(), "closed", detail=f"reset ({exc.__class__.__name__})"))
                return
            if not data:
                self._record(Event(time.monotonic(), "closed"))
                return
            buffer += data
            position = 0
            while len(buffer) - position >= 9:
                high, low, kind, flags, stream_id = struct.unpack_from(">BHBBL", buffer, position)
                size = high << 16 | low
                if len(buffer) - position - 9 < size:
                    break
                payload = bytes(buffer[position + 9:position + 9 + size])
                position += 9 + size
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload)
            del buffer[:position]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        now = time.monotonic()
        if kind == SETTINGS:
            if flags & ACK:
                self._record(Event(now, "settings_ack"))
                return
            for offset in range(0, len(payload) - 5, 6):
                key, value = struct.unpack_from(">HL", payload, offset)
                self.settings[key] = value
            self._started.wait(10)
            self.send(frame(SETTINGS, ACK, 0), 0)
            self.settings_seen.set()
        elif kind == PING:
            if flags & ACK:
                self._record(Event(now, "ping_ack"))
            else:
                self._started.wait(10)
                self.send(frame(PING, ACK, 0, payload), 0)
        elif kind == GOAWAY:
            last, code = struct.unpack_from(">LL", payload)
            self._record(Event(now, "goaway", last & 0x7FFFFFFF, code, payload[8:].decode("latin-1")[:80]))
        elif kind == RST_STREAM:
            self._record(Event(now, "rst", stream_id, struct.unpack(">L", payload)[0]))
        elif kind == WINDOW_UPDATE:
            increment = struct.unpack(">L", payload)[0] & 0x7FFFFFFF
            with self._changed:
                self.window_updates += 1
                if stream_id:
                    self.stream_grants[stream_id] = self.stream_grants.get(stream_id, 0) + increment
                else:
                    self.connection_grants += increment
                self._changed.notify_all()
        elif kind in (HEADERS, CONTINUATION):
            if kind == HEADERS:
                if flags & 0x8:  # PADDED
                    payload = payload[1:len(payload) - payload[0]]
                if flags & 0x20:  # PRIORITY
                    payload = payload[5:]
                self._block = (stream_id, flags, bytearray(payload))
            elif self._block is not None:
                self._block[2].extend(payload)
            if flags & END_HEADERS and self._block is not None:
                block_stream, _, block = self._block
                self._block = None
                try:
                    fields = {bytes(n): bytes(v) for n, v in self._decoder.decode(bytes(block), raw=True)}
                except hpack.HPACKError as exc:
                    self._record(Event(now, "closed", block_stream, detail=f"undecodable header block: {exc}"))
                    return
                status = fields.get(b"grpc-status")
                if status is not None:
                    message = fields.get(b"grpc-message", b"").decode("latin-1")
                    self._record(Event(now, "status", block_stream, int(status), message[:80]))


@dataclass
class Answer:
    key: str  # "GOAWAY PROTOCOL_ERROR", "RST_STREAM STREAM_CLOSED", "grpc-status 8", "closed", "nothing"
    detail: str = ""
    closed: bool = False
    seconds: float = 0.0

    def text(self) -> str:
        out = self.key
        if self.detail:
            out += f" [{self.detail}]"
        return out


@dataclass(frozen=True)
class Case:
    name: str
    summary: str
    expected: str  # what RFC 9113 / gRPC / the flood fixes name, in words
    right: tuple[str, ...]  # answer keys marked ✓ ("GOAWAY *": any GOAWAY)
    near: tuple[str, ...]  # answer keys marked ≈
    run: Callable[[Peer, argparse.Namespace], Answer] = field(repr=False)

    def mark(self, answer: Answer) -> str:
        def matches(patterns: tuple[str, ...]) -> bool:
            return any(answer.key == p or (p.endswith("*") and answer.key.startswith(p[:-1])) for p in patterns)

        if matches(self.right):
            return "✓"
        if matches(self.near):
            return "≈"
        return "✗"


# ---------------------------------------------------------------------------------------
# the cases

CASES: list[Case] = []


def case(name: str, summary: str, expected: str, right: tuple[str, ...], near: tuple[str, ...] = ()
         ) -> Callable[[Callable[[Peer, argparse.Namespace], Answer]], Callable[[Peer, argparse.Namespace], Answer]]:
    def register(run: Callable[[Peer, argparse.Namespace], Answer]) -> Callable[[Peer, argparse.Namespace], Answer]:
        CASES.append(Case(name, summary, expected, right, near, run))
        return run

    return register


CONNECTION_CLOSE = ("closed",)


@case("valid_call", "a well-formed ServerLive call (the probe itself works)",
      "grpc-status 0", ("grpc-status 0",))
def _valid_call(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(peer.open_stream(1) + frame(DATA, END_STREAM, 1, grpc_message(b"")))
    return peer.answer(1, args.timeout)


@case("preface_no_settings", "client preface followed by a PING instead of SETTINGS",
      "GOAWAY PROTOCOL_ERROR (§3.4)", ("GOAWAY PROTOCOL_ERROR",), CONNECTION_CLOSE)
def _preface_no_settings(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.send(PREFACE + frame(PING, 0, 0, b"probe\x00\x00\x00"))
    return peer.answer(0, args.timeout)


@case("priority_stream0", "PRIORITY frame on stream 0",
      "GOAWAY PROTOCOL_ERROR (§6.3)", ("GOAWAY PROTOCOL_ERROR",), CONNECTION_CLOSE)
def _priority_stream0(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(PRIORITY, 0, 0, u32(1) + b"\x10"))
    return peer.answer(0, args.timeout)


@case("settings_ack_payload", "SETTINGS with ACK and a 6-byte payload",
      "GOAWAY FRAME_SIZE_ERROR (§6.5)", ("GOAWAY FRAME_SIZE_ERROR",), CONNECTION_CLOSE)
def _settings_ack_payload(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(SETTINGS, ACK, 0, setting(INITIAL_WINDOW_SIZE, 65535)))
    return peer.answer(0, args.timeout)


@case("enable_push_2", "SETTINGS_ENABLE_PUSH = 2",
      "GOAWAY PROTOCOL_ERROR (§6.5.2)", ("GOAWAY PROTOCOL_ERROR",), CONNECTION_CLOSE)
def _enable_push_2(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(SETTINGS, 0, 0, setting(ENABLE_PUSH, 2)))
    return peer.answer(0, args.timeout)


@case("settings_on_stream", "SETTINGS on stream 1",
      "GOAWAY PROTOCOL_ERROR (§6.5)", ("GOAWAY PROTOCOL_ERROR",), CONNECTION_CLOSE)
def _settings_on_stream(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(SETTINGS, 0, 1))
    return peer.answer(0, args.timeout)


@case("uppercase_header", "request with a header named 'Content-Type'",
      "RST_STREAM PROTOCOL_ERROR (§8.2.1, malformed: stream error)", ("RST_STREAM PROTOCOL_ERROR",),
      ("GOAWAY PROTOCOL_ERROR", "closed"))
def _uppercase_header(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    headers = [(n if n != b"content-type" else b"Content-Type", v) for n, v in request_headers(peer.authority)]
    peer.send(frame(HEADERS, END_HEADERS, 1, header_block(headers)) + frame(DATA, END_STREAM, 1, grpc_message(b"")))
    return peer.answer(1, args.timeout)


@case("connection_header", "request with 'connection: keep-alive'",
      "RST_STREAM PROTOCOL_ERROR (§8.2.2, malformed: stream error)", ("RST_STREAM PROTOCOL_ERROR",),
      ("GOAWAY PROTOCOL_ERROR", "closed"))
def _connection_header(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(peer.open_stream(1, extra=[(b"connection", b"keep-alive")]) + frame(DATA, END_STREAM, 1, grpc_message(b"")))
    return peer.answer(1, args.timeout)


@case("even_stream_id", "HEADERS on stream 2 (client streams are odd)",
      "GOAWAY PROTOCOL_ERROR (§5.1.1)", ("GOAWAY PROTOCOL_ERROR",), CONNECTION_CLOSE)
def _even_stream_id(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(peer.open_stream(2, end_stream=True))
    return peer.answer(2, args.timeout)


@case("data_idle_stream", "DATA on stream 3, never opened",
      "GOAWAY PROTOCOL_ERROR (§5.1, idle)", ("GOAWAY PROTOCOL_ERROR",), CONNECTION_CLOSE)
def _data_idle_stream(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(DATA, END_STREAM, 3, grpc_message(b"")))
    return peer.answer(3, args.timeout)


@case("headers_closed_stream", "a finished call's stream 1 gets HEADERS again",
      "RST_STREAM STREAM_CLOSED (§5.1, closed: stream error)", ("RST_STREAM STREAM_CLOSED",),
      ("GOAWAY STREAM_CLOSED", "GOAWAY PROTOCOL_ERROR", "closed"))
def _headers_closed_stream(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(peer.open_stream(1) + frame(DATA, END_STREAM, 1, grpc_message(b"")))
    first = peer.answer(1, args.timeout)
    if first.key != "grpc-status 0":
        return Answer("(setup failed)", f"the call on stream 1 got {first.key}")
    since = time.monotonic()
    peer.send(peer.open_stream(1, end_stream=True))
    answer = peer.answer(1, args.timeout, since)
    if answer.key.startswith("grpc-status"):  # answered as a new call
        answer.detail = "served as a new call " + answer.detail
    return answer


@case("data_past_window", "one stream's DATA runs past the stream/connection window",
      "FLOW_CONTROL_ERROR past what was granted (§6.9.1: RST_STREAM or GOAWAY); ≈ a server that grants "
      "the window again as it takes the bytes (no overrun possible)",
      ("RST_STREAM FLOW_CONTROL_ERROR", "GOAWAY FLOW_CONTROL_ERROR"),
      ("window re-granted", "closed", "RST_STREAM PROTOCOL_ERROR", "GOAWAY PROTOCOL_ERROR"))
def _data_past_window(peer: Peer, args: argparse.Namespace) -> Answer:
    """A message declared larger than any window, sent one frame at a time while counting
    the server's grants (waiting 0.3 s for one when the window is used up): a server that
    grants window only as messages are consumed has none left to grant, and the frame past
    it must get FLOW_CONTROL_ERROR. A server that grants again as it takes the bytes (into
    a buffer its memory budget bounds) leaves nothing to overrun: "window re-granted", up
    to 64 MiB sent. DATA accepted past what was granted is "nothing" (✗)."""
    peer.handshake()
    time.sleep(0.2)  # the server's first connection WINDOW_UPDATE
    declared = min(args.max_message_size - 1, 1 << 30)
    max_frame = peer.max_frame()
    start = time.monotonic()
    peer.send(peer.open_stream(1, MODEL_INFER))
    sent = 0
    first = grpc_message(b"", declared=declared)
    cap = 64 << 20
    chunk = b"\x00" * max_frame

    def allowed() -> int:
        return min(peer.initial_window() + peer.stream_grants.get(1, 0), 65535 + peer.connection_grants)

    while sent < cap and not peer.closed_by_server():
        if sent >= allowed():  # give a grant in flight its chance before going past
            updates = peer.window_updates
            peer.wait(lambda: peer.window_updates != updates, 0.3)
        if sent >= allowed() + max_frame:  # one whole frame past what was granted
            break
        payload = first + chunk[len(first):] if sent == 0 else chunk
        if not peer.send(frame(DATA, 0, 1, payload)):
            break
        sent += len(payload)
    answer = peer.answer(1, args.timeout, start)
    granted = peer.stream_grants.get(1, 0)
    if answer.key == "nothing":
        if sent > allowed():
            answer.detail = f"took {(sent - allowed()) / 1024:.0f} KiB past the window"
        else:
            answer.key = "window re-granted"
            answer.detail = (f"took {sent / 1048576:.0f} MiB of an unfinished message, "
                             f"{granted / 1048576:.0f} MiB granted on the stream as it arrived")
    elif granted:
        answer.detail = f"after granting {granted / 1048576:.1f} MiB on the stream"
    return answer


@case("streams_over_limit", "one stream more than the server's SETTINGS_MAX_CONCURRENT_STREAMS, all left open",
      "RST_STREAM REFUSED_STREAM or PROTOCOL_ERROR on the extra stream (§5.1.2)",
      ("RST_STREAM REFUSED_STREAM", "RST_STREAM PROTOCOL_ERROR"), ("GOAWAY PROTOCOL_ERROR", "closed"))
def _streams_over_limit(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    limit = peer.settings.get(MAX_CONCURRENT_STREAMS)
    if limit is None or limit > 100_000:
        return Answer("(no limit advertised)")
    last = 2 * limit + 1  # streams 1, 3, ... (limit of them), then this one
    opens = b"".join(peer.open_stream(2 * i + 1, MODEL_INFER) for i in range(limit + 1))
    peer.send(opens, limit + 1)
    answer = peer.answer(last, args.timeout)
    answer.detail = f"limit {limit}"
    return answer


@case("window_overflow_settings", "stream window at 2^31-1, then SETTINGS_INITIAL_WINDOW_SIZE +1",
      "GOAWAY FLOW_CONTROL_ERROR (§6.9.2)", ("GOAWAY FLOW_CONTROL_ERROR",), ("RST_STREAM FLOW_CONTROL_ERROR", "closed"))
def _window_overflow_settings(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(peer.open_stream(1) + frame(WINDOW_UPDATE, 0, 1, u32(MAX_WINDOW - 65535)))
    time.sleep(0.05)
    peer.send(frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 65536)))
    return peer.answer(1, args.timeout)


@case("window_update_overflow", "connection WINDOW_UPDATE past 2^31-1",
      "GOAWAY FLOW_CONTROL_ERROR (§6.9.1)", ("GOAWAY FLOW_CONTROL_ERROR",), CONNECTION_CLOSE)
def _window_update_overflow(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(WINDOW_UPDATE, 0, 0, u32(MAX_WINDOW)))
    return peer.answer(0, args.timeout)


@case("window_update_zero", "WINDOW_UPDATE with increment 0 on the connection",
      "GOAWAY PROTOCOL_ERROR (§6.9)", ("GOAWAY PROTOCOL_ERROR",), CONNECTION_CLOSE)
def _window_update_zero(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(WINDOW_UPDATE, 0, 0, u32(0)))
    return peer.answer(0, args.timeout)


@case("window_update_zero_stream", "WINDOW_UPDATE with increment 0 on an open stream",
      "RST_STREAM PROTOCOL_ERROR (§6.9)", ("RST_STREAM PROTOCOL_ERROR",), ("GOAWAY PROTOCOL_ERROR", "closed"))
def _window_update_zero_stream(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(peer.open_stream(1) + frame(WINDOW_UPDATE, 0, 1, u32(0)))
    return peer.answer(1, args.timeout)


@case("frame_too_large", "HEADERS frame one byte over the server's SETTINGS_MAX_FRAME_SIZE",
      "GOAWAY FRAME_SIZE_ERROR (§4.2)", ("GOAWAY FRAME_SIZE_ERROR",), CONNECTION_CLOSE)
def _frame_too_large(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    limit = peer.max_frame()
    block = header_block(request_headers(peer.authority) + [(b"x-pad", b"a" * limit)])[:limit + 1]
    peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
    return peer.answer(1, args.timeout)


@case("continuation_without_headers", "CONTINUATION on stream 1 with no HEADERS before",
      "GOAWAY PROTOCOL_ERROR (§6.10)", ("GOAWAY PROTOCOL_ERROR",), CONNECTION_CLOSE)
def _continuation_without_headers(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(CONTINUATION, END_HEADERS, 1, header_block(request_headers(peer.authority))))
    return peer.answer(1, args.timeout)


@case("push_promise", "PUSH_PROMISE from the client",
      "GOAWAY PROTOCOL_ERROR (§8.4)", ("GOAWAY PROTOCOL_ERROR",), CONNECTION_CLOSE)
def _push_promise(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(PUSH_PROMISE, END_HEADERS, 1, u32(2) + header_block(request_headers(peer.authority))))
    return peer.answer(1, args.timeout)


@case("goaway_on_stream", "GOAWAY on stream 1",
      "GOAWAY PROTOCOL_ERROR (§6.8)", ("GOAWAY PROTOCOL_ERROR",), CONNECTION_CLOSE)
def _goaway_on_stream(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(GOAWAY, 0, 1, u32(0) + u32(0)))
    return peer.answer(1, args.timeout)


@case("message_over_max", "a gRPC message declared one byte over the server's max size",
      "grpc-status 8 RESOURCE_EXHAUSTED (gRPC)", ("grpc-status 8",), ("RST_STREAM *",))
def _message_over_max(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(peer.open_stream(1, MODEL_INFER) + frame(DATA, 0, 1, grpc_message(b"\x00" * 1024, declared=args.max_message_size + 1)))
    return peer.answer(1, args.timeout)


_BOMBS: dict[int, bytes] = {}


def gzip_bomb(inflated: int) -> bytes:
    """gzip of ``inflated`` zero bytes (about 1/1000 of that)."""
    if inflated not in _BOMBS:
        deflater = zlib.compressobj(9, zlib.DEFLATED, 31)
        block = bytes(1 << 20)
        parts = [deflater.compress(block) for _ in range(inflated >> 20)]
        parts.append(deflater.compress(bytes(inflated & ((1 << 20) - 1))))
        parts.append(deflater.flush())
        _BOMBS[inflated] = b"".join(parts)
    return _BOMBS[inflated]


@case("gzip_bomb", "a gzip message inflating to one byte over the max size",
      "grpc-status 8 RESOURCE_EXHAUSTED, promptly", ("grpc-status 8",), ("RST_STREAM *", "grpc-status 13"))
def _gzip_bomb(peer: Peer, args: argparse.Namespace) -> Answer:
    bomb = gzip_bomb(args.max_message_size + 1)
    peer.handshake()
    max_frame = peer.max_frame()
    body = grpc_message(bomb, compressed=True)
    frames = [peer.open_stream(1, MODEL_INFER, extra=[(b"grpc-encoding", b"gzip"), (b"grpc-accept-encoding", b"gzip")])]
    for offset in range(0, len(body), max_frame):
        last = offset + max_frame >= len(body)
        frames.append(frame(DATA, END_STREAM if last else 0, 1, body[offset:offset + max_frame]))
    start = time.monotonic()
    peer.send(b"".join(frames))
    answer = peer.answer(1, max(args.timeout, 30.0))
    answer.detail = (f"{len(bomb) / 1048576:.1f} MiB -> {(args.max_message_size + 1) / 1048576:.0f} MiB, "
                     f"answered in {time.monotonic() - start:.2f} s " + answer.detail).strip()
    return answer


# -- floods: no RFC answer; expected is the 2023-24 fixes' (GOAWAY ENHANCE_YOUR_CALM or a close)

FLOOD_RIGHT = ("GOAWAY *",)
FLOOD_NEAR = ("closed",)


def flood(peer: Peer, args: argparse.Namespace, unit: bytes, frames_per_unit: int, total: int, stream: int = 0) -> Answer:
    """Send ``unit`` until ``total`` frames are out, the server answers or --flood-seconds
    pass; the answer names how many frames were out when it came."""
    batch = max(1, 512 // frames_per_unit)
    data = unit * batch
    start = time.monotonic()
    deadline = start + args.flood_seconds
    sent = 0
    stalled = False
    stop_kinds = ("goaway", "closed")
    while sent < total and time.monotonic() < deadline:
        if any(e.at >= start and (e.kind in stop_kinds or (e.kind == "rst" and e.stream == stream and stream))
               for e in peer.events[-16:]):
            break
        if not peer.send(data, batch * frames_per_unit):
            stalled = not peer.closed_by_server()
            break
        sent += batch * frames_per_unit
    elapsed = time.monotonic() - start
    answer = peer.answer(stream, args.timeout, start)
    note = f"{sent:,} frames sent in {elapsed:.1f} s"
    if stalled:
        note += ", then the server stopped reading"
    answer.detail = (note + (f"; {answer.detail}" if answer.detail else "")).strip()
    return answer


@case("continuation_flood", "HEADERS without END_HEADERS, then zero-length CONTINUATION frames",
      "GOAWAY (ENHANCE_YOUR_CALM/PROTOCOL_ERROR) or close (CVE-2024-27316)", FLOOD_RIGHT, FLOOD_NEAR)
def _continuation_flood(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(frame(HEADERS, 0, 1, header_block(request_headers(peer.authority))))
    return flood(peer, args, frame(CONTINUATION, 0, 1), 1, args.flood_frames)


@case("empty_data_flood", "an open stream gets zero-length DATA frames without END_STREAM",
      "GOAWAY (ENHANCE_YOUR_CALM) or close (CVE-2019-9518)", FLOOD_RIGHT,
      FLOOD_NEAR + ("RST_STREAM *", "grpc-status *"))
def _empty_data_flood(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    peer.send(peer.open_stream(1, MODEL_INFER))
    return flood(peer, args, frame(DATA, 0, 1), 1, args.flood_frames, stream=1)


@case("rst_flood", "rapid reset: HEADERS + DATA (a whole call) + RST_STREAM, stream after stream",
      "GOAWAY ENHANCE_YOUR_CALM (CVE-2023-44487)", FLOOD_RIGHT, FLOOD_NEAR)
def _rst_flood(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    block = header_block(request_headers(peer.authority))
    body = grpc_message(b"")
    start = time.monotonic()
    deadline = start + args.flood_seconds
    stream_id = 1
    streams = 0
    while streams < args.flood_streams and time.monotonic() < deadline:
        if any(e.kind in ("goaway", "closed") for e in peer.events[-16:]):
            break
        burst = []
        for _ in range(50):
            burst.append(frame(HEADERS, END_HEADERS, stream_id, block) + frame(DATA, END_STREAM, stream_id, body)
                         + frame(RST_STREAM, 0, stream_id, u32(CANCEL)))
            stream_id += 2
        if not peer.send(b"".join(burst), 150):
            break
        streams += 50
    elapsed = time.monotonic() - start
    answer = peer.answer(0, args.timeout, start)
    answered = peer.count("status")
    answer.detail = (f"{streams:,} streams reset in {elapsed:.1f} s, {answered:,} answered"
                     + (f"; {answer.detail}" if answer.detail else ""))
    return answer


@case("ping_flood", "PING frames back to back",
      "GOAWAY ENHANCE_YOUR_CALM (gRPC ping policy; CVE-2019-9512)", FLOOD_RIGHT, FLOOD_NEAR)
def _ping_flood(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    answer = flood(peer, args, frame(PING, 0, 0, b"probe\x00\x00\x00"), 1, args.flood_pings)
    answer.detail += f"; {peer.count('ping_ack'):,} ACKs"
    return answer


@case("settings_flood", "empty SETTINGS frames back to back",
      "GOAWAY ENHANCE_YOUR_CALM (CVE-2019-9515)", FLOOD_RIGHT, FLOOD_NEAR)
def _settings_flood(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    answer = flood(peer, args, frame(SETTINGS, 0, 0), 1, args.flood_pings)
    answer.detail += f"; {peer.count('settings_ack'):,} ACKs"
    return answer


@case("priority_flood", "PRIORITY frames on fresh idle streams back to back",
      "GOAWAY ENHANCE_YOUR_CALM or close (CVE-2019-9513)", FLOOD_RIGHT, FLOOD_NEAR)
def _priority_flood(peer: Peer, args: argparse.Namespace) -> Answer:
    peer.handshake()
    units = b"".join(frame(PRIORITY, 0, 2 * i + 1, u32(0) + b"\x10") for i in range(512))
    return flood(peer, args, units, 512, args.flood_frames)


# ---------------------------------------------------------------------------------------
# running and reporting


def run_case(item: Case, host: str, port: int, args: argparse.Namespace) -> Answer:
    try:
        peer = Peer(host, port, args.timeout)
    except OSError as exc:
        return Answer("(no connection)", str(exc))
    try:
        return item.run(peer, args)
    except Exception as exc:  # a probe bug must not hide the other cases' answers
        return Answer("(probe error)", f"{exc.__class__.__name__}: {exc}")
    finally:
        peer.close()


def parse_target(text: str) -> tuple[str, str, int]:
    label, _, address = text.rpartition("=")
    host, _, port = address.rpartition(":")
    return label or address, host or "127.0.0.1", int(port)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--port", type=int, help="the gRPC port to probe (on --host)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--target", action="append", default=[],
                   help="LABEL=[HOST:]PORT to probe, repeatable: one answer column each")
    p.add_argument("--case", action="append", default=[], help="run only this case (repeatable)")
    p.add_argument("--list", action="store_true", help="list the cases and their expected answers")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer")
    p.add_argument("--max-message-size", type=int, default=2**31 - 1,
                   help="the server's gRPC max message size (its --grpc-max-message-size)")
    p.add_argument("--flood-frames", type=int, default=1_000_000, help="cheap frames per flood")
    p.add_argument("--flood-pings", type=int, default=100_000, help="PING / SETTINGS frames per flood")
    p.add_argument("--flood-streams", type=int, default=20_000, help="streams in the rapid-reset flood")
    p.add_argument("--flood-seconds", type=float, default=5.0, help="longest a flood is sent")
    args = p.parse_args(argv)
    names = {c.name for c in CASES}
    unknown = [n for n in args.case if n not in names]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    targets = [parse_target(t) for t in args.target]
    if args.port is not None:
        targets.insert(0, ("server", args.host, args.port))
    if not targets and not args.list:
        p.error("give --port N or --target LABEL=PORT")
    args.targets = targets
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [c for c in CASES if not args.case or c.name in args.case]
    if args.list:
        for c in cases:
            print(f"{c.name:<28} {c.summary}\n{'':<28} expected: {c.expected}")
        return 0
    results: list[dict[str, object]] = []
    for item in cases:
        row: dict[str, object] = {"case": item.name, "summary": item.summary, "expected": item.expected, "answers": {}}
        for label, host, port in args.targets:
            began = time.monotonic()
            answer = run_case(item, host, port, args)
            answer.seconds = time.monotonic() - began
            row["answers"][label] = {"answer": answer.key, "detail": answer.detail, "mark": item.mark(answer)}  # type: ignore[index]
            if not args.json:
                print(f"  {item.name} @ {label}: {item.mark(answer)} {answer.text()} ({answer.seconds:.1f} s)", file=sys.stderr, flush=True)
        results.append(row)
    if args.json:
        print(json.dumps({"targets": [t[0] for t in args.targets], "cases": results}, indent=2, ensure_ascii=False))
    else:
        print_table(results, [t[0] for t in args.targets])
    return 0


def print_table(results: list[dict[str, object]], labels: list[str]) -> None:
    """A Markdown table: case, expected, then each target's answer with its mark."""
    print("| case | expected | " + " | ".join(labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    for row in results:
        cells = []
        for label in labels:
            a = row["answers"][label]  # type: ignore[index]
            cells.append(f"{a['mark']} {a['answer']}" + (f" ({a['detail']})" if a["detail"] else ""))
        print(f"| {row['case']} | {row['expected']} | " + " | ".join(cells) + " |")
    for label in labels:
        marks = [row["answers"][label]["mark"] for row in results]  # type: ignore[index]
        print(f"\n{label}: {marks.count('✓')} ✓, {marks.count('≈')} ≈, {marks.count('✗')} ✗ of {len(marks)}", end="")
    print()


if __name__ == "__main__":
    sys.exit(main())
