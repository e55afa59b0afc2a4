"""The event loop's work per infer request over HTTP (the identity model): loop
iterations, futures resolved, queue decisions and tasks created per request, the loop
thread's CPU time per request, and the mean batch. Counts, not speed: they move little
with the host's load, so two builds compare on a busy machine.

Starts the server in this process on a plain asyncio loop (the counts hook its
``_run_once``; uvloop runs the same callbacks) and profiles the loop thread while
``--requests`` sequential requests come from a client thread (``--no-profile``: only the
iterations and the CPU time, unprofiled), or, with ``--concurrency C`` above 1, while
perf_analyzer (perf/perf_analyzer) sends at concurrency C for a few windows. Another
build: run it with that build's ``server/`` first on PYTHONPATH.

    PYTHONPATH=$PWD/server python perf/loop_work.py [--requests 2000] [--concurrency 16] [--no-profile]
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.base_events
import cProfile
import pstats
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from bench_identity import CONFIG_TOML, MODEL_PY, free_port  # the benchmark's identity model, as it writes it


class LoopWork:
    """Counts the loop's iterations and profiles its thread between ``start`` and ``stop``
    (both called on the loop)."""

    def __init__(self, profile: bool) -> None:
        self.iterations = 0
        self.profile = cProfile.Profile() if profile else None
        self.cpu_s = 0.0
        self.counted = 0
        original = asyncio.base_events.BaseEventLoop._run_once

        def run_once(loop: Any) -> None:
            self.iterations += 1
            original(loop)

        asyncio.base_events.BaseEventLoop._run_once = run_once  # type: ignore[method-assign]

    def start(self) -> None:
        self.counted = -self.iterations
        self.cpu_s = -time.thread_time()
        if self.profile is not None:
            self.profile.enable()

    def stop(self) -> None:
        if self.profile is not None:
            self.profile.disable()
        self.cpu_s += time.thread_time()
        self.counted += self.iterations

    def calls(self, matches: Callable[[tuple[str, int, str]], bool]) -> int:
        assert self.profile is not None
        stats: dict[Any, Any] = pstats.Stats(self.profile).stats  # type: ignore[attr-defined]
        return sum(value[1] for key, value in stats.items() if matches(key))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--no-profile", action="store_true", help="count iterations and CPU time only")
    parser.add_argument("--concurrency", type=int, default=1, help="above 1: perf_analyzer at this concurrency")
    args = parser.parse_args()

    import numpy as np
    import tritonclient.http as httpclient

    import nereid

    repo = Path(tempfile.mkdtemp()) / "model_repository"
    (repo / "identity" / "1").mkdir(parents=True)
    (repo / "identity" / "config.toml").write_text(CONFIG_TOML.format(queue_delay_us=0))
    (repo / "identity" / "1" / "model.py").write_text(MODEL_PY)
    http_port = free_port()
    server = nereid.Server(repo, http_port=http_port, grpc_port=free_port(), metrics_port=0,
                           allow_metrics=False, allow_grpc=False, log_verbose=0)
    work = LoopWork(profile=not args.no_profile)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(server.serve()), daemon=True)
    thread.start()

    def on_loop(fn: Callable[[], None]) -> None:
        done = threading.Event()
        loop.call_soon_threadsafe(lambda: (fn(), done.set()))
        done.wait()

    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    for _ in range(600):  # a bounded poll of the server's start
        try:
            if client.is_model_ready("identity"):
                break
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(0.1)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32), binary_data=True)
    for _ in range(200):  # warm-up
        client.infer("identity", [tensor])
    stats = server.manager.get("identity").stats
    before = (stats.inference_count, stats.execution_count)
    on_loop(work.start)
    if args.concurrency > 1:
        subprocess.run(
            [str(Path(__file__).resolve().parent / "perf_analyzer"), "-m", "identity", "-u", f"127.0.0.1:{http_port}",
             "-i", "http", "-b", "1", "--concurrency-range", str(args.concurrency), "-p", "2000",
             "--max-trials", "3", "-s", "1000"],
            check=True, capture_output=True,
        )
    else:
        for _ in range(args.requests):
            client.infer("identity", [tensor])
    on_loop(work.stop)
    n = stats.inference_count - before[0]
    batches = stats.execution_count - before[1]
    line = (f"c={args.concurrency}: {n} requests in {batches} batches (mean {n / batches:.2f}), "
            f"per request: loop iterations {work.counted / n:.2f}")
    if work.profile is not None:
        set_results = work.calls(lambda key: key[2] == "<method 'set_result' of '_asyncio.Future' objects>")
        decisions = work.calls(lambda key: key[2] == "decide" and key[0].endswith("queue.py"))
        tasks = work.calls(lambda key: key[2] in ("create_task", "ensure_future"))
        line += (f", Future.set_result {set_results / n:.2f}, queue decisions {decisions / n:.2f}, "
                 f"tasks created {tasks / n:.2f}; loop thread CPU {work.cpu_s / n * 1e6:.0f} us (profiled)")
    else:
        line += f"; loop thread CPU {work.cpu_s / n * 1e6:.1f} us"
    print(line)
    loop.call_soon_threadsafe(server.shutdown)
    thread.join(10)


if __name__ == "__main__":
    main()
