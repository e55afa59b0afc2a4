"""ServerOptions: every server-wide setting, frozen, with tritonserver's defaults.

Owns the record only; the CLI builds it from flags, ``Server`` reads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from nereid.network.access import Restriction

__all__ = ["ServerOptions", "repository_paths", "GRPC_SERVERS", "HTTP_SERVERS", "MODEL_CONTROL_MODES"]

HTTP_SERVERS = ("native", "uvicorn", "granian", "hypercorn")
GRPC_SERVERS = ("native", "grpcio")
MODEL_CONTROL_MODES = ("none", "poll", "explicit")


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Server-wide settings. Field names follow tritonserver's flags (``--http-port`` ->
    ``http_port``)."""

    #: the model repository folder, or several (``--model-repository`` repeated): their
    #: models together, as in Triton. ``model_repositories`` reads either form.
    model_repository: Path | tuple[Path, ...] = Path("model_repository")
    http_address: str = "127.0.0.1"
    http_port: int = 8000
    #: a socket file descriptor to serve on instead of binding (tests pass a bound socket).
    http_fd: int | None = None
    metrics_port: int = 8002
    #: gRPC (Triton's GRPCInferenceService) on the HTTP address.
    grpc_port: int = 8001
    allow_grpc: bool = True
    #: the gRPC engine: nereid's own HTTP/2 transport, or grpcio's asyncio server.
    grpc_server: str = "native"
    #: largest gRPC message either way (Triton's: 2 GiB - 1).
    grpc_max_message_size: int = 2**31 - 1
    #: tritonserver's gRPC keepalive flags, with its defaults (milliseconds).
    grpc_keepalive_time: int = 7_200_000
    grpc_keepalive_timeout: int = 20_000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    grpc_http2_min_recv_ping_interval_without_data: int = 300_000
    grpc_http2_max_ping_strikes: int = 2
    #: what one client may hold of the native gRPC engine (grpc/limits.py)
    grpc_max_connections: int = 10_000
    grpc_handshake_timeout_secs: float = 10.0
    grpc_idle_timeout_secs: float = 600.0
    allow_metrics: bool = True
    model_control_mode: str = "none"
    repository_poll_secs: float = 5.0
    load_model: tuple[str, ...] = field(default_factory=tuple)
    strict_readiness: bool = True
    exit_timeout_secs: float = 30.0
    #: Ray Serve (ray/serve.py): replicas (0: not on Ray), the cluster to join (None: a
    #: local one), each replica's resources, and autoscaling (max 0: a fixed count).
    ray_replicas: int = 0
    ray_address: str | None = None
    ray_replica_cpus: float = 1.0
    ray_replica_gpus: float = 0.0
    ray_min_replicas: int = 1
    ray_max_replicas: int = 0
    ray_target_ongoing_requests: float = 2.0
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    #: which engine serves HTTP: native (nereid's own, on httptools), uvicorn, granian or hypercorn.
    http_server: str = "native"
    #: front-end worker processes serving the HTTP port with the native engine (1: the
    #: main process serves it itself); models, batchers and instances stay in the main
    #: process, so one batch holds requests from every worker (frontends/).
    http_workers: int = 1
    #: requests with a larger body (after decompression) are refused with 400.
    max_request_size: int = 256 * 1024 * 1024
    #: JSON header limit, tritonserver's --http-max-input-size (64 MiB).
    http_max_input_size: int = 64 * 1024 * 1024
    allow_client_shm: bool = True
    #: bytes of request bodies received and not yet answered, over all connections.
    max_request_bytes_in_flight: int = 1024 * 1024 * 1024
    #: request head limits (414 / 431 past them).
    http_max_url_size: int = 16 * 1024
    http_max_header_count: int = 100
    http_max_header_size: int = 64 * 1024
    #: a request head must be complete this long after it began (408 and close).
    http_header_timeout_secs: float = 30.0
    #: a request body (or a client reading its answers) may stall this long (408 and close).
    http_body_timeout_secs: float = 60.0
    #: an idle keep-alive connection is closed after this long.
    http_keepalive_timeout_secs: float = 75.0
    #: open connections at most (503 and close past it).
    http_max_connections: int = 10_000
    #: HTTPS (nereid's flags, in the style of Triton's gRPC ones): the server's PEM
    #: certificate and key, the CA of client certificates, and whether clients must have one.
    http_use_ssl: bool = False
    http_server_cert: Path | None = None
    http_server_key: Path | None = None
    http_root_cert: Path | None = None
    http_use_ssl_mutual: bool = False
    #: gRPC over TLS (Triton's flags).
    grpc_use_ssl: bool = False
    grpc_server_cert: Path | None = None
    grpc_server_key: Path | None = None
    grpc_root_cert: Path | None = None
    grpc_use_ssl_mutual: bool = False
    #: endpoint groups that need a header (Triton's --http-restricted-api /
    #: --grpc-restricted-protocol), and the metrics port's (--metrics-restricted-api).
    http_restricted_api: tuple[Restriction, ...] = field(default_factory=tuple)
    grpc_restricted_protocol: tuple[Restriction, ...] = field(default_factory=tuple)
    metrics_restricted_api: Restriction | None = None

    @property
    def model_repositories(self) -> tuple[Path, ...]:
        """Every model repository folder, in the order given (one for a single folder)."""
        if isinstance(self.model_repository, (str, os.PathLike)):
            return (Path(self.model_repository),)
        return tuple(dict.fromkeys(Path(path) for path in self.model_repository))  # a folder given twice counts once


def repository_paths(value: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Path | tuple[Path, ...]:
    """``ServerOptions.model_repository`` from one folder or several: one folder (alone or
    in a list) stays a Path, several become a tuple. Raises ValueError for an empty list."""
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    paths = tuple(dict.fromkeys(Path(path) for path in value))
    if not paths:
        raise ValueError("model_repository: expected a folder or a list of folders, got an empty list")
    return paths[0] if len(paths) == 1 else paths
