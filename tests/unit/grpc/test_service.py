"""grpc/service.py: the InferenceService's RPCs that answer without a model (repository,
shared memory, trace and log settings), what they abort with (Triton's status and text,
through ``AbortContext``), and ModelStreamInfer's ordering and in-band errors."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import grpc
import pytest
from tritonclient.grpc import service_pb2

from nereid.errors import ModelNotFoundError
from nereid.grpc.service import AbortContext, CallAborted, InferenceService
from nereid.options import ServerOptions
from nereid.tensors.shared_memory import SharedMemoryManager
from tests.unit.manual_clock import next_turn


def service(**options: Any) -> InferenceService:
    return InferenceService(None, ServerOptions(**options), SharedMemoryManager())  # type: ignore[arg-type]


def aborted(call: Any) -> tuple[grpc.StatusCode, str]:
    """Run one RPC with an AbortContext; the status and text it aborted with."""
    context = AbortContext()
    with pytest.raises(CallAborted):
        asyncio.run(call(context))
    assert context.aborted is not None
    return context.aborted.code, context.aborted.message


def test_abort_records_the_status_and_raises_it() -> None:
    context = AbortContext()
    with pytest.raises(CallAborted) as caught:
        asyncio.run(context.abort(grpc.StatusCode.NOT_FOUND, "no such model"))
    assert context.aborted is caught.value
    assert (caught.value.code, caught.value.message) == (grpc.StatusCode.NOT_FOUND, "no such model")


def test_an_index_of_another_repository_is_unimplemented() -> None:
    request = service_pb2.RepositoryIndexRequest(repository_name="other")
    assert aborted(lambda context: service().RepositoryIndex(request, context)) == (
        grpc.StatusCode.UNIMPLEMENTED, "'repository_name' specification is not supported",
    )


def test_registering_client_shared_memory_needs_the_flag() -> None:
    request = service_pb2.SystemSharedMemoryRegisterRequest(name="r", key="/k", byte_size=8)
    assert aborted(lambda context: service(allow_client_shm=False).SystemSharedMemoryRegister(request, context)) == (
        grpc.StatusCode.UNIMPLEMENTED,
        "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.",
    )


def test_cuda_shared_memory_is_refused_with_a_hint() -> None:
    request = service_pb2.CudaSharedMemoryRegisterRequest(name="g")
    code, message = aborted(lambda context: service().CudaSharedMemoryRegister(request, context))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert message.endswith("nereid does not support CUDA shared memory; use system shared memory")


def test_a_named_cuda_region_is_not_found() -> None:
    request = service_pb2.CudaSharedMemoryStatusRequest(name="g")
    assert aborted(lambda context: service().CudaSharedMemoryStatus(request, context)) == (
        grpc.StatusCode.NOT_FOUND, "Unable to find cuda shared memory region: 'g'",
    )


def test_an_unknown_log_setting_is_named() -> None:
    request = service_pb2.LogSettingsRequest()
    request.settings["log_colour"].bool_param = True
    assert aborted(lambda context: service().LogSettings(request, context)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Unsupported log setting 'log_colour'",
    )


def test_trace_settings_are_kept_and_reported() -> None:
    grpc_service = service()
    request = service_pb2.TraceSettingRequest()
    request.settings["trace_rate"].value.append("50")
    response = asyncio.run(grpc_service.TraceSetting(request, AbortContext()))
    assert list(response.settings["trace_rate"].value) == ["50"]
    again = asyncio.run(grpc_service.TraceSetting(service_pb2.TraceSettingRequest(), AbortContext()))
    assert list(again.settings["trace_rate"].value) == ["50"]
    assert list(again.settings["trace_level"].value) == ["OFF"]


class _Stream(InferenceService):
    """A service whose ``_infer`` answers after the delay each request's id names (in
    loop turns), or fails for an id starting with "missing"."""

    async def _infer(self, request: Any, received_ns: int) -> Any:
        if request.id.startswith("missing"):
            raise ModelNotFoundError(f"Request for unknown model: '{request.model_name}' is not found")
        for _ in range(int(request.id.split("-")[1])):
            await next_turn()
        return service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)


def test_a_stream_answers_in_request_order_with_errors_in_band() -> None:
    stream_service = _Stream(None, ServerOptions(), SharedMemoryManager())  # type: ignore[arg-type]

    class Serving:
        class config:  # noqa: N801
            decoupled = False

    stream_service.infer.serving = lambda request: Serving  # type: ignore[method-assign]

    async def requests() -> AsyncIterator[Any]:
        for request_id in ("a-5", "missing-0", "b-0"):
            yield service_pb2.ModelInferRequest(model_name="m", id=request_id)

    async def collect() -> list[Any]:
        return [answer async for answer in stream_service.ModelStreamInfer(requests(), AbortContext())]

    answers = asyncio.run(collect())
    assert [(a.infer_response.id, a.error_message) for a in answers] == [
        ("a-5", ""), ("missing-0", "Request for unknown model: 'm' is not found"), ("b-0", ""),
    ]
    assert answers[0].infer_response.parameters["triton_final_response"].bool_param
