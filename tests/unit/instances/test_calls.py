"""nereid.instances.calls over a real socket pair: the process's side (ServerCalls,
MetricsProxy, ProcessBls) on threads, the server's (CallServer) on an event loop, with the
real metrics registry and a fake BLS target."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

import numpy as np
import pytest

from nereid.custom_metrics import CLEARED, CustomMetrics, MetricError, MetricKind
from nereid.instances.call_server import CallServer
from nereid.instances.calls import MetricsProxy, ProcessBls, ServerCalls, pack_arrays, unpack_arrays
from nereid.instances.channel import Channel, socket_pair
from nereid.triton_python import pb_utils

T = TypeVar("T")


class EchoBls:
    """Answers ``double`` with X * 2, streams ``count`` N responses, fails anything else."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    def infer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        raise AssertionError("the server side awaits ainfer")

    def stream(self, request: pb_utils.InferenceRequest) -> Iterator[pb_utils.InferenceResponse]:
        raise AssertionError("the server side iterates astream")

    async def ainfer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        if request.model_name() != "double":
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(f"no model {request.model_name()}", pb_utils.TritonError.NOT_FOUND))
        x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
        return pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)])

    async def astream(self, request: pb_utils.InferenceRequest) -> AsyncIterator[pb_utils.InferenceResponse]:
        count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
        try:
            for step in range(count):
                yield pb_utils.InferenceResponse([pb_utils.Tensor("STEP", np.array([step], np.int32))])
            self.started.set()
            await asyncio.Event().wait()  # never set: only a cancel ends it
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def run_pair(process_side: Callable[[ServerCalls, CallServer], T], *, model: str = "caller",
             registry: CustomMetrics | None = None, bls: EchoBls | None = None) -> T:
    """``process_side(calls, server)`` on a thread while a CallServer serves on a loop
    (its BLS target ``bls``, an EchoBls by default)."""
    registry = registry if registry is not None else CustomMetrics()
    server_end, process_end = socket_pair()

    async def main() -> T:
        server = CallServer(Channel(server_end), model, f"{model}_0", registry.view("owner"), bls or EchoBls())
        server.start(asyncio.get_running_loop())
        calls = ServerCalls(Channel(process_end))
        try:
            return await asyncio.to_thread(process_side, calls, server)
        finally:
            server.stop()
            server_end.close()
            process_end.close()

    return asyncio.run(main())


def ask(model: str, name: str, array: np.ndarray) -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest(model_name=model, inputs=[pb_utils.Tensor(name, array)])


@pytest.mark.parametrize("size", [4, 600_000], ids=["inline", "arena"])
def test_arrays_pack_and_unpack_whole(size: int) -> None:
    arrays = {"F": np.arange(size, dtype=np.float32), "B": np.array([b"a", b"bc"], dtype=np.object_)}
    payload, fds = pack_arrays(arrays)
    assert payload[0] == ("inline" if size == 4 else "arena") and len(fds) == (0 if size == 4 else 1)
    back = unpack_arrays(payload, list(fds))
    np.testing.assert_array_equal(back["F"], arrays["F"])
    assert back["B"].tolist() == [b"a", b"bc"]


def test_metric_updates_reach_the_registry_and_value_reads_the_servers() -> None:
    registry = CustomMetrics()

    def process(calls: ServerCalls, _: CallServer) -> float:
        proxy = MetricsProxy(calls)
        metric = proxy.open_metric(proxy.open_family("rows", "Rows", MetricKind.COUNTER), {"m": "x"}, None)
        for _ in range(3):
            proxy.increment(metric, 2)
        return proxy.value(metric)  # the queued updates go first

    assert run_pair(process, registry=registry) == 6


def test_misuse_raises_in_the_process_worded_by_the_server() -> None:
    def process(calls: ServerCalls, _: CallServer) -> str:
        proxy = MetricsProxy(calls)
        metric = proxy.open_metric(proxy.open_family("c", "", MetricKind.COUNTER), None, None)
        with pytest.raises(MetricError) as caught:
            proxy.increment(metric, -1)
        return caught.value.message

    assert run_pair(process) == "metric c{}: a counter can only be incremented by non-negative values, got -1"


def test_a_family_of_another_kind_is_refused_across_the_channel() -> None:
    registry = CustomMetrics()
    registry.open_family("another instance", "f", "", MetricKind.GAUGE)

    def process(calls: ServerCalls, _: CallServer) -> str:
        with pytest.raises(MetricError) as caught:
            MetricsProxy(calls).open_family("f", "", MetricKind.COUNTER)
        return caught.value.message

    assert run_pair(process, registry=registry) == 'metric family "f" already exists with kind GAUGE, not COUNTER'


def test_closing_the_family_clears_its_metrics_in_the_process() -> None:
    def process(calls: ServerCalls, _: CallServer) -> str:
        proxy = MetricsProxy(calls)
        family = proxy.open_family("g", "", MetricKind.GAUGE)
        metric = proxy.open_metric(family, None, None)
        proxy.close(family)
        with pytest.raises(MetricError) as caught:
            proxy.set(metric, 1)
        return caught.value.message

    assert run_pair(process) == CLEARED


@pytest.mark.parametrize("size", [3, 500_000], ids=["inline", "arena"])
def test_bls_infer_comes_back_with_its_outputs(size: int) -> None:
    x = np.arange(size, dtype=np.float32)

    def process(calls: ServerCalls, _: CallServer) -> np.ndarray:
        response = ProcessBls(calls).infer(ask("double", "X", x))
        assert not response.has_error()
        return pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()  # type: ignore[union-attr]

    np.testing.assert_array_equal(run_pair(process), x * 2)


def test_bls_errors_come_back_as_error_responses_with_their_code() -> None:
    def process(calls: ServerCalls, _: CallServer) -> tuple[str, int]:
        error = ProcessBls(calls).infer(ask("nothing", "X", np.zeros(1))).error()
        assert error is not None
        return error.message(), error.code()

    assert run_pair(process) == ("no model nothing", pb_utils.TritonError.NOT_FOUND)


def test_calls_fail_cleanly_once_the_server_is_gone() -> None:
    server_end, process_end = socket_pair()
    calls = ServerCalls(Channel(process_end))
    server_end.close()
    response = ProcessBls(calls).infer(ask("double", "X", np.zeros(1)))
    assert response.has_error() and "closed" in response.error().message()  # type: ignore[union-attr]
    process_end.close()


def test_answered_calls_are_forgotten() -> None:
    def process(calls: ServerCalls, _: CallServer) -> int:
        proxy = MetricsProxy(calls)
        metric = proxy.open_metric(proxy.open_family("f", "", MetricKind.GAUGE), None, None)
        for _ in range(5):
            proxy.value(metric)
        ProcessBls(calls).infer(ask("double", "X", np.zeros(1)))
        return len(calls._waiting)

    assert run_pair(process) == 0
