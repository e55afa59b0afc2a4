#!/usr/bin/env python3
"""Ray Serve's batching tutorial, against nereid: nine prompts sent to text_generator at
once (nine threads, one /generate request each). The server batches them (up to four
prompts generated together); each prompt still gets its own text. Then the batch sizes
the server formed, from the statistics endpoint.

    python clients/parallel_queries.py --url 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
from pathlib import Path

import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _generate import generate  # noqa: E402

PROMPTS = [
    "Once upon a time,",
    "Hi my name is Lewis and I like to",
    "My name is Mary, and my favorite",
    "My name is Clara and I am",
    "My name is Julien and I like to",
    "Today I accidentally",
    "My greatest wish is to",
    "In a galaxy far far away",
    "My best talent is",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="server host:port (default 127.0.0.1:8000)")
    parser.add_argument("--model", default="text_generator")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    def query(prompt: str) -> str:
        body = {"text_input": prompt, "max_tokens": args.max_tokens}
        return str(generate(args.url, args.model, body)["text_output"])

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(query, PROMPTS))
    for prompt, text in zip(PROMPTS, results):
        print(f"{prompt!r} -> {text!r}")

    client = httpclient.InferenceServerClient(args.url)
    try:
        stats = client.get_inference_statistics(args.model)["model_stats"][0]
    finally:
        client.close()
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    formed = ", ".join(f"{count} x {size}" for size, count in sorted(sizes.items())) or "none"
    print(f"batches formed by the server (count x size, since it started): {formed}")
    print(f"largest batch: {max(sizes, default=0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
