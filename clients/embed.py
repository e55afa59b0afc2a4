#!/usr/bin/env python3
"""Sentence embeddings from text_embedder (all-MiniLM-L6-v2), as in mixedbread's
``batched`` tutorial: single sentences one request each, then a batch of many sentences
sent concurrently (the server forms the batches). Prints shapes, elapsed time and the
cosine similarity of two sentences.

    python clients/embed.py --url 127.0.0.1:8000 [--count 1000]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import tritonclient.http as httpclient

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue today."]


def request_for(sentence: str) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[sentence.encode("utf-8")]], dtype=object))
    return [tensor]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="server host:port (default 127.0.0.1:8000)")
    parser.add_argument("--model", default="text_embedder")
    parser.add_argument("--count", type=int, default=1000, help="sentences in the concurrent batch (default 1000)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight at once (default 64)")
    args = parser.parse_args()

    client = httpclient.InferenceServerClient(args.url, concurrency=args.concurrency)
    try:
        start = time.monotonic()
        single = [client.infer(args.model, request_for(s)).as_numpy("EMBEDDING")[0] for s in SENTENCES]
        elapsed = time.monotonic() - start
        print(f"single sentences: {len(single)} embeddings of shape {single[0].shape} in {elapsed * 1000:.0f} ms")
        for sentence, vector in zip(SENTENCES[1:], single[1:]):
            print(f"similarity({SENTENCES[0]!r}, {sentence!r}) = {float(single[0] @ vector):.4f}")

        batch = [f"{SENTENCES[i % len(SENTENCES)]} (sentence {i})" for i in range(args.count)]
        start = time.monotonic()
        pending = [client.async_infer(args.model, request_for(s)) for s in batch]
        vectors = np.stack([p.get_result().as_numpy("EMBEDDING")[0] for p in pending])
        elapsed = time.monotonic() - start
        print(f"concurrent batch: {len(batch)} sentences -> embeddings of shape {vectors.shape} "
              f"in {elapsed:.2f} s ({len(batch) / elapsed:.0f} sentences/s)")
        stats = client.get_inference_statistics(args.model)["model_stats"][0]
    finally:
        client.close()
    sizes = [int(b["batch_size"]) for b in stats["batch_stats"]]
    print(f"batch sizes formed by the server: {len(sizes)} different, largest {max(sizes, default=0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
