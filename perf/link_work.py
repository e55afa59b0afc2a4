"""The main process's CPU per infer request that came through a front-end worker, without
HTTP and without the worker: the identity model behind a real ``WorkerLink`` (the
batcher, the instance and its thread, the arena, the frames), fed DECODED frames by a
stand-in worker in the same loop that keeps ``--concurrency`` requests in flight.

The stand-in's own work (making frames, reading the answers) is timed apart and taken
out, so what is printed is the main process's side of ``--http-workers N`` alone: the
loop thread's CPU per request and the whole process's (the instance thread too). On a
host shared with other work these move far less than a perf_analyzer run's figures; run
it with another build's ``server/`` first on PYTHONPATH to compare builds.

    PYTHONPATH=$PWD/server python perf/link_work.py [--requests 200000] [--concurrency 64] [--frame 12]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench_identity import CONFIG_TOML, MODEL_PY  # the benchmark's identity model, as it writes it

from nereid.frontends.arena import Arena, Ring
from nereid.frontends.link import WorkerLink
from nereid.frontends.messages import FrameReader, Kind, frame
from nereid.local import InProcessServer

_LAYOUT = (("INPUT0", 0, "<f4", (1, 16)),)
#: (rows, outputs, parameters, priority, timeout_us, binary_data_output, layout): decoding.py's template
_TEMPLATE = (1, None, (), 0, None, True, _LAYOUT)
_DECODED, _MODEL, _RESULTS, _RESULT, _ANSWER, _FREED = (
    Kind.DECODED.value, Kind.MODEL.value, Kind.RESULTS.value, Kind.RESULT.value, Kind.ANSWER.value, Kind.FREED.value)


class StandIn:
    """The worker's end: sends DECODED frames of at most ``frame`` requests, one per loop
    turn, a new request for each one answered, and FREED for each answer block read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, concurrency: int, frame_size: int, total: int,
                 capacity: int) -> None:
        self.loop = loop
        self.frame_size = frame_size
        self.total = total
        self.sent = 0
        self.answered = 0
        self.own_s = 0.0  # this stand-in's thread CPU, taken out of the figures
        self.reader = FrameReader()
        self.link: WorkerLink | None = None
        self.token = 0
        self.template_sent = False
        self.in_flight = 0
        self.concurrency = concurrency
        self.ring = Ring(capacity)  # blocks of the arena's request half, handed out as a worker's ring does
        self.block_of: dict[int, int] = {}
        self.freed: list[int] = []
        self.done: asyncio.Future[None] = loop.create_future()
        self.ready: asyncio.Future[None] = loop.create_future()

    # the link's transport
    def write(self, data: bytes) -> None:
        started = time.thread_time()
        for message in self.reader.feed(data):
            kind = message[0]
            if kind == _MODEL:
                self.token = message[2]
                if not self.ready.done():
                    self.ready.set_result(None)
            elif kind == _RESULTS:
                self.freed.append(message[2])
                for id, _ in message[4]:
                    self._answered(id)
            elif kind == _RESULT:
                if message[3] >= 0:
                    self.freed.append(message[3])
                self._answered(message[1])
            elif kind == _ANSWER:
                raise RuntimeError(f"request {message[1]} failed: {message[6]!r}")
        self.loop.call_soon(self.send)
        self.own_s += time.thread_time() - started

    def _answered(self, id: int) -> None:
        self.ring.free(self.block_of.pop(id))
        self.in_flight -= 1
        self.answered += 1
        if self.answered == self.total and not self.done.done():
            self.done.set_result(None)

    def send(self) -> None:
        """One frame: FREED for the answer blocks read, then up to ``frame_size`` requests."""
        started = time.thread_time()
        messages: list[tuple[Any, ...]] = []
        if self.freed:
            messages.append((_FREED, self.freed))
            self.freed = []
        now = time.monotonic_ns()
        while self.in_flight < self.concurrency and len(messages) < self.frame_size and self.sent < self.total:
            offset = self.ring.allocate(64)
            assert offset is not None
            self.sent += 1
            self.in_flight += 1
            self.block_of[self.sent] = offset
            template = None if self.template_sent else _TEMPLATE
            self.template_sent = True
            messages.append((_DECODED, self.sent, self.token, 0, template, offset, "", now))
        if self.in_flight < self.concurrency and self.sent < self.total:
            self.loop.call_soon(self.send)  # the next frame on the next loop turn
        data = frame(*messages) if messages else b""
        self.own_s += time.thread_time() - started
        if data and self.link is not None:
            self.link.data_received(data)


async def measure(args: argparse.Namespace, repository: Path) -> tuple[float, float, float]:
    """(loop thread µs, process µs, mean batch) per request over one run."""
    loop = asyncio.get_running_loop()
    async with InProcessServer(str(repository)) as server:
        manager = server.manager
        app = SimpleNamespace(endpoints=SimpleNamespace(infer_endpoint=SimpleNamespace(manager=manager),
                                                        start_infer=lambda *args: None))
        arena = Arena.create()
        stand_in = StandIn(loop, args.concurrency, args.frame, args.requests, len(arena.requests))
        link = WorkerLink(app, arena, {}, 0)  # type: ignore[arg-type]
        link.connection_made(SimpleNamespace(write=stand_in.write, close=lambda: None))
        stand_in.link = link
        # a raw request first, so the link announces the model (its token)
        link.data_received(frame((Kind.INFER.value, 0, "identity", None, (None, None, None), 0, -1, 0, b"")))
        await stand_in.ready
        stats = manager.latest["identity"].stats
        batches0 = stats.execution_count
        thread0, process0 = time.thread_time(), time.process_time()
        stand_in.send()
        await stand_in.done
        thread_s, process_s = time.thread_time() - thread0, time.process_time() - process0
        batches = stats.execution_count - batches0
        link.close()
        arena.close()
    n = args.requests
    own = stand_in.own_s
    return (thread_s - own) / n * 1e6, (process_s - own) / n * 1e6, n / batches if batches else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    p.add_argument("--frame", type=int, default=12, help="requests per DECODED frame at most")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nereid-link-work-") as work:
        folder = Path(work) / "identity"
        folder.mkdir()
        (folder / "config.toml").write_text(CONFIG_TOML.format(queue_delay_us=0))
        (folder / "model.py").write_text(MODEL_PY)
        try:
            import uvloop
        except ImportError:  # pragma: no cover
            run = asyncio.run
        else:
            run = uvloop.run
        results = [run(measure(args, Path(work))) for _ in range(args.repeats)]
    for thread_us, process_us, batch in results:
        print(f"loop thread {thread_us:5.2f} us/request, process {process_us:5.2f} us/request, mean batch {batch:.1f}")
    print(f"median: loop thread {statistics.median(r[0] for r in results):.2f} us, "
          f"process {statistics.median(r[1] for r in results):.2f} us per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
