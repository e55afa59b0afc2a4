"""nereid through Ray Serve (1 and 2 replicas) next to nereid direct, on this machine.

For each round, each configuration in turn (direct, --ray-replicas 1, --ray-replicas 2)
serves a repository holding the identity benchmark model and the example text_embedder;
stock perf_analyzer measures identity at concurrency 1 and 16 and text_embedder at 16
(one short sentence per request). Medians over the rounds, and each configuration's
ratio to direct measured in the same rounds: the cost of Ray's proxy, and what a second
replica adds for a compute-bound model on the same cores.

Run: .venv/bin/python perf/bench_ray.py [--rounds 2] [--window-ms 3000]
"""

from __future__ import annotations

import argparse
import re
import shutil
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
IDENTITY_TOML = """
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
"""
IDENTITY_PY = """
class Model:
    def infer(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""
CONFIGS = {"direct": [], "ray-1": ["--ray-replicas", "1", "--ray-replica-cpus", "0.5"],
           "ray-2": ["--ray-replicas", "2", "--ray-replica-cpus", "0.5"]}
LOADS = [("identity", 1, []), ("identity", 16, []),
         ("text_embedder", 16, ["--string-data", "the quick brown fox jumps over the lazy dog"])]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(repo: Path, extra: list[str], log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    command = [sys.executable, "-m", "nereid", "serve", "--model-repository", str(repo), "--http-port", str(port),
               "--grpc-port", str(free_port()), "--metrics-port", str(free_port()), *extra]
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(extra) or 'direct'} exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    return process, port
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"not ready: {log.read_text()[-2000:]}")


def measure(port: int, model: str, concurrency: int, extra: list[str], window_ms: int) -> tuple[float, float]:
    command = [str(PERF_ANALYZER), "-m", model, "-u", f"127.0.0.1:{port}", "-i", "http", "-b", "1",
               "--concurrency-range", str(concurrency), "-p", str(window_ms), "-s", "20", "--max-trials", "8", *extra]
    output = subprocess.run(command, capture_output=True, text=True, timeout=600).stdout
    throughput = re.search(r"Throughput: ([\d.]+) infer/sec", output)
    p50 = re.search(r"p50 latency: (\d+) usec", output)
    if throughput is None or p50 is None:
        raise RuntimeError(f"perf_analyzer: {output[-2000:]}")
    return float(throughput.group(1)), float(p50.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-ms", type=int, default=3000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nereid-ray-bench-"))
    repo = work / "models"
    (repo / "identity").mkdir(parents=True)
    (repo / "identity" / "config.toml").write_text(IDENTITY_TOML)
    (repo / "identity" / "model.py").write_text(IDENTITY_PY)
    shutil.copytree(REPO / "model_repository" / "text_embedder", repo / "text_embedder")
    results: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for round_ in range(args.rounds):
        for name, extra in CONFIGS.items():
            process, port = serve(repo, extra, work / f"{name}-{round_}.log")
            try:
                for model, concurrency, pa_extra in LOADS:
                    measure(port, model, concurrency, pa_extra, 1000)  # warm-up, untimed
                    figure = measure(port, model, concurrency, pa_extra, args.window_ms)
                    results.setdefault((name, model, concurrency), []).append(figure)
                    print(f"[ray-bench] round {round_ + 1} {name:7} {model:14} c={concurrency:<3} "
                          f"{figure[0]:9.1f} infer/s  p50 {figure[1]:8.0f} us", flush=True)
            finally:
                process.terminate()
                process.wait(120)
    print(f"\n{'config':8} {'model':14} {'conc':>4} {'infer/s':>10} {'p50 us':>8} {'vs direct':>10}")
    for model, concurrency, _ in LOADS:
        direct = statistics.median(t for t, _ in results[("direct", model, concurrency)])
        for name in CONFIGS:
            runs = results[(name, model, concurrency)]
            throughput = statistics.median(t for t, _ in runs)
            p50 = statistics.median(p for _, p in runs)
            print(f"{name:8} {model:14} {concurrency:>4} {throughput:>10,.1f} {p50:>8,.0f} {throughput / direct:>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
