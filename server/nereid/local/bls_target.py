"""ServerBls: one server's BLS target. Its Triton Python-backend models' requests to its
other models (``pb_utils.InferenceRequest(...).exec()``, ``stream``, ``async_exec``) run
through the server's LocalEndpoint on its loop, and come back as pb_utils responses.
"""

from __future__ import annotations

import asyncio
import json
import queue
from typing import Any, AsyncIterator, Iterator, Mapping

import numpy as np

from nereid.errors import NereidError
from nereid.local.endpoint import LocalEndpoint, RequestOptions
from nereid.triton_python import pb_utils

__all__ = ["ServerBls"]


class ServerBls:
    """One server's BLS target: lets its Triton Python-backend models call its other
    models (``pb_utils.InferenceRequest(...).exec()``), through a LocalEndpoint on the
    server's loop, from their instance threads. The model loader hands it to each
    TritonModel (``nereid.triton_python.bls``); ``bind`` gives it the server's endpoint
    and loop once the server runs."""

    def __init__(self) -> None:
        self._endpoint: LocalEndpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, endpoint: LocalEndpoint, loop: asyncio.AbstractEventLoop) -> None:
        """The server's endpoint, and the loop its models run on (where BLS requests go)."""
        self._endpoint, self._loop = endpoint, loop

    def infer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        endpoint, loop = self._running()
        if _on(loop):
            raise pb_utils.TritonModelException("exec() cannot wait on the server's event loop: use async_exec()")
        return asyncio.run_coroutine_threadsafe(self._infer(endpoint, request), loop).result()

    def stream(self, request: pb_utils.InferenceRequest) -> Iterator[pb_utils.InferenceResponse]:
        steps: queue.SimpleQueue[pb_utils.InferenceResponse | None] = queue.SimpleQueue()
        model, inputs, options = _bls_arguments(request)
        wanted = request.requested_output_names()

        endpoint, loop = self._running()

        async def pump() -> None:
            try:
                async for step in endpoint.stream(model, inputs, **options):
                    steps.put(_bls_response(step, wanted))
            except NereidError as exc:
                steps.put(_bls_failed(exc))
            finally:
                steps.put(None)

        asyncio.run_coroutine_threadsafe(pump(), loop)
        while (item := steps.get()) is not None:
            yield item

    async def ainfer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        """``infer`` on the server's loop (a process instance's BLS request)."""
        return await self._infer(self._running()[0], request)

    async def astream(self, request: pb_utils.InferenceRequest) -> AsyncIterator[pb_utils.InferenceResponse]:
        """``stream`` on the server's loop (a process instance's BLS request)."""
        endpoint = self._running()[0]
        model, inputs, options = _bls_arguments(request)
        wanted = request.requested_output_names()
        try:
            async for step in endpoint.stream(model, inputs, **options):
                yield _bls_response(step, wanted)
        except NereidError as exc:
            yield _bls_failed(exc)

    @staticmethod
    async def _infer(endpoint: LocalEndpoint, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        model, inputs, options = _bls_arguments(request)
        try:
            outputs = await endpoint.infer(model, inputs, **options)
        except NereidError as exc:
            return _bls_failed(exc)
        return _bls_response(outputs, request.requested_output_names())

    def _running(self) -> tuple[LocalEndpoint, asyncio.AbstractEventLoop]:
        endpoint, loop = self._endpoint, self._loop
        if endpoint is None or loop is None or loop.is_closed():
            raise pb_utils.TritonModelException("BLS is not available here: the server is not running")
        return endpoint, loop


def _bls_arguments(request: pb_utils.InferenceRequest) -> tuple[str, dict[str, Any], RequestOptions]:
    version = request.model_version()
    options = RequestOptions(
        version=version if version >= 0 else None, parameters=json_parameters(request.parameters())
    )
    if request.timeout():
        options["timeout_us"] = request.timeout()
    return request.model_name(), {t.name(): t.as_numpy() for t in request.inputs()}, options


def _bls_response(outputs: Mapping[str, np.ndarray], wanted: list[str]) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in outputs.items() if not wanted or n in wanted])


def _bls_failed(exc: NereidError) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(exc.message))


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def json_parameters(text: str) -> dict[str, Any]:
    value = json.loads(text) if text else {}
    return value if isinstance(value, dict) else {}
