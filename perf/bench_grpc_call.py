#!/usr/bin/env python3
"""The native gRPC engine's own cost per ModelInfer, in process: from the bytes received to
the answer written, without the batcher or the model.

One ``GrpcConnection`` on a fake transport, its Calls the real ``NativeGrpcServer`` and
its ModelInfer the real ``infer.ModelInfer`` (memo included, where the tree has one),
whose served version "runs" the add_one model at once (the answer's outputs are made in
place of a batch): the connection, its header-block cache, the Sender, the call routing
and the infer path's decode and encode, which is the gRPC side of a request's path. Each call is one
tritonclient-shaped ModelInferRequest (INT64 [1, 1], raw_input_contents) on a new stream,
HEADERS and DATA with END_STREAM in one read, followed by a WINDOW_UPDATE (giving back what
the answer took) and a PING, as grpc-core clients send them.

Source trees side by side, interleaved (the order flips every repeat), each in its own
process; prints CPU microseconds per call (median over repeats) and the ratio to the first:

    python perf/bench_grpc_call.py --tree new=server --tree base=/path/to/other/server
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _measure(calls: int) -> float:
    """CPU microseconds per call in this process (the tree is the one on sys.path)."""
    import struct
    import time
    from typing import Any

    import numpy as np
    from tritonclient.grpc import service_pb2

    from nereid.config import load_model_config
    from nereid.grpc.h2.connection import GrpcConnection
    from nereid.grpc.h2.frames import literal
    from nereid.grpc.native import NativeGrpcServer
    from nereid.options import ServerOptions
    from nereid.tensors.tables import ModelTables

    from nereid.grpc.infer import ModelInfer
    from nereid.tensors.shared_memory import SharedMemoryManager

    try:
        from nereid.grpc.infer_messages import decode_request, encode_response
    except ImportError:  # the tree before the memo (codec in grpc/infer.py)
        from nereid.grpc.infer import decode_request, encode_response  # type: ignore[attr-defined, no-redef]

    config = load_model_config(ROOT / "model_repository" / "add_one" / "config.toml", "add_one")
    tables = ModelTables.for_config(config)

    class Ticket:
        def withdraw(self) -> None:
            pass

    ticket = Ticket()

    class Serving:
        """add_one's served version, whose batch is run at once (its outputs made in place)."""

        name, version, labels, config = "add_one", 1, None, load_model_config(
            ROOT / "model_repository" / "add_one" / "config.toml", "add_one")

        def submit(self, request: Any, received_ns: int, answer: Any) -> Ticket:
            answer({"OUTPUT0": request.inputs["INPUT0"] + 1}, None)
            return ticket

    from types import SimpleNamespace

    serving = Serving()
    manager = SimpleNamespace(latest={"add_one": serving}, get=lambda name, version: serving)

    class Service:
        infer = ModelInfer(manager, SharedMemoryManager())  # type: ignore[arg-type]

        def __getattr__(self, name: str) -> Any:
            return lambda request, context: None

    class Transport:
        written = 0

        def write(self, data: bytes) -> None:
            self.written += len(data)

        def is_closing(self) -> bool:
            return False

        def close(self) -> None:
            pass

    scheduled: list[Any] = []
    server = NativeGrpcServer(Service(), ServerOptions())  # type: ignore[arg-type]
    connection = GrpcConnection(server, schedule=scheduled.append)
    connection.connection_made(Transport())
    connection.data_received(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + struct.pack(">BHBBL", 0, 0, 4, 0, 0))
    request = service_pb2.ModelInferRequest(model_name="add_one")
    request.inputs.add(name="INPUT0", datatype="INT64", shape=[1, 1])
    request.raw_input_contents.append(np.array([[41]], np.int64).tobytes())
    message = request.SerializeToString()
    block = b"\x83\x86" + literal(b":path", b"/inference.GRPCInferenceService/ModelInfer") + literal(
        b":authority", b"127.0.0.1") + literal(b"content-type", b"application/grpc") + literal(b"te", b"trailers")
    data = struct.pack(">BL", 0, len(message)) + message
    decoded = decode_request(request, tables, 1, None)
    answer = encode_response({"OUTPUT0": decoded.inputs["INPUT0"] + 1}, decoded, tables, 1, None, None)
    answer_size = len(answer.SerializeToString()) + 5  # the client gives back what each answer took
    frame = struct.Struct(">BHBBL")
    tail = frame.pack(0, 4, 8, 0, 0) + struct.pack(">L", answer_size) + frame.pack(0, 8, 6, 0, 0) + b"\0" * 8
    reads = [
        frame.pack(0, len(block), 1, 4, stream_id) + block + frame.pack(0, len(data), 0, 1, stream_id) + data + tail
        for stream_id in range(1, 2 * calls, 2)
    ]
    started = time.process_time()  # CPU time: a shared machine's other work counts far less than in wall time
    for read in reads:
        connection.data_received(read)
        while scheduled:
            scheduled.pop()()
    elapsed = time.process_time() - started
    assert not connection.streams and connection._sender.send_window > 0
    return elapsed / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="LABEL=DIR (a server/ folder); first is the reference")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_measure(args.calls)))
        return
    trees = [tree.split("=", 1) for tree in args.tree] or [["this", str(ROOT / "server")]]
    results: dict[str, list[float]] = {label: [] for label, _ in trees}
    for repeat in range(args.repeats):
        for label, folder in trees if repeat % 2 == 0 else trees[::-1]:
            env = dict(os.environ, PYTHONPATH=str(Path(folder).resolve()))
            out = subprocess.run([sys.executable, __file__, "--child", "--calls", str(args.calls)], env=env,
                                 capture_output=True, text=True, check=True).stdout
            results[label].append(json.loads(out))
    reference = statistics.median(results[trees[0][0]])
    for label, values in results.items():
        median = statistics.median(values)
        spread = ", ".join(f"{value:.1f}" for value in values)
        print(f"{label:>8}: {median:6.1f} CPU us per call (x{median / reference:.2f}); runs: {spread}")


if __name__ == "__main__":
    main()
