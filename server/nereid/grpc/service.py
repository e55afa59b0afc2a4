"""InferenceService: Triton's ``inference.GRPCInferenceService`` on grpcio's asyncio server.

Every RPC of Triton's service, with the generated stubs tritonclient ships. The admin
RPCs are ``nereid.models.admin``'s answers (the same as HTTP's, turned into messages); infer
decodes with ``codec.decode_request``, goes through the model's batcher like every other
request (``ServingModel.infer``) and encodes with ``codec.encode_response``.
ModelStreamInfer answers a non-decoupled model's requests in the order they came (a
request whose answer is an error gets an in-band ``error_message``, and the stream goes
on), and a decoupled model's steps as they come, each flagged
``triton_final_response`` as Triton does. ``GrpcServer`` runs it on the server's loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any, Callable

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from nereid.models import admin
from nereid.network.access import Refusals, Restriction, restriction_table
from nereid.errors import InvalidInputError, ModelNotFoundError, NereidError, UnsupportedError
from nereid.grpc.codec import decode_request, encode_response, status_of
from nereid.log import LogSettings, apply_log_settings, log_settings
from nereid.models.manager import ModelManager, ServingModel
from nereid.models.serving import Ticket
from nereid.tensors.tables import ModelTables
from nereid.options import ServerOptions
from nereid.tensors.shared_memory import SharedMemoryManager
from nereid.network.tls import TlsFiles

__all__ = ["AbortContext", "CallAborted", "GrpcServer", "InferenceService", "METHOD_GROUPS"]

_log = logging.getLogger("nereid")

#: How ``start_infer`` answers: (the ModelInferResponse, None) or (None, the error).
OnResponse = Callable[[Any, "BaseException | None"], None]

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


def _json_message(obj: Any, message: Any) -> Any:
    """A protobuf message from Triton's JSON form of it (unknown keys ignored)."""
    return json_format.ParseDict(obj, message, ignore_unknown_fields=True)


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The service of one server: its model manager, options and shared memory."""

    def __init__(self, manager: ModelManager, options: ServerOptions, shm: SharedMemoryManager) -> None:
        self.manager = manager
        self.options = options
        self.shm = shm
        self._tables: weakref.WeakKeyDictionary[ServingModel, ModelTables] = weakref.WeakKeyDictionary()
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
            stats = admin.model_statistics(self.manager, request.name or None, request.version)
        except NereidError as exc:
            return await _abort(context, exc)
        for entry in stats["model_stats"]:
            entry.pop("instance_restarts", None)  # nereid's, not in Triton's message
            entry.pop("scheduling", None)  # nereid's too
        return _json_message(stats, service_pb2.ModelStatisticsResponse())

    # -- repository --------------------------------------------------------------------------

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        if request.repository_name:
            return await _abort(context, UnsupportedError("'repository_name' specification is not supported"))
        index = await admin.repository_index(self.manager, request.ready)
        return _json_message({"models": index}, service_pb2.RepositoryIndexResponse())

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        params = {key: _parameter(value) for key, value in request.parameters.items()}
        try:
            await admin.load_model(self.manager, request.model_name, params, request.repository_name)
        except NereidError as exc:
            return await _abort(context, exc)
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        params = {key: _parameter(value) for key, value in request.parameters.items()}
        try:
            await admin.unload_model(self.manager, request.model_name, params, request.repository_name)
        except NereidError as exc:
            return await _abort(context, exc)
        return service_pb2.RepositoryModelUnloadResponse()

    # -- infer -------------------------------------------------------------------------------

    def _tables_of(self, serving: ServingModel) -> ModelTables:
        """The version's tables, made once (held weakly: they go with the version)."""
        tables = self._tables.get(serving)
        if tables is None:
            tables = self._tables[serving] = ModelTables.for_config(serving.config)
        return tables

    def _serving(self, request: Any) -> ServingModel:
        return self.manager.get(request.model_name, admin.parse_version(request.model_version))

    def start_infer(self, request: Any, received_ns: int, answer: OnResponse) -> Ticket:
        """ModelInfer's one path: decode, queue, and (from the batch that answers it) encode.
        ``answer(response, error)`` is called once (error: a NereidError, or the
        CancelledError of a withdrawn ticket); what is refused before queueing raises
        NereidError instead. ``ticket.withdraw()`` if the caller goes away."""
        serving = self._serving(request)
        if serving.config.decoupled:
            raise UnsupportedError(
                f"ModelInfer RPC doesn't support models with decoupled transaction policy ('{serving.name}'); "
                "use ModelStreamInfer"
            )
        codec = self._tables_of(serving)
        lease = self.shm.lease()

        def on_answer(outputs: Any, error: BaseException | None) -> None:
            response = None
            try:
                if error is None:
                    response = encode_response(
                        outputs, infer_request, codec, serving.version, serving.labels, lease.write
                    )
            except NereidError as exc:
                error = exc
            finally:
                lease.release()
            answer(response, error)

        try:
            infer_request = decode_request(request, codec, serving.version, lease.resolve)
            return serving.submit(infer_request, received_ns, on_answer)
        except BaseException:
            lease.release()
            raise

    async def _infer(self, request: Any, received_ns: int) -> Any:
        """``start_infer`` awaited. Raises NereidError."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def answer(response: Any, error: BaseException | None) -> None:
            if not future.done():
                if error is None:
                    future.set_result(response)
                else:
                    future.set_exception(error)

        ticket = self.start_infer(request, received_ns, answer)
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
                serving = self._serving(request)
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
        codec = self._tables_of(serving)
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


def _handlers(service: InferenceService, restrictions: dict[str, Restriction], refusals: Refusals) -> Any:
    """The service's method handlers, as the generated ``add_..._to_server`` makes them,
    except that requests arrive as bytes and are parsed in the handler: a message that
    does not parse is INTERNAL "Unable to parse request", as Triton answers (grpcio's
    own deserializer failure would be UNKNOWN). A method of a restricted group checks
    its metadata key first."""
    descriptor = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for method in descriptor.methods:
        request_type = getattr(service_pb2, method.input_type.name)
        response_type = getattr(service_pb2, method.output_type.name)
        implementation = getattr(service, method.name)
        group = METHOD_GROUPS[method.name]
        restriction = restrictions.get(group)
        if restriction is not None:
            implementation = _restricted(implementation, restriction, group, refusals, method.server_streaming)
        if method.server_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                _parsing_stream(implementation, request_type), response_serializer=response_type.SerializeToString
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _parsing(implementation, request_type), response_serializer=response_type.SerializeToString
            )
    return grpc.method_handlers_generic_handler(descriptor.full_name, handlers)


def _restricted(implementation: Any, restriction: Restriction, group: str, refusals: Refusals, streaming: bool) -> Any:
    """``implementation`` ending calls without ``restriction``'s metadata key with
    UNAVAILABLE, as Triton does."""

    def allowed(context: Any) -> bool:
        presented = None
        for key, value in context.invocation_metadata() or ():
            if key == restriction.name:
                presented = value
                break
        if restriction.allows(presented):
            return True
        refusals.count("grpc", group)
        return False

    if streaming:
        async def stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            if not allowed(context):
                await context.abort(grpc.StatusCode.UNAVAILABLE, restriction.grpc_message())
            async for response in implementation(requests, context):
                yield response

        return stream

    async def unary(request: Any, context: Any) -> Any:
        if not allowed(context):
            await context.abort(grpc.StatusCode.UNAVAILABLE, restriction.grpc_message())
        return await implementation(request, context)

    return unary


def _parsing(implementation: Any, request_type: Any) -> Any:
    async def handle(data: bytes, context: Any) -> Any:
        try:
            request = request_type.FromString(data)
        except DecodeError:
            await context.abort(grpc.StatusCode.INTERNAL, "Unable to parse request")
        return await implementation(request, context)

    return handle


def _parsing_stream(implementation: Any, request_type: Any) -> Any:
    async def handle(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[Any]:
        async def parsed() -> AsyncIterator[Any]:
            async for data in requests:
                try:
                    yield request_type.FromString(data)
                except DecodeError:
                    await context.abort(grpc.StatusCode.INTERNAL, "Unable to parse request")

        async for response in implementation(parsed(), context):
            yield response

    return handle


def _credentials(files: TlsFiles) -> Any:
    """grpcio's server credentials from the --grpc-* TLS files (checked by server_context
    first, so they exist and parse)."""
    assert files.cert is not None and files.key is not None
    root = files.root.read_bytes() if files.root is not None else None
    return grpc.ssl_server_credentials(
        [(files.key.read_bytes(), files.cert.read_bytes())], root_certificates=root, require_client_auth=files.mutual,
    )


class GrpcServer:
    """The gRPC listener of one nereid server, on its event loop."""

    def __init__(
        self, service: InferenceService, options: ServerOptions, tls: TlsFiles | None = None,
        refusals: Refusals | None = None,
    ) -> None:
        self.service = service
        #: --grpc-use-ssl: the files grpcio's credentials are read from (None: plaintext)
        self.tls = tls
        self.refusals = refusals if refusals is not None else Refusals()
        self.restrictions = restriction_table(options.grpc_restricted_protocol, "--grpc-restricted-protocol")
        self.address = options.http_address
        self.requested_port = options.grpc_port
        self.options = [
            ("grpc.max_send_message_length", options.grpc_max_message_size),
            ("grpc.max_receive_message_length", options.grpc_max_message_size),
            ("grpc.keepalive_time_ms", options.grpc_keepalive_time),
            ("grpc.keepalive_timeout_ms", options.grpc_keepalive_timeout),
            ("grpc.keepalive_permit_without_calls", int(options.grpc_keepalive_permit_without_calls)),
            ("grpc.http2.max_pings_without_data", options.grpc_http2_max_pings_without_data),
            ("grpc.http2.min_ping_interval_without_data_ms", options.grpc_http2_min_recv_ping_interval_without_data),
            ("grpc.http2.max_ping_strikes", options.grpc_http2_max_ping_strikes),
            ("grpc.so_reuseport", 0),
        ]
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Listen; the bound port (0 picks one). OSError when it cannot be bound."""
        server = grpc.aio.server(options=self.options)
        server.add_generic_rpc_handlers((_handlers(self.service, self.restrictions, self.refusals),))
        where = f"{self.address}:{self.requested_port}"
        try:
            if self.tls is None:
                port = int(server.add_insecure_port(where))
            else:
                port = int(server.add_secure_port(where, _credentials(self.tls)))
        except RuntimeError as exc:  # grpcio's "Failed to bind"
            raise OSError(f"cannot listen on {where} for gRPC: {exc}") from exc
        if port == 0 and self.requested_port != 0:
            raise OSError(f"cannot listen on {where} for gRPC (address in use?)")
        await server.start()
        self._server = server
        self.port = port
        return port

    async def stop(self, grace: float) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

