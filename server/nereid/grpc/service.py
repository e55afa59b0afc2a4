"""InferenceService: every RPC of Triton's ``inference.GRPCInferenceService``, as both gRPC
engines serve it (``grpcio_server.GrpcServer``, ``native.NativeGrpcServer``; Ray's gRPC
proxy too).

The generated stubs tritonclient ships give the messages. The admin RPCs are
``nereid.models.admin``'s answers (the same as HTTP's, turned into messages); ModelInfer
is ``infer.ModelInfer`` (decode, submit through the model's batcher, encode).
ModelStreamInfer answers a non-decoupled model's requests in the order they came (a
request whose answer is an error gets an in-band ``error_message``, and the stream goes
on), and a decoupled model's steps as they come, each flagged
``triton_final_response`` as Triton does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Awaitable, Callable

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from nereid.errors import InvalidInputError, ModelNotFoundError, NereidError, UnsupportedError
from nereid.grpc.infer import ModelInfer, status_of
from nereid.grpc.infer_messages import decode_request, encode_response
from nereid.log import LogSettings, apply_log_settings, log_settings
from nereid.models import admin
from nereid.models.directory import StatsSource
from nereid.models.manager import ModelManager, ServingModel
from nereid.options import ServerOptions
from nereid.tensors.shared_memory import SharedMemoryManager

__all__ = ["AbortContext", "CallAborted", "InferenceService", "METHOD_GROUPS", "statistics_response"]

#: The restricted group (--grpc-restricted-protocol) of each RPC, as Triton groups them.
METHOD_GROUPS = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
}

#: Requests of one ModelStreamInfer stream started ahead of the answer being written.
STREAM_READ_AHEAD = 256


class CallAborted(Exception):
    """What ``AbortContext.abort`` raises: the call ends with ``code`` (a grpc.StatusCode)
    and ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AbortContext:
    """The part of grpcio's ServicerContext the service uses, for the engines that are not
    grpcio (nereid's own transport, Ray's gRPC proxy): ``abort`` records the status and
    raises it (as grpcio's does, so an abort inside a stream's reader task still ends the
    call with it: read ``aborted`` when the call is over)."""

    __slots__ = ("aborted",)

    def __init__(self) -> None:
        self.aborted: CallAborted | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = CallAborted(code, details)
        raise self.aborted


async def _abort(context: grpc.aio.ServicerContext, error: NereidError) -> Any:
    await context.abort(status_of(error), error.message)


def statistics_response(source: StatsSource, request: Any) -> Any:
    """The ModelStatisticsResponse to ``request`` from ``source`` (the manager, or a
    front-end worker's picture of its figures); NereidError: the call fails with it."""
    stats = admin.model_statistics(source, request.name or None, request.version)
    for entry in stats["model_stats"]:
        entry.pop("instance_restarts", None)  # nereid's, not in Triton's message
        entry.pop("scheduling", None)  # nereid's too
    return _json_message(stats, service_pb2.ModelStatisticsResponse())


def _json_message(obj: Any, message: Any) -> Any:
    """A protobuf message from Triton's JSON form of it (unknown keys ignored)."""
    return json_format.ParseDict(obj, message, ignore_unknown_fields=True)


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The service of one server: its model manager, options and shared memory."""

    def __init__(self, manager: ModelManager, options: ServerOptions, shm: SharedMemoryManager) -> None:
        self.manager = manager
        self.options = options
        self.shm = shm
        #: ModelInfer's path (the native engine calls its ``start`` straight from the bytes)
        self.infer = ModelInfer(manager, shm)
        self._trace: dict[str, list[str]] = {
            "trace_level": ["OFF"], "trace_rate": ["1000"], "trace_count": ["-1"], "log_frequency": ["0"],
            "trace_file": [""], "trace_mode": ["triton"],
        }

    # -- health and metadata ---------------------------------------------------------------

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.manager.is_ready(self.options.strict_readiness))

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            ready = admin.model_ready(self.manager, request.name, request.version)
        except NereidError as exc:
            return await _abort(context, exc)
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return _json_message(admin.server_metadata(), service_pb2.ServerMetadataResponse())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            metadata = admin.model_metadata(self.manager, request.name, request.version)
        except NereidError as exc:
            return await _abort(context, exc)
        return _json_message(metadata, service_pb2.ModelMetadataResponse())

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            config = admin.model_config(self.manager, request.name, request.version)
        except NereidError as exc:
            return await _abort(context, exc)
        message = _json_message(config, model_config_pb2.ModelConfig())
        if "dynamic_batching" in config:  # set even when empty: perf_analyzer looks for the field
            message.dynamic_batching.SetInParent()
        return service_pb2.ModelConfigResponse(config=message)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        try:
            return statistics_response(self.manager, request)
        except NereidError as exc:
            return await _abort(context, exc)

    # -- repository --------------------------------------------------------------------------

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        if request.repository_name:
            return await _abort(context, UnsupportedError("'repository_name' specification is not supported"))
        index = await admin.repository_index(self.manager, request.ready)
        return _json_message({"models": index}, service_pb2.RepositoryIndexResponse())

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        return await self._repository_change(admin.load_model, request, context, service_pb2.RepositoryModelLoadResponse)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        return await self._repository_change(
            admin.unload_model, request, context, service_pb2.RepositoryModelUnloadResponse
        )

    async def _repository_change(
        self, change: Callable[..., Awaitable[Any]], request: Any, context: Any, response_type: Any,
    ) -> Any:
        """Load or unload a model (``change``) with the request's parameters."""
        params = {key: _parameter(value) for key, value in request.parameters.items()}
        try:
            await change(self.manager, request.model_name, params, request.repository_name)
        except NereidError as exc:
            return await _abort(context, exc)
        return response_type()

    # -- infer -------------------------------------------------------------------------------

    async def _infer(self, request: Any, received_ns: int) -> Any:
        """``ModelInfer.start`` awaited. Raises NereidError."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def answer(response: Any, error: BaseException | None) -> None:
            if not future.done():
                if error is None:
                    future.set_result(service_pb2.ModelInferResponse.FromString(response))
                else:
                    future.set_exception(error)

        ticket = self.infer.start(request, received_ns, answer)
        try:
            return await future
        except asyncio.CancelledError:
            ticket.withdraw()
            raise

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        try:
            return await self._infer(request, time.monotonic_ns())
        except NereidError as exc:
            return await _abort(context, exc)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """Answers a non-decoupled model's requests in the order they came (an error as an
        in-band ``error_message``), and a decoupled model's steps as they are made. A
        client that goes away cancels what it had in flight."""
        answers: asyncio.Queue[AsyncIterator[Any] | None] = asyncio.Queue()
        started: list[asyncio.Task[Any]] = []
        # requests read ahead of their answers: a client that does not read its answers
        # stops being read (the transport then stops giving it window)
        unanswered = asyncio.Semaphore(STREAM_READ_AHEAD)

        async def read() -> None:
            try:
                async for request in requests:
                    await unanswered.acquire()
                    answers.put_nowait(self._stream_answers(request, time.monotonic_ns(), started))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (slot := await answers.get()) is not None:
                async for response in slot:
                    yield response
                unanswered.release()
        finally:
            reader.cancel()
            for task in started:
                task.cancel()

    def _stream_answers(self, request: Any, received_ns: int, started: list[asyncio.Task[Any]]) -> AsyncIterator[Any]:
        """The stream responses of one request, as they come (an in-band error on failure).
        Its work starts now (a task), so later requests do not wait for earlier ones to be
        read out."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()

        async def run() -> None:
            try:
                serving = self.infer.serving(request)
                if not serving.config.decoupled:
                    response = await self._infer(request, received_ns)
                    response.parameters["triton_final_response"].bool_param = True
                    queue.put_nowait(service_pb2.ModelStreamInferResponse(infer_response=response))
                else:
                    await self._decoupled(serving, request, received_ns, queue.put_nowait)
            except NereidError as exc:
                queue.put_nowait(service_pb2.ModelStreamInferResponse(
                    error_message=exc.message,
                    infer_response=service_pb2.ModelInferResponse(
                        model_name=request.model_name, model_version=request.model_version, id=request.id
                    ),
                ))
            finally:
                queue.put_nowait(done)

        task = asyncio.create_task(run())
        started.append(task)
        task.add_done_callback(started.remove)

        async def answers() -> AsyncIterator[Any]:
            while (item := await queue.get()) is not done:
                yield item

        return answers()

    async def _decoupled(self, serving: ServingModel, request: Any, received_ns: int, send: Callable[[Any], None]) -> None:
        """A decoupled model's steps, each sent as it is made with ``triton_final_response``
        false; then, when the client asks for it (``triton_enable_empty_final_response``),
        an empty response flagged final, as Triton sends them."""
        codec = self.infer.tables(serving)
        empty_final = "triton_enable_empty_final_response" in request.parameters and bool(
            _parameter(request.parameters["triton_enable_empty_final_response"])
        )
        lease = self.shm.lease()
        try:
            infer_request = decode_request(request, codec, serving.version, lease.resolve)
            async for step in serving.stream(infer_request, received_ns):
                response = encode_response(step, infer_request, codec, serving.version, serving.labels, lease.write)
                response.parameters["triton_final_response"].bool_param = False
                send(service_pb2.ModelStreamInferResponse(infer_response=response))
        finally:
            lease.release()
        if empty_final:
            final = service_pb2.ModelInferResponse(
                model_name=serving.name, model_version=str(serving.version), id=request.id
            )
            final.parameters["triton_final_response"].bool_param = True
            send(service_pb2.ModelStreamInferResponse(infer_response=final))

    # -- shared memory, logging, trace --------------------------------------------------------

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        try:
            regions = self.shm.status(request.name or None)
        except NereidError as exc:
            return await _abort(context, exc)
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for region in regions:
            response.regions[region.name].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size
                )
            )
        return response

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        if not self.options.allow_client_shm:
            return await _abort(context, UnsupportedError(
                "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."))
        if request.name in self.shm:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"shared memory region '{request.name}' already in manager")
        try:
            self.shm.register(request.name, request.key, request.offset, request.byte_size)
        except NereidError as exc:
            return await _abort(context, exc)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        if request.name:
            self.shm.unregister(request.name)
        else:
            self.shm.unregister_all()
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        if request.name:
            return await _abort(context, ModelNotFoundError(f"Unable to find cuda shared memory region: '{request.name}'"))
        return service_pb2.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        return await _abort(context, InvalidInputError(
            "failed to register CUDA shared memory region: nereid does not support CUDA shared memory; "
            "use system shared memory"))

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    async def LogSettings(self, request: Any, context: Any) -> Any:
        current = log_settings()
        if request.settings:
            changes: dict[str, Any] = {}
            for key, value in request.settings.items():
                kind = value.WhichOneof("parameter_choice")
                if key not in LogSettings.__dataclass_fields__ or key == "log_file" and value.string_param:
                    return await _abort(context, InvalidInputError(f"Unsupported log setting '{key}'"))
                changes[key] = getattr(value, kind) if kind is not None else None
            try:
                current = LogSettings(**{**_settings_dict(current), **changes})
                apply_log_settings(current)
            except (TypeError, ValueError) as exc:
                return await _abort(context, InvalidInputError(f"invalid log settings: {exc}"))
        response = service_pb2.LogSettingsResponse()
        for key, value in _settings_dict(current).items():
            setting = response.settings[key]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = value
        return response

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        """Settings accepted and reported, as HTTP's trace setting: no traces are written."""
        for key, value in request.settings.items():
            self._trace[key] = list(value.value)
        response = service_pb2.TraceSettingResponse()
        for key, values in self._trace.items():
            response.settings[key].value.extend(values)
        return response


def _settings_dict(settings: LogSettings) -> dict[str, Any]:
    return {key: getattr(settings, key) for key in LogSettings.__dataclass_fields__}


def _parameter(value: Any) -> Any:
    kind = value.WhichOneof("parameter_choice")
    return getattr(value, kind) if kind is not None else None


