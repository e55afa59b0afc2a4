"""The entry points: the ``nereid`` command (``nereid serve`` with tritonserver's flag
names) and ``nereid.serve()``, the same server started from a Python script.

Owns option parsing only: one table of (flag, parser, help) rows builds the
argparse parser, and checks ``nereid.serve``'s keyword arguments with the same parsers, so
both reach ServerOptions with the same values and the same refusals.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence, TypeVar

from nereid import __version__
from nereid.network.access import GROUPS, GRPC_KEY_PREFIX, Restriction, parse_key, parse_restriction
from nereid.options import GRPC_SERVERS, HTTP_SERVERS, MODEL_CONTROL_MODES, ServerOptions, repository_paths

__all__ = ["main", "serve", "build_parser", "options_from_args", "options_from_keywords", "auto_http_workers",
           "usable_cores"]

_T = TypeVar("_T", int, float)


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _checked(parse: Callable[[str], _T], accept: Callable[[_T], bool], expected: str) -> Callable[[str], _T]:
    """A flag's parser: ``parse(text)`` (int or float), refused unless ``accept`` takes it."""

    def check(text: str) -> _T:
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return check


_size = _checked(int, lambda value: value > 0, "a positive number of bytes")
_seconds = _checked(float, lambda value: 0 < value < float("inf"), "a positive number of seconds")
_count = _checked(int, lambda value: value >= 0, "a whole number >= 0")
_amount = _checked(float, lambda value: 0 <= value < float("inf"), "a number >= 0")
_port = _checked(int, lambda value: 0 <= value <= 65535, "a port 0..65535")


_whole = _checked(int, lambda value: value >= 1, "a whole number >= 1 or auto")

#: --http-workers auto: a worker per this many cores the server may use ...
_CORES_PER_WORKER = 4
#: ... from this many cores on (fewer: the server's own process serves HTTP) ...
_WORKERS_FROM_CORES = 8
#: ... and at most this many workers
_MOST_WORKERS = 8


def auto_http_workers(cores: int) -> int:
    """``--http-workers auto`` on a machine where the server may use ``cores`` cores.

    A worker spends more CPU per request than the one-process server does (the link to
    the main process; perf/README.md, "Front-end workers": 44 us per inference in the
    workers plus 21 us in the main process, against 36 us with one process), so workers
    pay only where the cores they add outweigh that: not on small machines (2 cores:
    0.81x of one process). One per 4 cores leaves most of the machine to the main
    process's scheduler, the models' instances and the clients; past 8 the main process
    (about 20 us per inference on one core) is the limit, not the workers."""
    if cores < _WORKERS_FROM_CORES:
        return 1
    return min(cores // _CORES_PER_WORKER, _MOST_WORKERS)


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a container's or taskset's share)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - Linux has sched_getaffinity


def _workers(text: str) -> int | str:
    """--http-workers: a whole number >= 1, or ``auto`` (resolved with the other flags:
    ``_resolve_workers``)."""
    if text.strip().lower() == "auto":
        return "auto"
    return _whole(text)


def _resolve_workers(given: dict[str, Any]) -> None:
    """``--http-workers auto`` -> a number: ``auto_http_workers`` of the usable cores
    where workers can serve (the native engine, no Ray replicas), else 1."""
    if given.get("http_workers") != "auto":
        return
    native = given.get("http_server", "native") == "native"  # ServerOptions.http_server's default
    given["http_workers"] = auto_http_workers(usable_cores()) if native and not given.get("ray_replicas") else 1


def _url_size(text: str) -> int:
    value = _size(text)
    if value > 65535:  # httptools' URL parser takes no more
        raise argparse.ArgumentTypeError(f"expected at most 65535 bytes, got {text!r}")
    return value


def _restriction(parse: Callable[[str], Restriction]) -> Callable[[str], Restriction]:
    """A restricted-API flag's parser (its errors as argparse's)."""

    def check(text: str) -> Restriction:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return check


_http_restriction = _restriction(parse_restriction)
_grpc_restriction = _restriction(lambda text: parse_restriction(text, GRPC_KEY_PREFIX))
_metrics_restriction = _restriction(parse_key)


_DEFAULTS = ServerOptions()


@dataclasses.dataclass(frozen=True)
class _Flag:
    """One flag: its name (the ServerOptions field is the name with underscores), its
    parser, and its help, where ``{default}`` stands for the field's default."""

    flag: str
    parse: Callable[[str], Any]
    help: str
    choices: Sequence[str] | None = None
    repeat: bool = False
    metavar: str | None = None

    @property
    def field(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def help_text(self) -> str:
        return self.help.format(default=getattr(_DEFAULTS, self.field)) if "{default" in self.help else self.help


_FLAGS = (
    _Flag("--model-repository", Path, "a model repository folder (required; repeat it to serve the models of several: a model name must be in one only)", repeat=True, metavar="FOLDER"),
    _Flag("--http-address", str, "address to serve HTTP on (default {default}: loopback only)"),
    _Flag("--http-port", _port, "HTTP port (default {default})"),
    _Flag("--grpc-port", _port, "gRPC port (default {default})"),
    _Flag("--allow-grpc", _bool, "serve gRPC (default true)"),
    _Flag("--grpc-server", str, "gRPC engine (default {default})", GRPC_SERVERS),
    _Flag("--grpc-max-message-size", _size, "largest gRPC message in bytes, either way (default 2147483647, Triton's)"),
    _Flag("--grpc-keepalive-time", _size, "ms between keepalive pings (default {default})"),
    _Flag("--grpc-keepalive-timeout", _size, "ms to wait for a keepalive ack (default {default})"),
    _Flag("--grpc-keepalive-permit-without-calls", _bool, "allow keepalive pings with no call in flight (default false)"),
    _Flag("--grpc-http2-max-pings-without-data", int, "pings sent without data before waiting for data (default {default}; 0: no limit)"),
    _Flag("--grpc-http2-min-recv-ping-interval-without-data", _size, "ms a client must wait between pings without data (default {default})"),
    _Flag("--grpc-http2-max-ping-strikes", int, "bad pings tolerated before the connection is closed (default {default}; 0: any)"),
    _Flag("--grpc-max-connections", _size, "open gRPC connections at most; past it a new one is told GOAWAY (default {default}; native engine)"),
    _Flag("--grpc-handshake-timeout-secs", _seconds, "seconds a new gRPC connection has to send HTTP/2's preface and SETTINGS (default {default:g}; native engine)"),
    _Flag("--grpc-idle-timeout-secs", _seconds, "seconds a gRPC connection with no call may stay silent before GOAWAY (default {default:g}; native engine)"),
    _Flag("--metrics-port", _port, "Prometheus metrics port (default {default})"),
    _Flag("--allow-metrics", _bool, "serve Prometheus metrics (default true)"),
    _Flag("--model-control-mode", str, "none | poll | explicit (default none)", MODEL_CONTROL_MODES),
    _Flag("--repository-poll-secs", float, "poll interval in poll mode (default 5)"),
    _Flag("--load-model", str, "explicit mode: models to load at start (--load-model a b, or repeated; * for all)", repeat=True),
    _Flag("--strict-readiness", _bool, "ready only when every model is READY (default true)"),
    _Flag("--exit-timeout-secs", float, "seconds to let in-flight requests finish on shutdown (default 30)"),
    _Flag("--ray-replicas", _count, "serve on Ray Serve with this many replicas, each a whole nereid (default 0: not on Ray)"),
    _Flag("--ray-address", str, "the Ray cluster to join (default: start a local one)"),
    _Flag("--ray-replica-cpus", _amount, "CPUs Ray reserves per replica (default {default:g})"),
    _Flag("--ray-replica-gpus", _amount, "GPUs Ray reserves per replica (default {default:g})"),
    _Flag("--ray-min-replicas", _count, "autoscaling: fewest replicas (default {default})"),
    _Flag("--ray-max-replicas", _count, "autoscaling: most replicas (default 0: no autoscaling)"),
    _Flag("--ray-target-ongoing-requests", _seconds, "autoscaling: requests in flight per replica to aim for (default {default:g})"),
    _Flag("--log-verbose", int, "verbose logging level (0: off)"),
    _Flag("--log-info", _bool, "log info messages (default true)"),
    _Flag("--log-warning", _bool, "log warnings (default true)"),
    _Flag("--log-error", _bool, "log errors (default true)"),
    _Flag("--log-format", str, "default | ISO8601", ("default", "ISO8601")),
    _Flag("--http-server", str, "HTTP engine (default {default})", HTTP_SERVERS),
    _Flag("--http-workers", _workers, "front-end processes serving HTTP with the native engine, and gRPC too (native gRPC engine, plaintext); the models stay in one process, so batches hold requests from all of them; auto: one per 4 cores from 8 cores on, at most 8, else 1 (default 1: the server's own process serves HTTP and gRPC)", metavar="N|auto"),
    _Flag("--max-request-size", _size, "largest request body in bytes, after decompression (default 256 MiB)"),
    _Flag("--http-max-input-size", _size, "largest JSON header in bytes (default 64 MiB)"),
    _Flag("--allow-client-shm", _bool, "allow client shared-memory registration (default true)"),
    _Flag("--max-request-bytes-in-flight", _size, "request body bytes held at once over all connections; past it a new request over 64 KiB gets 503 (default 1 GiB)"),
    _Flag("--http-max-connections", _size, "open HTTP connections at most; past it 503 and close (default {default})"),
    _Flag("--http-max-url-size", _url_size, "longest request URL in bytes; past it 414 (default {default})"),
    _Flag("--http-max-header-count", _size, "most header lines in a request; past it 431 (default {default})"),
    _Flag("--http-max-header-size", _size, "largest request head (request line and headers) in bytes; past it 431 (default {default})"),
    _Flag("--http-header-timeout-secs", _seconds, "seconds for a request head to arrive once begun; past it 408 and close (default {default:g})"),
    _Flag("--http-body-timeout-secs", _seconds, "seconds a request body, or a client reading its answer, may stall; past it 408 and close (default {default:g})"),
    _Flag("--http-keepalive-timeout-secs", _seconds, "seconds an idle keep-alive connection stays open (default {default:g})"),
    _Flag("--http-use-ssl", _bool, "serve HTTPS instead of HTTP (default false); needs --http-server-cert and --http-server-key"),
    _Flag("--http-server-cert", Path, "HTTPS: the server's certificate (PEM; read at start)"),
    _Flag("--http-server-key", Path, "HTTPS: the server certificate's private key (PEM; read at start)"),
    _Flag("--http-root-cert", Path, "HTTPS: the CA certificate(s) that sign client certificates (PEM; for --http-use-ssl-mutual)"),
    _Flag("--http-use-ssl-mutual", _bool, "HTTPS with client certificates: a client without one signed by --http-root-cert is refused (default false; implies --http-use-ssl)"),
    _Flag("--grpc-use-ssl", _bool, "serve gRPC over TLS (default false); needs --grpc-server-cert and --grpc-server-key"),
    _Flag("--grpc-server-cert", Path, "gRPC TLS: the server's certificate (PEM; read at start)"),
    _Flag("--grpc-server-key", Path, "gRPC TLS: the server certificate's private key (PEM; read at start)"),
    _Flag("--grpc-root-cert", Path, "gRPC TLS: the CA certificate(s) that sign client certificates (PEM; for --grpc-use-ssl-mutual)"),
    _Flag("--grpc-use-ssl-mutual", _bool, "gRPC TLS with client certificates: a client without one signed by --grpc-root-cert is refused (default false; implies --grpc-use-ssl)"),
    _Flag("--http-restricted-api", _http_restriction, f"HTTP endpoint groups that need header <key> with <value>: <group>[,<group>...]:<key>=<value>, repeatable, a group in one only (groups: {', '.join(GROUPS)}); others get 403", repeat=True, metavar="GROUPS:KEY=VALUE"),
    _Flag("--grpc-restricted-protocol", _grpc_restriction, "gRPC groups that need metadata triton-grpc-protocol-<key> with <value>: <group>[,<group>...]:<key>=<value>, repeatable (groups as --http-restricted-api); others get UNAVAILABLE", repeat=True, metavar="GROUPS:KEY=VALUE"),
    _Flag("--metrics-restricted-api", _metrics_restriction, "the metrics port needs header <key> with <value>: <key>=<value> (others get 403)", metavar="KEY=VALUE"),
)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: what is wrong and where the flags are listed
    (argparse's default prints the whole usage first, which buries the error)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog if self.prog.endswith((" serve", " convert-config")) else f"{self.prog} serve"
        self.exit(2, f"{self.prog}: {message} (see '{command} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="nereid", description="A Python model server speaking Triton's HTTP protocol.")
    parser.add_argument("--version", action="version", version=f"nereid {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = commands.add_parser("serve", help="serve a model repository")
    for row in _FLAGS:
        kwargs: dict[str, Any] = {"dest": row.field, "type": row.parse, "help": row.help_text, "default": None}
        if row.choices:
            kwargs["choices"] = row.choices
        if row.field == "model_repository":  # tritonserver's way: one folder per flag, repeated
            kwargs["action"] = "append"
        elif row.repeat:  # tritonserver's way (several names after one flag) and repeated flags
            kwargs["action"] = "extend"
            kwargs["nargs"] = "+"
            kwargs["metavar"] = "NAME"
        if row.metavar:
            kwargs["metavar"] = row.metavar
        if row.field == "model_repository":
            kwargs["required"] = True
        serve.add_argument(row.flag, **kwargs)
    convert = commands.add_parser(
        "convert-config", help="print the config.toml that means what a Triton config.pbtxt means",
        description="Print the config.toml equivalent of a Triton config.pbtxt (a file, or a model folder holding "
                    "one), checked as the server would check it.",
    )
    convert.add_argument("path", type=Path, help="a config.pbtxt, or the model folder that holds it")
    return parser


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    """ServerOptions from parsed flags: flags not given keep ServerOptions' defaults."""
    given: dict[str, Any] = {}
    for row in _FLAGS:
        value = getattr(args, row.field)
        if value is not None:
            given[row.field] = tuple(value) if row.repeat else value
    given["model_repository"] = repository_paths(given["model_repository"])  # one folder: a Path, as ever
    _resolve_workers(given)
    return ServerOptions(**given)


_ROWS = {row.field: row for row in _FLAGS}


def options_from_keywords(
    model_repository: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], keywords: dict[str, Any]
) -> ServerOptions:
    """ServerOptions from ``nereid.serve``'s arguments: each keyword is a flag's field
    (``http_port`` for ``--http-port``), checked by that flag's own parser, so a value
    ``nereid serve`` refuses is refused here with the same words. Raises TypeError for a
    keyword that is no flag, ValueError for a value the flag refuses."""
    folders = _keyword_value(_ROWS["model_repository"], model_repository)
    if not folders:
        raise ValueError("nereid.serve(): model_repository: expected a folder or a list of folders, got an empty list")
    given: dict[str, Any] = {"model_repository": repository_paths(folders)}
    for name, value in keywords.items():
        row = _ROWS.get(name)
        if row is None:
            close = difflib.get_close_matches(name, list(_ROWS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else " (the keywords are `nereid serve`'s flags with underscores)"
            raise TypeError(f"nereid.serve() got an unexpected keyword argument {name!r}{hint}")
        if value is not None:  # None: the flag's default, as when the flag is not given
            given[name] = _keyword_value(row, value)
    _resolve_workers(given)
    return ServerOptions(**given)


def _keyword_value(row: _Flag, value: object) -> Any:
    """One keyword's value through its flag's parser (a list for a repeated flag)."""
    if row.repeat:
        items = [value] if isinstance(value, (str, os.PathLike)) else value
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"nereid.serve(): {row.field}: expected a name or a list of names, got {value!r}")
        return tuple(_keyword_value(dataclasses.replace(row, repeat=False), item) for item in items)
    text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if isinstance(value, bool) and row.parse is not _bool:
        text = repr(value)  # True is no port, no number of seconds
    try:
        parsed = row.parse(text)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        kind = {int: "a whole number", float: "a number"}.get(row.parse, "a valid value")  # type: ignore[call-overload]
        detail = str(exc) if isinstance(exc, argparse.ArgumentTypeError) else f"expected {kind}, got {value!r}"
        raise ValueError(f"nereid.serve(): {row.field}: {detail}") from None
    if row.choices and parsed not in row.choices:
        raise ValueError(f"nereid.serve(): {row.field}: expected one of {', '.join(row.choices)}, got {value!r}")
    return parsed


def serve(
    model_repository: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] = "model_repository", **options: Any
) -> int:
    """Serve ``model_repository`` (a folder, or a list of folders whose models are served
    together) the way ``nereid serve`` does: HTTP, gRPC and metrics,
    blocking until SIGINT or SIGTERM; returns the command's exit status (0 after a clean
    stop, 1 when a port could not be bound).

    ``options`` are ``nereid serve``'s flags with underscores (``http_port=9000``,
    ``model_control_mode="explicit"``, ``load_model=["add_one"]``), checked by the same
    parsers: a value the command refuses raises ValueError, an unknown keyword TypeError,
    before anything starts. Call it from the main thread (it owns the signals); from
    another thread or your own event loop, use ``nereid.Server`` (``await server.serve()``).
    """
    settings = options_from_keywords(model_repository, options)
    problem = _repositories_problem(settings.model_repositories, "model_repository")
    if problem is not None:
        raise ValueError(f"nereid.serve(): {problem}")
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "nereid.serve() runs in the main thread (it handles SIGINT and SIGTERM); on another thread or "
            "your own event loop, use nereid.Server(...) and `await server.serve()`"
        )
    return _prepare(settings)()


def _prepare(options: ServerOptions) -> Callable[[], int]:
    """What serves ``options`` until stopped (call it for the exit status). Raises
    ValueError for a setting the server refuses (e.g. poll secs 0), before anything
    starts."""
    if options.ray_replicas or options.ray_max_replicas:
        secured = [
            row.flag for row in _FLAGS
            if row.field.endswith(("use_ssl", "use_ssl_mutual", "restricted_api", "restricted_protocol"))
            and getattr(options, row.field)
        ]
        if secured:
            # Ray's own proxies serve the ports: nereid's TLS and restrictions would not apply.
            raise ValueError(f"{', '.join(secured)}: not available with --ray-replicas (Ray Serve's proxies serve the ports)")
        if options.http_workers > 1:
            raise ValueError("--http-workers: not available with --ray-replicas (Ray Serve's proxies serve the ports)")
        from nereid.ray.serve import run_on_ray  # imported late: Ray is an optional extra

        return lambda: run_on_ray(options)
    from nereid.server import Server  # imported late: `nereid --help` stays fast

    return Server(options).run


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        options = options_from_args(args)
        problem = _repositories_problem(options.model_repositories, "--model-repository")
        if problem is not None:
            print(f"nereid: {problem}", file=sys.stderr)
            return 2
        try:
            run = _prepare(options)
        except ValueError as exc:
            print(f"nereid: {exc}", file=sys.stderr)
            return 2
        return run()
    if args.command == "convert-config":
        return _convert_config(args.path)
    return 2  # pragma: no cover - argparse requires a command


def _convert_config(path: Path) -> int:
    """``nereid convert-config PATH``: the TOML on stdout, or the reason on stderr (2)."""
    from nereid.config.pbtxt import PBTXT_FILE, pbtxt_to_toml
    from nereid.errors import ConfigError

    file = path / PBTXT_FILE if path.is_dir() else path
    if not file.is_file():
        print(f"nereid convert-config: {file}: no such file", file=sys.stderr)
        return 2
    try:
        print(pbtxt_to_toml(file, file.resolve().parent.name), end="")
    except ConfigError as exc:
        print(f"nereid convert-config: {exc.message}", file=sys.stderr)
        return 2
    return 0


def _repositories_problem(paths: Sequence[Path], label: str) -> str | None:
    """Why the repository folders cannot be served (``LABEL FOLDER: why``, or a model name
    in several of them, as Triton refuses it), or None."""
    for path in paths:
        problem = _repository_problem(path)
        if problem is not None:
            return f"{label} {path}: {problem}"
    if len(paths) > 1:
        from nereid.repository.scan import duplicate_model_message, scan_repositories  # late: `--help` stays fast

        duplicates = scan_repositories(paths).duplicates
        if duplicates:
            return f"{label}: " + "; ".join(duplicate_model_message(name, where) for name, where in duplicates.items())
    return None


def _repository_problem(path: Path) -> str | None:
    """Why the repository folder cannot be served, or None."""
    if not path.exists():
        return "no such folder"
    if not path.is_dir():
        return "not a folder"
    if not os.access(path, os.R_OK | os.X_OK):
        return "cannot read the folder (permission denied)"
    return None
