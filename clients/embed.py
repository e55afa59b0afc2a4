#!/usr/bin/env python3
"""Sentence embeddings from text_embedder (all-MiniLM-L6-v2), as in mixedbread's
``batched`` tutorial: single sentences one request each, then many sentences sent
concurrently, still one sentence per request (the server forms the batches). Prints shapes,
elapsed time, the cosine similarity of two sentences and the batch sizes the server formed.

    python clients/embed.py --url 127.0.0.1:8000 [--count 1000] [--concurrency 64]

The concurrent part uses tritonclient's asyncio client (tritonclient.http.aio) with
``--concurrency`` requests in flight over as many connections. Not the gevent client's
``async_infer``: that call sleeps 10 ms after sending each request (gevent.sleep(0.01) in
tritonclient), so it sends at most ~100 requests/s whatever its concurrency, few requests
are ever queued together, and the server has almost nothing to batch.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue today."]


def request_for(sentence: str) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[sentence.encode("utf-8")]], dtype=object))
    return [tensor]


def batches_by_size(stats: dict[str, Any]) -> dict[int, int]:
    """{batch size: batches executed} from the statistics endpoint's model_stats entry."""
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}


async def run(args: argparse.Namespace) -> int:
    client = aioclient.InferenceServerClient(args.url, conn_limit=args.concurrency)
    try:
        start = time.monotonic()
        single = []
        for sentence in SENTENCES:
            result = await client.infer(args.model, request_for(sentence))
            single.append(result.as_numpy("EMBEDDING")[0])
        elapsed = time.monotonic() - start
        print(f"single sentences: {len(single)} embeddings of shape {single[0].shape} in {elapsed * 1000:.0f} ms")
        for sentence, vector in zip(SENTENCES[1:], single[1:]):
            print(f"similarity({SENTENCES[0]!r}, {sentence!r}) = {float(single[0] @ vector):.4f}")

        before = batches_by_size((await client.get_inference_statistics(args.model))["model_stats"][0])
        batch = [f"{SENTENCES[i % len(SENTENCES)]} (sentence {i})" for i in range(args.count)]
        in_flight = asyncio.Semaphore(args.concurrency)

        async def embed(sentence: str) -> np.ndarray:
            async with in_flight:
                result = await client.infer(args.model, request_for(sentence))
            return np.asarray(result.as_numpy("EMBEDDING")[0])

        start = time.monotonic()
        vectors = np.stack(await asyncio.gather(*(embed(s) for s in batch)))
        elapsed = time.monotonic() - start
        after = batches_by_size((await client.get_inference_statistics(args.model))["model_stats"][0])
    finally:
        await client.close()
    print(f"concurrent batch: {len(batch)} sentences -> embeddings of shape {vectors.shape} "
          f"in {elapsed:.2f} s ({len(batch) / elapsed:.0f} sentences/s, {args.concurrency} requests in flight)")
    # The server is shared: other clients' batches in the same window would be counted too.
    formed = {size: after[size] - before.get(size, 0) for size in sorted(after) if after[size] > before.get(size, 0)}
    listed = ", ".join(f"{count} x {size}" for size, count in formed.items()) or "none"
    print(f"batches formed by the server (count x size): {listed}")
    batches = sum(formed.values())
    print(f"{sum(size * count for size, count in formed.items())} requests in {batches} batches: "
          f"mean {len(batch) / max(batches, 1):.1f}, largest {max(formed, default=0)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="server host:port (default 127.0.0.1:8000)")
    parser.add_argument("--model", default="text_embedder")
    parser.add_argument("--count", type=int, default=1000, help="sentences sent concurrently (default 1000)")
    parser.add_argument("--concurrency", type=int, default=64,
                        help="requests in flight at once, one sentence each (default 64, the model's max_batch_size)")
    args = parser.parse_args()
    if args.concurrency < 1 or args.count < 1:
        parser.error("--count and --concurrency must be at least 1")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
