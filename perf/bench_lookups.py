#!/usr/bin/env python3
"""Benchmark health, metadata and config requests through nereid's front-end workers
(``--http-workers``): requests per second and CPU time per request of the main process and
of the workers, for this build and optionally another one, interleaved.

Since the workers answer these from their picture of the models (frontends/local_answers.py)
the main process should spend nothing on them; before, each was forwarded to it (one hop).
A model that does nothing (``add_one``-like, thread instances) is served; clients are
``--clients`` threads, each on its own keep-alive connection, sending one GET after another
for ``--seconds`` (on a small machine the clients take a core: compare CPU per request,
not only requests per second).

    PYTHONPATH=$PWD/server python perf/bench_lookups.py --repeats 3 \\
        --baseline-pythonpath /tmp/before/server        # e.g. `git archive <commit> server | tar -x -C /tmp/before`

Exit status: 0 all runs succeeded; 1 a server did not start.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CONFIG = """\
name = "lookup"
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [4]
"""

MODEL = """\
class Model:
    def infer(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""

PATHS = ("/v2/health/ready", "/v2/models/lookup", "/v2/models/lookup/config")
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _get(sock: socket.socket, path: str) -> None:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(pythonpath: str, repository: Path, path: str, args: argparse.Namespace) -> tuple[float, float, float]:
    """(requests/s, main process CPU us per request, workers' CPU us per request)."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=pythonpath)
    server = subprocess.Popen(
        [sys.executable, "-m", "nereid", "serve", "--model-repository", str(repository), "--http-port", str(port),
         "--allow-grpc", "false", "--allow-metrics", "false", "--http-workers", str(args.workers)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port)) as sock:
                    _get(sock, "/v2/health/ready")
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"the server ({pythonpath}) did not start") from None
                time.sleep(0.1)
        time.sleep(1.0)  # the workers have their picture of the models
        workers = _children(server.pid)
        counts = [0] * args.clients
        stop = time.monotonic() + args.seconds

        def client(index: int) -> None:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                while time.monotonic() < stop:
                    _get(sock, path)
                    counts[index] += 1

        main0, workers0, start = _cpu(server.pid), sum(_cpu(pid) for pid in workers), time.monotonic()
        threads = [threading.Thread(target=client, args=(index,)) for index in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        main1, workers1, end = _cpu(server.pid), sum(_cpu(pid) for pid in workers), time.monotonic()
        total = sum(counts)
        return total / (end - start), 1e6 * (main1 - main0) / total, 1e6 * (workers1 - workers0) / total
    finally:
        server.terminate()
        server.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", nargs="+", default=list(PATHS))
    parser.add_argument("--baseline-pythonpath", default=None, help="another build's server/ folder, run interleaved")
    args = parser.parse_args()
    builds = {"this": os.environ.get("PYTHONPATH", str(Path(__file__).resolve().parent.parent / "server"))}
    if args.baseline_pythonpath:
        builds = {"baseline": args.baseline_pythonpath, **builds}
    runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder)
        (repository / "lookup" / "1").mkdir(parents=True)
        (repository / "lookup" / "config.toml").write_text(CONFIG)
        (repository / "lookup" / "1" / "model.py").write_text(MODEL)
        for repeat in range(args.repeats):
            for path in args.paths:
                for name, pythonpath in builds.items():
                    figures = measure(pythonpath, repository, path, args)
                    runs.setdefault((name, path), []).append(figures)
                    print(f"repeat {repeat + 1} {name:8s} {path:28s} {figures[0]:8.0f} req/s  main {figures[1]:6.1f} "
                          f"us/req  workers {figures[2]:6.1f} us/req  (load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"\nmedians of {args.repeats}, --http-workers {args.workers}, {args.clients} clients:")
    print(f"{'build':8s} {'path':28s} {'req/s':>8s} {'main us/req':>12s} {'workers us/req':>15s}")
    for (name, path), figures in runs.items():
        rate, main_us, workers_us = (statistics.median(column) for column in zip(*figures))
        print(f"{name:8s} {path:28s} {rate:8.0f} {main_us:12.1f} {workers_us:15.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
