#!/usr/bin/env python3
"""Thread vs process instances, measured by stock perf_analyzer in one run.

Two questions (issue: process instances):

1. What does ``isolation = "process"`` cost on the identity model (FP32 [16], one
   instance, dynamic batching)? Ratio process / thread at each concurrency.
2. Does it buy parallelism for a CPU-bound pure-Python model (a Python loop per row,
   ~2 ms)? Throughput of 2 instances over 1, for threads (the GIL: ~1x) and processes.

One nereid server holds every variant; perf_analyzer drives one model at a time, the
variants interleaved in each repetition; medians are printed with their ratios.

    .venv/bin/python perf/bench_isolation.py [--repeats 3] [--concurrency 16,64]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PERF_ANALYZER = REPO / "perf" / "perf_analyzer"

IDENTITY = """
max_batch_size = 64
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [16]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [16]
[dynamic_batching]
[[instance_group]]
count = {count}
kind = "KIND_CPU"
isolation = "{isolation}"
"""

IDENTITY_PY = """
class Model:
    def infer(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""

# A CPU-bound pure-Python model: a Python loop per row (no numpy, no released GIL).
PYLOOP_PY = """
class Model:
    def infer(self, inputs):
        x = inputs["INPUT0"]
        out = x.copy()
        for row in range(x.shape[0]):
            total = 0
            for i in range({loops}):
                total += i % 7
            out[row, 0] = total
        return {{"OUTPUT0": out}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_repo(root: Path, loops: int) -> list[str]:
    names = []
    for isolation in ("thread", "process"):
        name = f"identity_{isolation}"
        (root / name).mkdir()
        (root / name / "config.toml").write_text(IDENTITY.format(count=1, isolation=isolation))
        (root / name / "model.py").write_text(IDENTITY_PY)
        names.append(name)
        for count in (1, 2):
            name = f"pyloop_{isolation}_{count}"
            (root / name).mkdir()
            (root / name / "config.toml").write_text(IDENTITY.format(count=count, isolation=isolation))
            (root / name / "model.py").write_text(PYLOOP_PY.format(loops=loops))
            names.append(name)
    return names


def perf(url: str, model: str, concurrency: int, interval_ms: int) -> float:
    """Throughput (infer/s) of one perf_analyzer run, NaN when it failed."""
    cmd = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", "http", "-b", "1",
           "--concurrency-range", str(concurrency), "-p", str(interval_ms), "-s", "20", "--max-trials", "6"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    match = re.search(r"Throughput: ([0-9.]+) infer/sec", result.stdout)
    if result.returncode != 0 or match is None:
        print(f"[bench] {model} c={concurrency}: perf_analyzer failed:\n{result.stdout[-600:]}{result.stderr[-600:]}",
              file=sys.stderr)
        return float("nan")
    return float(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="16,64", help="identity levels (default 16,64)")
    parser.add_argument("--cpu-concurrency", type=int, default=8, help="pyloop level (default 8)")
    parser.add_argument("--loops", type=int, default=40000, help="Python loop iterations per row (default 40000)")
    parser.add_argument("--interval", type=int, default=3000, help="perf_analyzer -p, ms (default 3000)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-isolation-") as tmp:
        root = Path(tmp) / "repo"
        root.mkdir()
        write_repo(root, args.loops)
        port = free_port()
        nereid = REPO / ".venv" / "bin" / "nereid"
        command = [str(nereid) if nereid.exists() else sys.executable, *([] if nereid.exists() else ["-m", "nereid"]),
                   "serve", "--model-repository", str(root), "--http-port", str(port), "--metrics-port", str(free_port()),
                   "--grpc-port", str(free_port())]
        log = open(Path(tmp) / "server.log", "wb")
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    print((Path(tmp) / "server.log").read_text(), file=sys.stderr)
                    return 1
                time.sleep(0.2)
            url = f"127.0.0.1:{port}"
            results: dict[tuple[str, int], list[float]] = {}
            cases = [(f"identity_{iso}", c) for c in levels for iso in ("thread", "process")]
            cases += [(f"pyloop_{iso}_{n}", args.cpu_concurrency) for iso in ("thread", "process") for n in (1, 2)]
            for repeat in range(args.repeats):
                for model, concurrency in cases:
                    value = perf(url, model, concurrency, args.interval)
                    results.setdefault((model, concurrency), []).append(value)
                    print(f"[bench] r{repeat} {model} c={concurrency}: {value:,.0f} infer/s "
                          f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        finally:
            server.terminate()
            server.wait(30)
    med = {key: statistics.median(values) for key, values in results.items()}
    print(f"\nmedians of {args.repeats} (infer/s), 2-core host shared with perf_analyzer\n")
    print("| identity, 1 instance | thread | process | process / thread |")
    print("| ---: | ---: | ---: | ---: |")
    for c in levels:
        t, p = med[("identity_thread", c)], med[("identity_process", c)]
        print(f"| c={c} | {t:,.0f} | {p:,.0f} | {p / t:.2f}x |")
    c = args.cpu_concurrency
    print(f"\n| pyloop ({args.loops} Python iterations per row), c={c} | 1 instance | 2 instances | 2 / 1 |")
    print("| --- | ---: | ---: | ---: |")
    for iso in ("thread", "process"):
        one, two = med[(f"pyloop_{iso}_1", c)], med[(f"pyloop_{iso}_2", c)]
        print(f"| {iso} | {one:,.1f} | {two:,.1f} | {two / one:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
