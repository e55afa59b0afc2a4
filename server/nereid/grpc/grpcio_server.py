"""GrpcServer: the InferenceService on grpcio's asyncio server (``--grpc-server grpcio``).

The service's method handlers as the generated ``add_..._to_server`` makes them, except
that requests arrive as bytes and are parsed in the handler (a message that does not
parse is INTERNAL "Unable to parse request", as Triton answers), and that a method of a
restricted group (--grpc-restricted-protocol) checks its metadata key first. TLS comes
from the --grpc-* files as grpcio's credentials.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from nereid.grpc.service import METHOD_GROUPS, InferenceService
from nereid.network.access import Refusals, Restriction, restriction_table
from nereid.network.tls import TlsFiles
from nereid.options import ServerOptions

__all__ = ["GrpcServer"]


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

