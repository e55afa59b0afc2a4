"""What a model can do works the same in a process instance (``isolation = "process"``):
streaming from sync and async generators, ``batch_size`` as the cost, request parameters,
``close()``, warmup, ``max_concurrent_batches`` with an ``async def infer``, STRING inputs
and outputs, torch tensors as outputs, ``pad_value``. Runs whatever ``--isolation`` says:
every model here chooses its isolation itself."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import RepoBuilder, RunningServer, start_server
from tests.waiting import wait_until

PROCESS = """
[[instance_group]]
count = 1
kind = "KIND_CPU"
isolation = "process"
"""

FP32_4 = """
max_batch_size = {max_batch}
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [{dims}]
{pad}
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [{dims}]
"""


def fp32(max_batch: int = 8, dims: str = "4", pad: str = "", batching: str | None = None) -> str:
    """A FP32 INPUT0 -> OUTPUT0 config in one process instance; ``batching``: the
    [dynamic_batching] keys (none: no batcher)."""
    config = FP32_4.format(max_batch=max_batch, dims=dims, pad=pad)
    if batching is not None and max_batch > 0:
        config += "[dynamic_batching]\n" + batching + "\n"
    return config + PROCESS


# -- the models --------------------------------------------------------------------------

STREAM_CONFIG = fp32(max_batch=0) + """
[model_transaction_policy]
decoupled = true
"""

#: Three steps (x, x + 1, x + 2), the last one flagged finished; for a negative x, x and
#: then a step of the wrong shape.
STREAM_SYNC = """
import numpy as np
import nereid

class Model:
    def infer(self, inputs):
        x = inputs["INPUT0"]
        if x[0] < 0:
            yield {"OUTPUT0": x}
            yield {"OUTPUT0": x[:2]}
        for step in range(3):
            yield {"OUTPUT0": x + step, nereid.FINISHED: np.array([step == 2])}
"""

STREAM_ASYNC = """
import asyncio
import numpy as np
import nereid

class Model:
    async def infer(self, inputs):
        x = inputs["INPUT0"]
        for step in range(3):
            await asyncio.sleep(0.01)
            yield {"OUTPUT0": x + step, nereid.FINISHED: np.array([step == 2])}
"""

#: Each row costs 4 against max_batch_size 8: two one-row requests fill a batch. The
#: size of every batch goes to the file "batches".
COST = """
import pathlib

class Model:
    def __init__(self, context):
        self.log = pathlib.Path(context.model_dir) / "batches"

    def batch_size(self, inputs):
        return 4 * len(inputs["INPUT0"])

    def infer(self, inputs):
        with open(self.log, "a") as log:
            log.write(f"{len(inputs['INPUT0'])}\\n")
        return {"OUTPUT0": inputs["INPUT0"]}
"""

PARAMETERS = """
import numpy as np

class Model:
    def infer(self, inputs, parameters):
        # one dict of request parameters per row of the batch
        scale = np.array([[float(p.get("scale", 1))] for p in parameters], np.float32)
        return {"OUTPUT0": inputs["INPUT0"] * scale}
"""

#: An async model whose infer raises SystemExit (a BaseException, awaited on the
#: process's event loop) for a first value of 1.
ASYNC_RAISES = """
import asyncio

class Model:
    async def infer(self, inputs):
        await asyncio.sleep(0)
        if inputs["INPUT0"][0, 0] == 1:
            raise SystemExit(3)
        return {"OUTPUT0": inputs["INPUT0"]}
"""

CLOSING = """
import pathlib

class Model:
    def __init__(self, context):
        self.folder = pathlib.Path(context.model_dir)

    def infer(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}

    def close(self):
        (self.folder / "closed").write_text("closed")
"""

WARMUP_CONFIG = fp32() + """
[[model_warmup]]
name = "zeros"
batch_size = 2
count = 3
inputs.INPUT0 = { data_type = "TYPE_FP32", dims = [4], zero_data = true }
"""

#: Answers how many rows it saw before this batch: the warmup's 3 runs of 2 rows.
WARMUP = """
import numpy as np

class Model:
    def __init__(self, context):
        self.rows = 0

    def infer(self, inputs):
        x = inputs["INPUT0"]
        seen, self.rows = self.rows, self.rows + len(x)
        return {"OUTPUT0": np.full_like(x, seen)}
"""

CONCURRENT_CONFIG = fp32(max_batch=1, batching="max_concurrent_batches = 2")

#: Waits (up to 10 s) until two of its batches run at once; answers the most it saw.
CONCURRENT = """
import asyncio
import numpy as np

class Model:
    def __init__(self, context):
        self.running = self.peak = 0
        self.two_at_once = None

    async def infer(self, inputs):
        if self.two_at_once is None:
            self.two_at_once = asyncio.Event()  # made on the loop that runs infer
        self.running += 1
        self.peak = max(self.peak, self.running)
        if self.peak >= 2:
            self.two_at_once.set()
        try:
            try:
                await asyncio.wait_for(self.two_at_once.wait(), 10)
            except asyncio.TimeoutError:
                pass  # never two at once: the peak (1) says so
            return {"OUTPUT0": np.full_like(inputs["INPUT0"], self.peak)}
        finally:
            self.running -= 1
"""

STRINGS_CONFIG = """
max_batch_size = 8
[[input]]
name = "TEXT"
data_type = "TYPE_STRING"
dims = [1]
[[output]]
name = "UPPER"
data_type = "TYPE_STRING"
dims = [1]
[[output]]
name = "LENGTH"
data_type = "TYPE_INT32"
dims = [1]
[dynamic_batching]
""" + PROCESS

#: str out (nested lists of str: encoded as UTF-8), lengths of the bytes in.
STRINGS = """
import numpy as np

class Model:
    def infer(self, inputs):
        texts = [item.decode("utf-8") for item in inputs["TEXT"][:, 0]]
        return {
            "UPPER": [[text.upper()] for text in texts],
            "LENGTH": np.array([[len(item)] for item in inputs["TEXT"][:, 0]], np.int32),
        }
"""

TORCH = """
import torch

class Model:
    def infer(self, inputs):
        return {"OUTPUT0": torch.from_numpy(inputs["INPUT0"]) * 2}
"""

PADDED_CONFIG = fp32(dims="-1", pad="pad_value = 0", batching="max_queue_delay_microseconds = 5000000")

#: x * 2; the shape of each batch goes to the file "shapes".
PADDED = """
import pathlib

class Model:
    def __init__(self, context):
        self.log = pathlib.Path(context.model_dir) / "shapes"

    def infer(self, inputs):
        x = inputs["INPUT0"]
        with open(self.log, "a") as log:
            log.write(f"{list(x.shape)}\\n")
        return {"OUTPUT0": x * 2}
"""

MODELS = {
    "stream_sync": (STREAM_CONFIG, STREAM_SYNC),
    "stream_async": (STREAM_CONFIG, STREAM_ASYNC),
    "cost": (fp32(batching="max_queue_delay_microseconds = 5000000"), COST),
    "parameters": (fp32(batching="max_queue_delay_microseconds = 5000000"), PARAMETERS),
    "warmup": (WARMUP_CONFIG, WARMUP),
    "concurrent": (CONCURRENT_CONFIG, CONCURRENT),
    "strings": (STRINGS_CONFIG, STRINGS),
    "torch_out": (fp32(), TORCH),
    "padded": (PADDED_CONFIG, PADDED),
    "async_raises": (fp32(), ASYNC_RAISES),
    "closing": (fp32(), CLOSING),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = RepoBuilder(tmp_path_factory.mktemp("models"))
    for name, (config, model) in MODELS.items():
        repo.add(name, config, model)
    running = start_server(repo.root, "--model-control-mode", "explicit", "--load-model", "*",
                           log_dir=tmp_path_factory.mktemp("log"))
    yield running
    if not running.stopped:
        running.stop()


def folder(server: RunningServer, model: str) -> Path:
    command = server.process.args
    assert isinstance(command, list)
    return Path(command[command.index("--model-repository") + 1]) / model


def infer(server: RunningServer, model: str, data: np.ndarray, **kwargs: Any) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        return client.infer(model, [tensor], **kwargs).as_numpy("OUTPUT0")  # type: ignore[no-any-return]
    finally:
        client.close()


def concurrently(calls: list[Any]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return [future.result(timeout=60) for future in [pool.submit(call) for call in calls]]


def workers(server: RunningServer) -> list[int]:
    result = subprocess.run(["pgrep", "-P", str(server.process.pid), "-f", "nereid.instances.worker"],
                            capture_output=True, text=True, check=False)
    return [int(pid) for pid in result.stdout.split()]


# -- the tests ---------------------------------------------------------------------------


def test_every_model_runs_in_a_process_of_its_own(server: RunningServer) -> None:
    assert len(workers(server)) == len(MODELS)


def stream(server: RunningServer, model: str, values: list[float]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{server.http}/v2/models/{model}/generate_stream",
                      json={"INPUT0": values}, timeout=60) as response:
        assert response.status_code == 200
        return [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]


@pytest.mark.parametrize("model", ["stream_sync", "stream_async"])
def test_a_decoupled_generator_streams_its_steps_through_generate_stream(server: RunningServer, model: str) -> None:
    events = stream(server, model, [1, 2, 3, 4])
    assert [event["OUTPUT0"] for event in events] == [[1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]]


def test_a_step_of_the_wrong_shape_ends_its_stream_and_the_next_stream_is_whole(server: RunningServer) -> None:
    events = stream(server, "stream_sync", [-1, 2, 3, 4])
    assert [event.get("OUTPUT0") for event in events] == [[-1, 2, 3, 4], None]
    assert events[1] == {"error": 'model "stream_sync", output "OUTPUT0": expected shape [4] (dims [4]), got [2]'}
    # the process was told to close that generator: the next stream gets its own steps
    assert [event["OUTPUT0"] for event in stream(server, "stream_sync", [1, 2, 3, 4])] == [
        [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]]


def test_batch_size_is_the_cost_of_a_request(server: RunningServer) -> None:
    # 4 one-row requests, each costing 4 against max_batch_size 8: two batches of two
    # (by rows, all four would share one batch within the 5 s queue delay)
    arrays = [np.full((1, 4), i, np.float32) for i in range(4)]
    results = concurrently([lambda a=a: infer(server, "cost", a) for a in arrays])
    for array, result in zip(arrays, results):
        np.testing.assert_array_equal(result, array)
    assert (folder(server, "cost") / "batches").read_text().split() == ["2", "2"]


def test_request_parameters_reach_infer_one_dict_per_row(server: RunningServer) -> None:
    ones = np.ones((2, 4), np.float32)
    results = concurrently([lambda s=s: infer(server, "parameters", ones, parameters={"scale": s}) for s in (1, 2, 3)])
    for scale, result in zip((1, 2, 3), results):
        np.testing.assert_array_equal(result, ones * scale)


def test_warmup_runs_in_the_process_before_the_model_is_ready(server: RunningServer) -> None:
    # 3 warmup runs of a batch of 2 rows went through the process's Model first
    np.testing.assert_array_equal(infer(server, "warmup", np.ones((1, 4), np.float32)), np.full((1, 4), 6, np.float32))


def test_an_async_model_runs_max_concurrent_batches_at_once(server: RunningServer) -> None:
    ones = np.ones((1, 4), np.float32)
    results = concurrently([lambda: infer(server, "concurrent", ones)] * 2)
    for result in results:  # each batch saw the other one running (2): they ran at once
        np.testing.assert_array_equal(result, np.full((1, 4), 2, np.float32))


def test_string_inputs_and_outputs(server: RunningServer) -> None:
    texts = np.array([["héllo"], ["wörld"], [""]], dtype=object)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("TEXT", [3, 1], "BYTES")
        tensor.set_data_from_numpy(texts)
        result = client.infer("strings", [tensor])
    finally:
        client.close()
    assert result.as_numpy("UPPER").tolist() == [["HÉLLO".encode()], ["WÖRLD".encode()], [b""]]
    assert result.as_numpy("LENGTH").tolist() == [[6], [6], [0]]


def test_a_torch_tensor_is_an_output(server: RunningServer) -> None:
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = infer(server, "torch_out", data)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, data * 2)


def test_inputs_of_different_lengths_share_a_batch_padded_with_pad_value(server: RunningServer) -> None:
    arrays = [np.ones((1, n), np.float32) for n in (2, 3, 4, 5, 2, 3, 4, 5)]
    results = concurrently([lambda a=a: infer(server, "padded", a) for a in arrays])
    for array, result in zip(arrays, results):
        # rows come back padded to the longest in the batch: the request's own part is intact
        np.testing.assert_array_equal(result[:, : array.shape[1]], array * 2)
        assert np.all(result[:, array.shape[1]:] == 0)
    assert (folder(server, "padded") / "shapes").read_text().split("\n")[:-1] == ["[8, 5]"]


def test_a_base_exception_in_an_async_infer_fails_only_its_request(server: RunningServer) -> None:
    with pytest.raises(InferenceServerException) as caught:
        infer(server, "async_raises", np.ones((1, 4), np.float32))
    assert caught.value.message() == 'model "async_raises" raised in infer: SystemExit: 3'
    # the process's event loop goes on
    np.testing.assert_array_equal(infer(server, "async_raises", np.zeros((1, 4), np.float32)),
                                  np.zeros((1, 4), np.float32))


def test_unloading_calls_close_in_the_process_and_ends_it(server: RunningServer) -> None:
    np.testing.assert_array_equal(infer(server, "closing", np.ones((1, 4), np.float32)), np.ones((1, 4), np.float32))
    before = workers(server)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        client.unload_model("closing")
        wait_until(lambda: not client.is_model_ready("closing") and len(workers(server)) == len(before) - 1,
                   f"the model unloaded and its worker ended (workers before: {before})", every=0.05)
    finally:
        client.close()
    assert (folder(server, "closing") / "closed").read_text() == "closed"
