"""nereid.instances.call_server: what the server does with a process's calls (draining
updates before a reply, closing its handles, cancelling its streams, refusing a request
that fails), over a real socket pair (``test_calls.run_pair``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from nereid.custom_metrics import CustomMetrics, MetricKind
from nereid.instances.call_server import CallServer
from nereid.instances.calls import MetricsProxy, ProcessBls, ServerCalls
from nereid.triton_python import pb_utils
from tests.unit.instances.test_calls import EchoBls, ask, run_pair


def test_a_flush_is_applied_when_the_server_drains_before_a_reply() -> None:
    registry = CustomMetrics()

    def process(calls: ServerCalls, server: CallServer) -> list[float]:
        proxy = MetricsProxy(calls)
        metric = proxy.open_metric(proxy.open_family("g", "", MetricKind.GAUGE), None, None)
        proxy.set(metric, 4)
        calls.flush()
        seen = []
        asyncio.run_coroutine_threadsafe(_drain_and_read(server, registry, seen), server._loop).result()  # type: ignore[arg-type]
        return seen

    assert run_pair(process, registry=registry) == [4.0]


async def _drain_and_read(server: CallServer, registry: CustomMetrics, seen: list[float]) -> None:
    server.drain()
    seen.extend(series.value for family in registry.read() for series in family.series)


def test_a_stopped_server_closes_the_handles_the_process_held() -> None:
    registry = CustomMetrics()

    def process(calls: ServerCalls, _: CallServer) -> None:
        proxy = MetricsProxy(calls)
        proxy.open_metric(proxy.open_family("f", "", MetricKind.COUNTER), None, None)

    run_pair(process, registry=registry)
    assert registry.read() == []


def test_a_stream_closed_early_is_cancelled_on_the_server() -> None:
    bls_seen: list[EchoBls] = []

    def process(calls: ServerCalls, server: CallServer) -> list[int]:
        assert isinstance(server.bls, EchoBls)
        bls_seen.append(server.bls)
        steps = []
        responses = ProcessBls(calls).stream(ask("steps", "N", np.array([2], np.int32)))
        for response in responses:
            steps.append(int(response.output_tensors()[0].as_numpy()[0]))
            if len(steps) == 2:
                break
        responses.close()  # type: ignore[attr-defined]
        asyncio.run_coroutine_threadsafe(bls_seen[0].cancelled.wait(), server._loop).result(timeout=30)
        return steps

    assert run_pair(process) == [0, 1]
    assert bls_seen[0].cancelled.is_set()


class ClosingBls(EchoBls):
    """A server that is shutting down: its BLS target raises instead of answering."""

    async def ainfer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        raise pb_utils.TritonModelException("BLS is not available here: the server is not running")

    async def astream(self, request: pb_utils.InferenceRequest) -> AsyncIterator[pb_utils.InferenceResponse]:
        raise pb_utils.TritonModelException("BLS is not available here: the server is not running")
        yield  # an async generator


def test_a_failing_bls_target_answers_with_an_error_never_silence() -> None:
    def process(calls: ServerCalls, _: CallServer) -> list[str]:
        bls = ProcessBls(calls)
        one = bls.infer(ask("double", "X", np.zeros(1))).error()
        streamed = [r.error() for r in bls.stream(ask("steps", "N", np.array([1], np.int32)))]
        return [e.message() for e in (one, *streamed) if e is not None]

    assert run_pair(process, bls=ClosingBls()) == [
        "BLS request failed: BLS is not available here: the server is not running"] * 2
