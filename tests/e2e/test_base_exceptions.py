"""Model code that raises a BaseException that is not an Exception (SystemExit,
KeyboardInterrupt, GeneratorExit, a CancelledError of its own) fails only its batch,
like any exception: the client gets ``model "m" raised in infer: SystemExit: 3`` (500),
a batch is retried one request at a time, and the instance, its worker and the event
loop go on: the same model answers the next request, the others serve throughout,
readiness stays true and the server still stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid.scheduling.batcher import DynamicBatcher
from nereid.errors import InternalError, UnavailableError
from nereid.stats import ModelStats
from tests.conftest import IDENTITY_CONFIG, RepoBuilder, RunningServer, start_server
from tests.waiting import wait_until

#: What each INPUT0 value (its first element) makes the model raise; 0 raises nothing.
RAISES = {
    1: ("SystemExit(3)", "SystemExit: 3"),
    2: ("KeyboardInterrupt()", "KeyboardInterrupt"),
    3: ("GeneratorExit()", "GeneratorExit"),
    4: ("asyncio.CancelledError('by the model')", "CancelledError: by the model"),
}
CODES = {1: "SystemExit", 2: "KeyboardInterrupt", 3: "GeneratorExit", 4: "CancelledError"}

_RAISE = """
import asyncio
import pathlib

import numpy as np

import nereid

RAISES = {raises}


def fail(x):
    code = int(x.reshape(-1)[0])
    if code in RAISES:
        raise eval(RAISES[code])
"""

SYNC_MODEL = _RAISE.format(raises={k: v[0] for k, v in RAISES.items()}) + """

class Model:
    def __init__(self, context):
        self.batches = pathlib.Path(context.model_dir) / "batches"

    def infer(self, inputs):
        x = inputs["INPUT0"]
        with open(self.batches, "a") as log:
            log.write(f"{len(x)}\\n")
        for row in x:
            fail(row)
        return {"OUTPUT0": x}

    def batch_size(self, inputs):
        if int(inputs["INPUT0"].reshape(-1)[0]) == 9:
            raise SystemExit(9)
        return len(inputs["INPUT0"])
"""

ASYNC_MODEL = _RAISE.format(raises={k: v[0] for k, v in RAISES.items()}) + """

class Model:
    def __init__(self, context):
        pass

    async def infer(self, inputs):
        await asyncio.sleep(0)
        fail(inputs["INPUT0"])
        return {"OUTPUT0": inputs["INPUT0"]}

    def close(self):
        raise SystemExit("from close")
"""

STREAM_CONFIG = IDENTITY_CONFIG.replace("max_batch_size = 8", "max_batch_size = 0") + """
[model_transaction_policy]
decoupled = true
"""

#: A decoupled model: one step, then (for a failing value) the BaseException; a value
#: above 10 raises before the first step.
STREAM_MODEL = _RAISE.format(raises={k: v[0] for k, v in RAISES.items()}) + """

class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        x = inputs["INPUT0"]
        if x[0] > 10:
            fail(x - 10)
        yield {"OUTPUT0": x}
        fail(x)
        yield {"OUTPUT0": x + 1, nereid.FINISHED: np.array([True])}
"""

ASTREAM_MODEL = STREAM_MODEL.replace("def infer", "async def infer")

BATCH_CONFIG = IDENTITY_CONFIG + """
[dynamic_batching]
preferred_batch_size = [4]
max_queue_delay_microseconds = 30000000
"""

ENGINES = ["native", "uvicorn"]


@pytest.fixture(scope="module", params=ENGINES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("models")
    repo = RepoBuilder(root)
    repo.add("sync_m", IDENTITY_CONFIG, model=SYNC_MODEL)
    repo.add("async_m", IDENTITY_CONFIG, model=ASYNC_MODEL)
    repo.add("stream_m", STREAM_CONFIG, model=STREAM_MODEL)
    repo.add("astream_m", STREAM_CONFIG, model=ASTREAM_MODEL)
    repo.add("batch_m", BATCH_CONFIG, model=SYNC_MODEL)
    repo.add("other", IDENTITY_CONFIG)
    running = start_server(root, "--model-control-mode", "explicit", "--load-model", "*",
                           log_dir=tmp_path_factory.mktemp("log"), engine=request.param)
    yield running
    if not running.stopped:
        running.stop()


def infer(server: RunningServer, model: str, value: float, rows: int = 1) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    try:
        x = httpclient.InferInput("INPUT0", [rows, 4], "FP32")
        data = np.full((rows, 4), value, np.float32)
        x.set_data_from_numpy(data)
        return client.infer(model, [x]).as_numpy("OUTPUT0")  # type: ignore[no-any-return]
    finally:
        client.close()


def refused(server: RunningServer, model: str, value: float) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        infer(server, model, value)
    return caught.value


def status(server: RunningServer, path: str) -> int:
    try:
        with urllib.request.urlopen(server.http + path, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def assert_all_serving(server: RunningServer) -> None:
    """Every model answers a good request, and the server and each model are ready."""
    assert status(server, "/v2/health/ready") == 200
    for model in ("sync_m", "async_m", "other"):
        assert status(server, f"/v2/models/{model}/ready") == 200
        assert infer(server, model, 0.5).tolist() == [[0.5] * 4]
    for model in ("stream_m", "astream_m"):
        assert status(server, f"/v2/models/{model}/ready") == 200
        response = httpx.post(f"{server.http}/v2/models/{model}/generate", json={"INPUT0": [0.5] * 4}, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["OUTPUT0"] == [1.5] * 4


@pytest.mark.parametrize("model", ["sync_m", "async_m"])
@pytest.mark.parametrize("code", sorted(RAISES))
def test_a_base_exception_in_infer_fails_that_request_only(server: RunningServer, model: str, code: int) -> None:
    error = refused(server, model, code)
    assert error.status() == "500"
    assert error.message() == f'model "{model}" raised in infer: {RAISES[code][1]}'
    assert_all_serving(server)


@pytest.mark.parametrize("model", ["stream_m", "astream_m"])
@pytest.mark.parametrize("code", sorted(RAISES))
def test_a_base_exception_in_a_decoupled_generator_fails_that_stream_only(
    server: RunningServer, model: str, code: int
) -> None:
    expected = f'model "{model}" raised in infer: {RAISES[code][1]}'
    # before the first step: a JSON error with its status
    response = httpx.post(f"{server.http}/v2/models/{model}/generate", json={"INPUT0": [code + 10] * 4}, timeout=30)
    assert response.status_code == 500
    assert response.json() == {"error": expected}
    # after the first step: the step, then an error event
    with httpx.stream("POST", f"{server.http}/v2/models/{model}/generate_stream",
                      json={"INPUT0": [code] * 4}, timeout=30) as streamed:
        assert streamed.status_code == 200
        events = [json.loads(line[len("data: "):]) for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[0]["OUTPUT0"] == [float(code)] * 4
    assert events[1:] == [{"error": expected}]
    assert_all_serving(server)


def test_in_a_batch_only_the_request_whose_input_raises_fails(server: RunningServer) -> None:
    values = [0.25, 1, 0.5, 0.75]  # 1: SystemExit(3)
    with concurrent.futures.ThreadPoolExecutor(len(values)) as pool:
        futures = [pool.submit(infer, server, "batch_m", value) for value in values]
        outcomes: list[Any] = []
        for future in futures:
            try:
                outcomes.append(future.result(timeout=60).tolist())
            except InferenceServerException as exc:
                outcomes.append((exc.status(), exc.message()))
    assert outcomes == [
        [[0.25] * 4],
        ("500", 'model "batch_m" raised in infer: SystemExit: 3'),
        [[0.5] * 4],
        [[0.75] * 4],
    ]
    # batch_m logs the size of each batch it is given: the four together, then one each.
    sizes = [int(line) for line in (_model_folder(server, "batch_m") / "batches").read_text().split()]
    assert sizes == [4, 1, 1, 1, 1], sizes
    assert_all_serving(server)


def test_a_base_exception_in_batch_size_fails_that_request_only(server: RunningServer) -> None:
    error = refused(server, "sync_m", 9)
    assert error.status() == "500"
    assert "Model.batch_size(inputs) raised SystemExit: 9" in error.message()
    assert_all_serving(server)


def test_a_base_exception_in_close_does_not_stop_the_unload(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    try:
        client.unload_model("async_m")
        wait_until(lambda: not client.is_model_ready("async_m"), "async_m unloaded", every=0.05)
        client.load_model("async_m")
        assert client.is_model_ready("async_m")
    finally:
        client.close()
    assert_all_serving(server)
    assert "SystemExit: from close" in server.log()


def test_a_base_exception_in_init_is_a_failed_load(server: RunningServer) -> None:
    folder = _model_folder(server, "init_m")
    RepoBuilder(folder.parent).add("init_m", IDENTITY_CONFIG, model=(
        "class Model:\n    def __init__(self, context):\n        raise SystemExit(5)\n"
        "    def infer(self, inputs):\n        return inputs\n"
    ))
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("init_m")
        assert caught.value.status() == "500"
        assert "Model.__init__ failed for instance" in caught.value.message()
        assert "init_m_0: SystemExit: 5" in caught.value.message()
        client.unload_model("init_m")  # what failed to load, unloaded: the server is ready again
    finally:
        client.close()
    assert_all_serving(server)


def test_the_server_stops_cleanly_on_sigterm(server: RunningServer) -> None:
    assert_all_serving(server)
    assert server.stop() == 0
    log = server.log()
    assert "Task exception was never retrieved" not in log
    assert "Exception in callback" not in log


def _model_folder(server: RunningServer, model: str) -> Path:
    command = server.process.args
    assert isinstance(command, list)
    root = Path(command[command.index("--model-repository") + 1])
    return root / model


# -- in process: the batcher contains whatever an instance raises ---------------------------


class _Raising:
    """An instance whose run_batch raises ``raises`` (then doubles), or waits at ``gate``."""

    name = "raising_0"
    capacity = 1
    cost_function = None
    problem = None
    enforces_timeout = False
    queues_batches = False

    def __init__(self, raises: list[BaseException], gate: asyncio.Event | None = None) -> None:
        self.raises = raises
        self.gate = gate
        self.entered = asyncio.Event()

    async def run_batch(self, items: Any) -> Any:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.raises:
            raise self.raises.pop(0)
        return _Outcome([item * 2 for item in items])


class _Outcome:
    def __init__(self, outputs: list[Any]) -> None:
        self.outputs = outputs
        self.error = None
        self.compute_input_ns = self.compute_infer_ns = self.compute_output_ns = 0
        self.began_ns = self.ended_ns = 0


def _batcher(instance: Any) -> DynamicBatcher:
    return DynamicBatcher(model_name="m", max_batch_size=0, dynamic_batching=None, instances=[instance],
                          stats=ModelStats("m", 1))


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt(), GeneratorExit(),
                                    asyncio.CancelledError("not a cancellation"), ValueError("a bug")])
def test_what_an_instance_raises_fails_its_batch_and_the_worker_goes_on(raised: BaseException) -> None:
    async def main() -> None:
        async with _batcher(_Raising([raised])) as batcher:
            with pytest.raises(InternalError) as caught:
                await batcher.infer(1)
            text = str(raised)
            assert caught.value.message == f"internal error in model 'm': {type(raised).__name__}" + (
                f": {text}" if text else "")
            assert await batcher.infer(2) == 4  # the same worker, still there

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_loop_cancelling_a_worker_is_not_contained() -> None:
    async def main() -> None:
        instance = _Raising([], gate=asyncio.Event())  # the gate never opens
        batcher = _batcher(instance)
        await batcher.__aenter__()
        running = asyncio.create_task(batcher.infer(1))
        await instance.entered.wait()
        queued = asyncio.create_task(batcher.infer(2))
        await batcher.aclose(drain_timeout=0.05)  # cancels the worker stuck in run_batch
        with pytest.raises(UnavailableError):
            await queued
        # the batch that was running is answered as abandoned at the unload, never with an
        # InternalError "CancelledError" (its worker was cancelled, not failed)
        with pytest.raises(UnavailableError, match="was unloaded while this request ran in it"):
            await running

    asyncio.run(asyncio.wait_for(main(), 30))
