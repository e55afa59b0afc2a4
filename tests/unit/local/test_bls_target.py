"""ServerBls: a Triton model's BLS request runs through the server's endpoint on its loop
and comes back as a pb_utils response (outputs narrowed to the requested names, a
NereidError as the response's error); without a running server there is no BLS."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Iterator

import numpy as np
import pytest

from nereid.errors import ModelNotFoundError
from nereid.local import ServerBls
from nereid.triton_python import pb_utils

pytestmark = pytest.mark.unit


class DoublingEndpoint:
    """A LocalEndpoint that doubles X for model "double", counts to N for "count", and
    knows no other model; it records the options each request came with."""

    def __init__(self) -> None:
        self.options: list[dict[str, Any]] = []

    async def infer(self, model: str, inputs: dict[str, Any], **options: Any) -> dict[str, np.ndarray]:
        self.options.append(options)
        if model != "double":
            raise ModelNotFoundError(f"Request for unknown model: '{model}' is not found", model=model)
        return {"Y": inputs["X"] * 2, "EXTRA": np.zeros(1)}

    async def stream(self, model: str, inputs: dict[str, Any], **options: Any) -> AsyncIterator[dict[str, np.ndarray]]:
        if model != "count":
            raise ModelNotFoundError(f"Request for unknown model: '{model}' is not found", model=model)
        for step in range(int(inputs["N"][0])):
            yield {"STEP": np.array([step])}


def request(model: str, name: str, value: list[int], wanted: tuple[str, ...] = (), **kwargs: Any) -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest(model_name=model, inputs=[pb_utils.Tensor(name, np.array(value))],
                                     requested_output_names=list(wanted), **kwargs)


@pytest.fixture
def bound() -> Iterator[tuple[ServerBls, DoublingEndpoint]]:
    """A ServerBls bound to a DoublingEndpoint on a loop running on its own thread (as the
    server's loop runs while model threads call exec())."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    target, endpoint = ServerBls(), DoublingEndpoint()
    target.bind(endpoint, loop)  # type: ignore[arg-type]
    yield target, endpoint
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)
    loop.close()


def test_a_request_runs_on_the_servers_loop_and_returns_the_requested_outputs(
    bound: tuple[ServerBls, DoublingEndpoint],
) -> None:
    target, endpoint = bound
    response = target.infer(request("double", "X", [1, 2], wanted=("Y",), timeout=500, model_version=3))
    assert not response.has_error()
    assert [(t.name(), t.as_numpy().tolist()) for t in response.output_tensors()] == [("Y", [2, 4])]
    assert endpoint.options == [{"version": 3, "parameters": {}, "timeout_us": 500}]


def test_a_failed_request_is_a_response_carrying_the_error(bound: tuple[ServerBls, DoublingEndpoint]) -> None:
    response = bound[0].infer(request("nowhere", "X", [1]))
    assert response.has_error() and response.error() is not None
    assert response.error().message() == "Request for unknown model: 'nowhere' is not found"


def test_a_stream_yields_each_step_then_ends(bound: tuple[ServerBls, DoublingEndpoint]) -> None:
    steps = [r.output_tensors()[0].as_numpy().tolist() for r in bound[0].stream(request("count", "N", [3]))]
    assert steps == [[0], [1], [2]]


def test_exec_on_the_servers_own_loop_is_refused_in_favour_of_async_exec() -> None:
    target = ServerBls()

    async def on_the_loop() -> str:
        target.bind(DoublingEndpoint(), asyncio.get_running_loop())  # type: ignore[arg-type]
        with pytest.raises(pb_utils.TritonModelException) as caught:
            target.infer(request("double", "X", [1]))
        answer = await target.ainfer(request("double", "X", [5]))
        assert answer.output_tensors()[0].as_numpy().tolist() == [10]
        return str(caught.value)

    assert asyncio.run(on_the_loop()) == "exec() cannot wait on the server's event loop: use async_exec()"


def test_without_a_running_server_there_is_no_bls() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="BLS is not available here: the server is not running"):
        ServerBls().infer(request("double", "X", [1]))
