#!/usr/bin/env python3
"""Ray Serve's BatchAdder, against nereid's add_one model: the numbers 0..8 sent at once
(nine concurrent requests with tritonclient's async_infer); the server batches them and
every caller gets its own number plus one. Then the batch sizes the server formed.

    python clients/batch_adder.py --url 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tritonclient.http as httpclient


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="server host:port (default 127.0.0.1:8000)")
    parser.add_argument("--model", default="add_one")
    args = parser.parse_args()

    numbers = list(range(9))
    client = httpclient.InferenceServerClient(args.url, concurrency=len(numbers))
    try:
        pending = []
        for n in numbers:
            tensor = httpclient.InferInput("INPUT0", [1, 1], "INT64")
            tensor.set_data_from_numpy(np.array([[n]], dtype=np.int64))
            pending.append(client.async_infer(args.model, [tensor]))
        results = [int(p.get_result().as_numpy("OUTPUT0")[0, 0]) for p in pending]
        stats = client.get_inference_statistics(args.model)["model_stats"][0]
    finally:
        client.close()
    for n, result in zip(numbers, results):
        print(f"{n} + 1 = {result}")
    print(f"results: {results}")
    if results != [n + 1 for n in numbers]:
        print("error: wrong results", file=sys.stderr)
        return 1
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    formed = ", ".join(f"{count} x {size}" for size, count in sorted(sizes.items())) or "none"
    print(f"batches formed by the server (count x size, since it started): {formed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
