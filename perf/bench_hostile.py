#!/usr/bin/env python3
"""Well-behaved clients under attack: perf_analyzer's throughput on the identity model
at concurrency 16, alone and while hostile clients run against the same server.

The attack, from this process: ``--slowloris`` connections (200) each trickling a request
head one byte per second (reconnecting when the server's header timeout closes them), and
one client sending a ``--json-mb`` (60) MB JSON request again and again (nereid parses it
in its decode process, then refuses it: the identity model takes [16]). Quiet and attacked
runs are interleaved ``--repeats`` times; the medians and their ratio are printed.

    .venv/bin/python perf/bench_hostile.py                  # 3 pairs, about 3 minutes
    .venv/bin/python perf/bench_hostile.py --repeats 1 --measurement-interval 2000

Uses bench_identity's server and perf_analyzer runner. Exit status as bench_identity's.
The same over gRPC, one hostile HTTP/2 client at a time: bench_hostile_grpc.py.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_identity as bench  # noqa: E402


class Attack:
    """The hostile clients, on two threads of this process, until ``stop``."""

    def __init__(self, port: int, slowloris: int, json_mb: int) -> None:
        self.port = port
        self.slowloris = slowloris
        self.stop_event = threading.Event()
        values = [0.5] * (json_mb * 1_000_000 // 5)  # "0.5, " is 5 bytes
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)],
                                       "data": values}]}).encode()
        self.heavy = (f"POST /v2/models/{bench.MODEL}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
                      "\r\n\r\n").encode() + body
        self.heavy_answers: dict[str, int] = {}
        self.reconnects = 0
        self._threads = [threading.Thread(target=self._trickle, daemon=True),
                         threading.Thread(target=self._send_heavy, daemon=True)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self._threads:
            thread.join(30)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nX-Slow: ")
        sock.setblocking(False)
        return sock

    def _trickle(self) -> None:
        selector = selectors.DefaultSelector()
        socks = [self._connect() for _ in range(self.slowloris)]
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while not self.stop_event.wait(1.0):
            for key, _ in selector.select(0):  # answered (408) or closed: a fresh one
                sock = key.fileobj
                selector.unregister(sock)
                sock.close()  # type: ignore[union-attr]
                socks.remove(sock)  # type: ignore[arg-type]
                fresh = self._connect()
                socks.append(fresh)
                selector.register(fresh, selectors.EVENT_READ)
                self.reconnects += 1
            for sock in socks:
                try:
                    sock.send(b"y")
                except OSError:
                    pass
        for sock in socks:
            sock.close()

    def _send_heavy(self) -> None:
        while not self.stop_event.is_set():
            with socket.create_connection(("127.0.0.1", self.port), timeout=120) as sock:
                sock.sendall(self.heavy)
                answer = b""
                while b"\r\n" not in answer:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            status = answer.split(b" ", 2)[1].decode() if answer.count(b" ") >= 2 else "closed"
            self.heavy_answers[status] = self.heavy_answers.get(status, 0) + 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--repeats", type=int, default=3, help="quiet/attacked pairs")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--slowloris", type=int, default=200, help="connections trickling their heads")
    p.add_argument("--json-mb", type=int, default=60, help="size of the heavy JSON request, MB")
    p.add_argument("--measurement-interval", type=int, default=4000, help="perf_analyzer -p, ms")
    p.add_argument("--nereid-arg", action="append", default=[], help="extra `nereid serve` argument")
    p.add_argument("--nereid-cmd", default=None,
                   help="command that runs nereid (another build, as bench_identity's --nereid-cmd)")
    args = p.parse_args(argv)
    # what bench_identity's server and runner read
    pa_args = bench.parse_args(["--concurrency", str(args.concurrency),
                                "--measurement-interval", str(args.measurement_interval)])
    pa_args.nereid_arg = args.nereid_arg
    pa_args.nereid_cmd = args.nereid_cmd
    if not Path(pa_args.perf_analyzer).exists():
        bench.log(f"{pa_args.perf_analyzer} not found; install with `make perf-analyzer`")
        return 2
    work = Path(tempfile.mkdtemp(prefix="nereid-hostile-"))
    server = bench.Nereid(work, pa_args)
    quiet: list[float] = []
    attacked: list[float] = []
    try:
        server.start(pa_args.start_timeout)
        for rep in range(args.repeats):
            run = bench.run_level(pa_args, server, args.concurrency, rep, work)
            if not run.ok:
                bench.log(f"quiet run failed: {run.error}")
                return 1
            quiet.append(run.throughput)
            attack = Attack(server.port, args.slowloris, args.json_mb)
            attack.start()
            time.sleep(2.0)  # let the attack settle: the slowloris connections are open
            run = bench.run_level(pa_args, server, args.concurrency, rep + 1000, work)
            attack.stop()
            if not run.ok:
                bench.log(f"attacked run failed: {run.error}")
                return 1
            attacked.append(run.throughput)
            bench.log(f"pair {rep + 1}: quiet {quiet[-1]:,.0f} infer/s, attacked {attacked[-1]:,.0f} infer/s "
                      f"({attacked[-1] / quiet[-1]:.0%}); heavy answers {attack.heavy_answers}, "
                      f"slowloris reconnects {attack.reconnects}")
    finally:
        server.stop()
    q, a = statistics.median(quiet), statistics.median(attacked)
    print(f"concurrency {args.concurrency}: quiet {q:,.0f} infer/s, under attack {a:,.0f} infer/s "
          f"({a / q:.0%} kept; medians of {args.repeats}; {args.slowloris} slowloris connections and "
          f"one {args.json_mb} MB JSON client)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
