"""A front-end worker's CPU per infer request on its side of the link, without HTTP and
without the main process: a real ``MainLink`` (forwarding.py) on a real arena, handed
perf_analyzer's identity request (binary FP32 [1, 16]) as the native engine hands it
over, and fed the RESULTS the main process would send for each group of ``--group``
requests. Beside it, the same decode and the same answer alone (decoding.py's ``decode``
and ``answer``: what N = 1 spends too), so the difference is what the link adds to a
worker: the arena block, the template, the DECODED message, and on the way back the
RESULTS taken apart and the block freed.

    PYTHONPATH=$PWD/server python perf/worker_work.py [--requests 60000] [--group 12] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import tomllib
from typing import Any

import numpy as np

from bench_identity import CONFIG_TOML  # the benchmark's identity model, as it writes it

from nereid.config.load import parse_model_config
from nereid.frontends.arena import Arena
from nereid.frontends.decoding import Announced, answer, decode
from nereid.frontends.forwarding import MainLink
from nereid.frontends.layout import row_signature, rows_size, write_rows
from nereid.frontends.messages import Kind, frame
from nereid.http.infer import InferHeaders

_HEADER = json.dumps({
    "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}],
    "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
}).encode()
_BODY = _HEADER + np.arange(16, dtype=np.float32).tobytes()
_HEADERS = InferHeaders([(b"inference-header-content-length", str(len(_HEADER)).encode()),
                         (b"content-length", str(len(_BODY)).encode())])
_MAX_JSON = 64 * 1024 * 1024


class _Responder:
    """The engine's connection: counts answers, writes nothing."""

    def __init__(self) -> None:
        self.answers = 0

    def reply(self, status: int, headers: Any, body: bytes) -> None:
        self.answers += 1

    def reply_repeat(self, headers: Any, parts: list[Any]) -> None:
        self.answers += 1


class _Transport:
    def write(self, data: bytes) -> None:
        pass


async def measure(requests: int, group: int) -> tuple[float, float, float, float]:
    """(link out, link in, decode alone, answer alone), µs of this thread's CPU per request."""
    config = parse_model_config(tomllib.loads(CONFIG_TOML.format(queue_delay_us=0)), source="bench",
                                folder_name="identity")
    model = Announced.of(1, 1, config, {})
    arena = Arena.create()
    link = MainLink(arena, None)  # type: ignore[arg-type]  # no directory: nothing here reads it
    link.connection_made(_Transport())
    link.models["identity"] = model
    responder = _Responder()
    rows = np.arange(16 * group, dtype=np.float32).reshape(group, 16)
    signed = row_signature({"OUTPUT0": rows})
    assert signed is not None
    signature = signed[0]
    out_s = in_s = 0.0
    done = 0
    while done < requests:
        started = time.thread_time()
        ids = []
        for _ in range(group):
            call = link.start_infer("identity", None, _HEADERS, _BODY, 0, responder)
            assert call is not None
            ids.append(call.id)
        link._outbox.flush()  # type: ignore[union-attr]  # the turn's frame, as the loop would
        sent = time.thread_time()
        layout = write_rows(arena.answers[0:rows_size(signature, group)], signature, group, [{"OUTPUT0": rows}])
        results = frame((Kind.RESULTS.value, 1, 0, layout, tuple((id, 1) for id in ids)))
        answering = time.thread_time()
        link.data_received(results)
        in_s += time.thread_time() - answering
        out_s += sent - started
        done += group
    assert responder.answers == done, "every request answered through the link"
    started = time.thread_time()
    for _ in range(requests):
        decoded = decode(model, "identity", _HEADERS, _BODY, _MAX_JSON)
    decoded_s = time.thread_time() - started
    assert decoded is not None
    outputs = {"OUTPUT0": rows[0:1]}
    started = time.thread_time()
    for _ in range(requests):
        answer(model, "identity", decoded.request, None, 1, outputs, responder)
    answer_s = time.thread_time() - started
    link.connection_lost(None)
    arena.close()
    return out_s / done * 1e6, in_s / done * 1e6, decoded_s / requests * 1e6, answer_s / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=60_000)
    p.add_argument("--group", type=int, default=12, help="requests per RESULTS message")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    results = [asyncio.run(measure(args.requests, args.group)) for _ in range(args.repeats)]
    for out_us, in_us, decode_us, answer_us in results:
        print(f"through the link: out {out_us:5.2f} us, in {in_us:5.2f} us per request; "
              f"alone: decode {decode_us:5.2f} us, answer {answer_us:5.2f} us")
    out_us, in_us, decode_us, answer_us = (statistics.median(r[index] for r in results) for index in range(4))
    print(f"median: the link adds {out_us - decode_us:.2f} us out and {in_us - answer_us:.2f} us in, "
          f"{out_us + in_us - decode_us - answer_us:.2f} us per request in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
