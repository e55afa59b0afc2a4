"""Binding the server's ports: a listening socket bound before any model loads, a
one-line StartupError when it cannot be bound, and an open-file limit that fits the
connections the server may hold.

Owns the operator-facing words for those failures; ``nereid.server`` uses them for HTTP
and gRPC.
"""

from __future__ import annotations

import errno
import logging
import socket

__all__ = ["StartupError", "fit_open_file_limit", "listen", "listen_error"]

_log = logging.getLogger("nereid")


class StartupError(Exception):
    """The server cannot start (its HTTP port cannot be bound): one line for the operator."""


_LISTEN_ADVICE = {
    errno.EADDRINUSE: "address already in use (another server is running there? choose another {flag})",
    errno.EACCES: "permission denied (ports below 1024 need privileges; choose another {flag})",
    errno.EADDRNOTAVAIL: "this host has no such address (check --http-address)",
}


def listen(host: str, port: int, flag: str = "--http-port", *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on ``host:port``, bound before any model loads, so that a
    busy port is one clear StartupError and "serving" is logged only once it is bound.
    ``reuse_port``: with SO_REUSEPORT, so that several sockets (one per front-end worker)
    share the port and the kernel spreads connections over them."""
    where = f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {where}: --http-address {host!r} does not resolve ({exc.strerror})") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise listen_error(where, exc, flag) from exc
    sock.setblocking(False)
    return sock


def listen_error(where: str, exc: OSError, flag: str = "--http-port") -> StartupError:
    """The one line for a port that cannot be bound; ``flag`` is the one that chose it."""
    reason = _LISTEN_ADVICE.get(exc.errno or 0, exc.strerror or str(exc)).format(flag=flag)
    return StartupError(f"cannot listen on {where}: {reason}")


#: Open files the server needs beside its connections (models, logs, worker pipes).
_FILES_BESIDES_CONNECTIONS = 256


def fit_open_file_limit(connections: int) -> None:
    """Raise the soft open-file limit so that ``connections`` (--http-max-connections)
    fit (within the hard limit); warn when they cannot: past the limit the kernel refuses
    new connections with nothing to tell the client."""
    import resource

    need = connections + _FILES_BESIDES_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
        if soft < need:
            _log.warning(
                "--http-max-connections %d needs about %d open files, but the limit is %d (ulimit -n); "
                "connections past about %d will be refused by the kernel, not answered",
                connections, need, soft, max(0, soft - _FILES_BESIDES_CONNECTIONS),
            )
