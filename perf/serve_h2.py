#!/usr/bin/env python3
"""``nereid serve`` with h2's state machine under gRPC: the candidate engine of the
comparison in perf/README.md ("gRPC transport: h2's state machine vs nereid's own framing").

Exactly ``python -m nereid serve ARGS...`` with ``nereid.grpc.native.GrpcConnection``
(and its TLS variant) replaced by ``H2GrpcConnection`` (perf/h2_grpc_connection.py)
before the server starts,
so perf_analyzer, tritonclient and perf/h2_rfc_probe.py run against it unchanged:

    PYTHONPATH=server .venv/bin/python perf/serve_h2.py serve --model-repository DIR --grpc-port 8001
    ... perf/serve_h2.py --validate-headers serve ...   # with h2's inbound header checks on

``--validate-headers`` (before ``serve``) turns h2's RFC 9113 8.2 header checks on.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # not when a spawned helper process imports this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import nereid.grpc.native
    from h2_grpc_connection import H2GrpcConnection
    from nereid.cli import main

    argv = sys.argv[1:]
    if "--validate-headers" in argv[:1]:
        H2GrpcConnection.validate_headers = True
        argv = argv[1:]
    class H2TlsConnection(H2GrpcConnection):
        """``native._TlsConnection`` on H2GrpcConnection: counted by the server once its
        TLS handshake is done (--grpc-use-ssl)."""

        def __init__(self, server: nereid.grpc.native.NativeGrpcServer, refusal: str | None) -> None:
            super().__init__(server, refusal=refusal)
            self._server = server

        def connection_made(self, transport: object) -> None:
            self._server.connections.add(self)  # type: ignore[arg-type]
            super().connection_made(transport)

    nereid.grpc.native.GrpcConnection = H2GrpcConnection  # type: ignore[misc]
    nereid.grpc.native._TlsConnection = H2TlsConnection  # type: ignore[misc]
    sys.exit(main(argv))
