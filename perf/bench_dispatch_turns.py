#!/usr/bin/env python3
"""Why a model version's instances on one GPU take turns in ``infer`` (``DispatchTurns``).

A torch model on a GPU spends its ``infer`` queueing kernels from Python, and torch lets go
of the GIL at every operation. This measures the same mechanism on the CPU, where each
operation is short too: a small BERT (4 layers, hidden 64, 16 tokens, one intra-op thread)
run back to back by one thread, by two threads at once (two instances in one process), and
by two threads taking turns through one lock (what nereid's instances on one CUDA device
do). Prints forwards per second for each, per repeat, and the ratios to one thread.

    .venv/bin/python perf/bench_dispatch_turns.py --repeats 3

Needs torch and transformers (the examples extra).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forwards", type=int, default=300, help="forwards per thread per run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch
    from transformers import BertConfig, BertModel

    torch.set_num_threads(1)
    config = BertConfig(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=128,
                        vocab_size=1000)
    models = [BertModel(config).eval() for _ in range(2)]
    ids = torch.randint(0, 1000, (1, 16))

    def forwards(model: Any, count: int, turn: threading.Lock | None) -> None:
        with torch.inference_mode():
            for _ in range(count):
                if turn is None:
                    model(input_ids=ids)
                else:
                    with turn:
                        model(input_ids=ids)

    def rate(threads: int, turn: threading.Lock | None = None, count: int = args.forwards) -> float:
        workers = [threading.Thread(target=forwards, args=(models[i], count, turn)) for i in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return threads * count / (time.perf_counter() - started)

    rate(1, count=50)  # warm-up
    runs: dict[str, list[float]] = {"1 thread": [], "2 threads at once": [], "2 threads taking turns": []}
    for repeat in range(args.repeats):
        runs["1 thread"].append(rate(1))
        runs["2 threads at once"].append(rate(2))
        runs["2 threads taking turns"].append(rate(2, threading.Lock()))
        print(f"repeat {repeat + 1}: " + ", ".join(f"{name} {values[-1]:,.0f}/s" for name, values in runs.items()))
    one = statistics.median(runs["1 thread"])
    for name, values in runs.items():
        median = statistics.median(values)
        print(f"{name:<24} {median:8,.0f} forwards/s (median)  {median / one:5.2f}x one thread")


if __name__ == "__main__":
    main()
