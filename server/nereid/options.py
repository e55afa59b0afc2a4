"""ServerOptions: every server-wide setting, frozen, with tritonserver's defaults.

Owns the record only; the CLI builds it from flags, ``Server`` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerOptions", "HTTP_SERVERS", "MODEL_CONTROL_MODES"]

HTTP_SERVERS = ("native", "uvicorn", "granian", "hypercorn")
MODEL_CONTROL_MODES = ("none", "poll", "explicit")


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Server-wide settings. Field names follow tritonserver's flags (``--http-port`` ->
    ``http_port``)."""

    model_repository: Path = Path("model_repository")
    http_address: str = "127.0.0.1"
    http_port: int = 8000
    #: a socket file descriptor to serve on instead of binding (tests pass a bound socket).
    http_fd: int | None = None
    metrics_port: int = 8002
    allow_metrics: bool = True
    model_control_mode: str = "none"
    repository_poll_secs: float = 5.0
    load_model: tuple[str, ...] = field(default_factory=tuple)
    strict_readiness: bool = True
    exit_timeout_secs: float = 30.0
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    #: which engine serves HTTP: native (nereid's own, on httptools), uvicorn, granian or hypercorn.
    http_server: str = "native"
    #: requests with a larger body (after decompression) are refused with 400.
    max_request_size: int = 256 * 1024 * 1024
    #: JSON header limit, tritonserver's --http-max-input-size (64 MiB).
    http_max_input_size: int = 64 * 1024 * 1024
    allow_client_shm: bool = True
