"""Which of nereid's modules one infer request crosses, over HTTP and over gRPC.

Starts the server in this process (native engines, the example repository's ``add_one``
model, one thread instance), and for each path (HTTP with binary tensors, HTTP with JSON
tensors, gRPC) sends a few warm-up requests, then records every function
call made in a ``server/nereid`` module (all threads) while one more request is answered,
and prints the modules and packages it crossed. ``--json`` prints the same as JSON (the
unit test ``tests/unit/test_request_path.py`` reads it).

    python perf/request_path.py [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "server" / "nereid"
sys.path.insert(0, str(ROOT / "server"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Recorder:
    """A profile hook that notes the nereid module of each call while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.modules: set[str] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.on and event == "call":
            path = frame.f_code.co_filename
            if path.startswith(str(PACKAGE)):
                self.modules.add(_module_name(path))


def _module_name(path: str) -> str:
    relative = Path(path).relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else "nereid"


def measure() -> dict[str, Any]:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    import nereid

    recorder = Recorder()
    http_port, grpc_port = _free_port(), _free_port()
    server = nereid.Server(
        ROOT / "model_repository", http_port=http_port, grpc_port=grpc_port, metrics_port=0, allow_metrics=False,
        model_control_mode="explicit", load_model=("add_one",), log_verbose=0,
    )
    loop = asyncio.new_event_loop()
    threading.setprofile(recorder)
    thread = threading.Thread(target=lambda: loop.run_until_complete(_serve(server)), daemon=True)
    thread.start()
    results: dict[str, Any] = {}
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        _wait_ready(http)
        # "http": binary tensors, the memo's path once warm; "http_json": JSON tensors,
        # which the memo never plans (the full parser and encoder every time)
        paths = (("http", http, httpclient, True), ("http_json", http, httpclient, False), ("grpc", grpc, grpcclient, True))
        for name, client, module, binary in paths:
            tensor = module.InferInput("INPUT0", [1, 1], "INT64")
            if binary:
                tensor.set_data_from_numpy(np.array([[41]], np.int64))
            else:
                tensor.set_data_from_numpy(np.array([[41]], np.int64), binary_data=False)
            for _ in range(5):
                client.infer("add_one", [tensor])
            recorder.modules = set()
            recorder.on = True
            answer = client.infer("add_one", [tensor])
            recorder.on = False
            assert answer.as_numpy("OUTPUT0").tolist() == [[42]]
            modules = sorted(recorder.modules)
            results[name] = {"modules": modules, "packages": sorted({_package(m) for m in modules})}
        grpc.close()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        loop.call_soon_threadsafe(server.shutdown)
        thread.join(30)
    return results


async def _serve(server: Any) -> None:
    sys.setprofile(threading.getprofile())
    await server.serve()


def _wait_ready(client: Any) -> None:
    import time

    for _ in range(600):
        try:
            if client.is_model_ready("add_one"):
                return
        except Exception:
            pass
        time.sleep(0.1)  # a bounded poll of the server's start
    raise SystemExit("the server did not become ready in 60 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    results = measure()
    if args.json:
        print(json.dumps(results))
        return
    for name, found in results.items():
        print(f"{name}: {len(found['modules'])} modules in {len(found['packages'])} packages")
        for module in found["modules"]:
            print(f"  {module}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
