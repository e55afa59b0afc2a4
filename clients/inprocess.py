#!/usr/bin/env python3
"""The in-process handle: load the repository in this Python process and infer without
HTTP, through the same batcher (Ray Serve's handle, Triton's in-process API).

    .venv/bin/python clients/inprocess.py [--repository model_repository]
"""

from __future__ import annotations

import argparse
import concurrent.futures
from pathlib import Path

import numpy as np

import nereid

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", default=str(ROOT / "model_repository"))
    args = parser.parse_args()

    # Explicit mode loads just the models this script uses.
    with nereid.Server(args.repository, model_control_mode="explicit", load_model=("add_one",)) as server:
        single = server.infer("add_one", {"INPUT0": np.array([[41]], dtype=np.int64)})
        print(f"add_one(41) = {int(single['OUTPUT0'][0, 0])}")

        # Nine callers at once: the batcher runs them together (max_batch_size = 4).
        with concurrent.futures.ThreadPoolExecutor(9) as pool:
            results = list(pool.map(lambda n: int(server.infer("add_one", {"INPUT0": [[n]]})["OUTPUT0"][0, 0]), range(9)))
        print(f"numbers 0..8 -> {results}")
        stats = server.manager.get("add_one").stats.snapshot()
        sizes = {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats["batch_stats"]}
        print(f"batches formed (batch size: count): {sizes}")


if __name__ == "__main__":
    main()
