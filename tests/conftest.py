"""Shared fixtures: a model-repository builder and a real nereid server on a free
loopback port (a subprocess, started the way users start it)."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import textwrap
import tomllib
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.waiting import START_TIMEOUT_S, wait_until

ROOT = Path(__file__).resolve().parent.parent
#: The example models. Under ``--isolation process``: a temporary copy of them whose
#: instance groups are processes (set in pytest_configure, before test modules import it).
EXAMPLES = ROOT / "model_repository"


# -- --isolation: the whole suite with process instances ----------------------------------
#
# ``pytest --isolation process`` runs every model the tests serve with process instances:
# each config RepoBuilder.add writes, and the examples (a rewritten copy replaces EXAMPLES),
# get ``isolation = "process"`` on every [[instance_group]] that does not choose its own
# isolation (with none, Triton's default group is added, with that isolation).
# Configs tomllib cannot read, or whose instance_group is malformed, are left as written
# (their tests expect the load error). JSON overrides sent to the load API are left alone.
# Tests that check something only a thread instance has are marked
# ``@pytest.mark.thread_only("why")`` and skipped under ``--isolation process``.

#: "thread" (the default) or "process"; set from the command line in pytest_configure.
ISOLATION = "thread"

# -- --repo-format: the whole suite with Triton's config.pbtxt -----------------------------
#
# ``pytest --repo-format pbtxt`` writes every config RepoBuilder.add writes, and every
# config of the examples (in a copy), as Triton's config.pbtxt instead of config.toml: the
# TOML is read by nereid, rendered as Triton's JSON (nereid's extensions as parameters) and
# written in protobuf's text format. A TOML the server would refuse is left as it is (its
# test expects that error). Tests about the config.toml file itself are marked
# ``@pytest.mark.toml_only("why")`` and skipped under ``--repo-format pbtxt``.

#: "toml" (the default) or "pbtxt"; set from the command line in pytest_configure.
REPO_FORMAT = "toml"

#: Triton's files vendored unchanged (their own test scripts among them, e.g. qa's
#: ensemble_test.py) are run by tests/e2e/test_triton_models.py, never collected as ours.
collect_ignore = ["triton_examples"]


# -- --workers: the e2e suite through front-end worker processes ---------------------------
#
# ``pytest --workers N`` starts every server (start_server) with ``--http-workers N`` unless
# the test chooses its workers or another HTTP engine itself.

#: --http-workers of the servers tests start; set from the command line in pytest_configure.
WORKERS = 1


# -- which e2e tests the extra passes of `make test` run -------------------------------------
#
# `make test` runs the whole suite once (thread instances, config.toml, one HTTP process),
# then tests/e2e again under --isolation process, under --repo-format pbtxt and under
# --workers 2. Full e2e passes took most of a 17-23 minute `make test` on a 2-core machine,
# and most e2e files test the front end (HTTP/1.1 framing, gRPC, TLS, restricted APIs,
# logging, CLI flags, hostile clients), which behaves the same wherever model code runs and
# whichever file a config came from. So each extra pass selects, by marker, the files whose
# behaviour depends on its setting (read from what each file exercises), plus a smoke of
# the rest: every example model and every datatype through the stock clients. `make
# test-full` runs the extra passes over all of tests/e2e. A test can also carry a marker
# itself (@pytest.mark.isolation_sensitive), in a file not listed, when only some of the
# file's tests depend on the setting; and a run that cannot differ under a pass's setting
# is left out of that pass (see _asgi_engine and the without_workers marker below).

#: Where model code runs changes what these exercise (-m isolation_sensitive): batching and
#: statistics across a process boundary, model faults and BaseExceptions in a worker,
#: streaming and decoupled models, warmup, shared memory, load/unload/reload of worker
#: processes, Triton's BLS and pb_utils models, the in-process API, failed loads, the
#: stats and config endpoints (which show the isolation). test_process_*.py, test_shared_process.py and
#: test_device_tensors.py choose their isolation themselves, so they are not repeated.
#: test_frontend_workers*.py are not repeated either: front-end workers talk only to the main
#: process (nereid/frontends imports nothing of nereid/instances), whose queue hands every
#: request to an instance the same way wherever it runs; the two settings meet only in the
#: main process, which this pass exercises through every other file. Likewise a test run
#: with an ASGI engine (a parameter naming uvicorn, hypercorn or granian, e.g.
#: test_base_exceptions.py's server) is left out: an HTTP engine reaches the instances only
#: through that queue, so this pass runs such a test with the native engine.
ISOLATION_SENSITIVE = frozenset({
    "test_base_exceptions.py", "test_batching_http.py", "test_bls.py", "test_custom_metrics.py", "test_endpoints.py",
    "test_ensembles.py", "test_generate.py", "test_inprocess.py", "test_model_control.py",
    "test_model_faults.py", "test_sequences.py", "test_shared_memory.py",
    "test_triton_models.py", "test_unavailable_reasons.py",
})

#: Whether a config was config.toml or config.pbtxt changes what these exercise
#: (-m config_format_sensitive): loading and reloading configs, the config endpoint with
#: every default, Triton's auto-complete and config.pbtxt examples, failed loads and their
#: reasons, the batching, decoupled and instance-group settings, and nereid's own keys
#: (isolation, input_tensors, max_concurrent_batches, warmup), which pbtxt carries as parameters.
CONFIG_FORMAT_SENSITIVE = frozenset({
    "test_batching_http.py", "test_device_tensors.py", "test_endpoints.py", "test_ensembles.py", "test_generate.py",
    "test_model_control.py", "test_process_features.py", "test_process_instances.py", "test_sequences.py",
    "test_shared_process.py",
    "test_several_repositories.py", "test_triton_models.py", "test_unavailable_reasons.py",
})

#: The smoke both extra passes add: every example model (served in the pass's form) and
#: every datatype and the stock clients' flows over HTTP.
SMOKE = frozenset({"test_examples.py", "test_infer_http.py"})

#: What front-end workers change (-m workers_sensitive, under --workers 2): every request
#: crossing from a worker to the main process (infer decoded in the worker or sent raw,
#: everything else forwarded) or answered in the worker (health, metadata and config from
#: its picture of the models: every reason a model or version is not ready, restricted
#: groups), answers, errors and limits seen from outside: the HTTP protocol, its errors and
#: bad input, HTTPS, batching and statistics, model control, shared memory, streaming,
#: metrics, disconnects, hostile clients, the stock clients and perf_analyzer, the start-up
#: log; gRPC (served by the workers too: ModelInfer decoded there, every other call
#: relayed) and its errors. A test of these files run with an ASGI ``engine`` (its ``engine`` parameter:
#: uvicorn, hypercorn, granian) gets no workers (start_server adds --http-workers to the
#: native engine only), so this pass leaves it out: it would run exactly as in the main
#: pass; so does a test run with grpcio's gRPC server (a ``grpcio`` parameter: the main
#: process serves gRPC then, and the test's ``native`` twin crosses the workers), and a test marked ``without_workers`` (in-process only, or a command
#: line the test runs itself, which start_server does not give workers).
#: test_model_control.py and test_ensembles.py are not listed: their tests that depend on
#: the workers carry the marker themselves (their docstrings say which and why).
WORKERS_SENSITIVE = frozenset({
    "test_bad_input.py", "test_batching_http.py", "test_cli.py", "test_clients.py", "test_disconnect.py",
    "test_endpoints.py", "test_errors_json.py", "test_generate.py", "test_grpc.py",
    "test_grpc_errors.py", "test_hostile_clients.py",
    "test_metrics.py", "test_native_http.py", "test_perf_analyzer.py", "test_restricted.py",
    "test_sequences.py", "test_several_repositories.py", "test_shared_memory.py", "test_tls.py",
    "test_unavailable_reasons.py",
})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--isolation", choices=("thread", "process"), default="thread",
                     help="the isolation of the instances of every model the e2e tests serve")
    parser.addoption("--repo-format", choices=("toml", "pbtxt"), default="toml",
                     help="the config file of every model the e2e tests serve: config.toml or Triton's config.pbtxt")
    parser.addoption("--workers", type=int, default=1,
                     help="--http-workers of every server the e2e tests start that serves plain HTTP natively")


def write_config(folder: Path, toml_text: str) -> None:
    """The model's config file in REPO_FORMAT (see --repo-format)."""
    if REPO_FORMAT == "pbtxt":
        pbtxt = as_pbtxt(toml_text, folder.name)
        if pbtxt is not None:
            (folder / "config.pbtxt").write_text(pbtxt)
            return
    (folder / "config.toml").write_text(toml_text)


def as_pbtxt(toml_text: str, model: str) -> str | None:
    """The config.pbtxt that means what ``toml_text`` means; None when nereid refuses it."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    from nereid.config import parse_model_config, to_triton_json
    from nereid.errors import ConfigError

    try:
        config = parse_model_config(tomllib.loads(toml_text), source="config.toml", folder_name=model)
    except (tomllib.TOMLDecodeError, ConfigError):
        return None
    message = json_format.ParseDict(to_triton_json(config), model_config_pb2.ModelConfig())
    return str(text_format.MessageToString(message))


def pytest_configure(config: pytest.Config) -> None:
    global ISOLATION, EXAMPLES
    # registered here, not in pyproject.toml: editing that would make `make -q install`
    # (test_readme's check that .venv is current) see the venv as stale
    config.addinivalue_line(
        "markers", "thread_only(reason): checks what only a thread instance has; skipped under --isolation process"
    )
    config.addinivalue_line(
        "markers", "toml_only(reason): checks the config.toml file itself; skipped under --repo-format pbtxt"
    )
    config.addinivalue_line(
        "markers", "install: installs nereid into a fresh virtual environment (pip; tests/install)"
    )
    config.addinivalue_line(
        "markers", "isolation_sensitive: e2e tests `make test` runs again under --isolation process (ISOLATION_SENSITIVE)"
    )
    config.addinivalue_line(
        "markers", "config_format_sensitive: e2e tests `make test` runs again under --repo-format pbtxt "
        "(CONFIG_FORMAT_SENSITIVE)"
    )
    config.addinivalue_line(
        "markers", "workers_sensitive: e2e tests `make test` runs again under --workers 2 (WORKERS_SENSITIVE)"
    )
    config.addinivalue_line(
        "markers", "without_workers(reason): sends nothing through a server start_server starts (in-process "
        "only, or a command line run by itself), so --workers changes nothing; the --workers pass of `make test` leaves it out"
    )
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "testrunuid", None) is None:
        # the controller of an xdist run names the run itself, to remove the workers' port
        # claims (free_port) when it ends
        config.option.testrunuid = uuid.uuid4().hex
    global REPO_FORMAT, WORKERS
    WORKERS = config.getoption("workers")
    ISOLATION = config.getoption("isolation")
    REPO_FORMAT = config.getoption("repo_format")
    if ISOLATION == "process" or REPO_FORMAT == "pbtxt":
        copy = Path(tempfile.mkdtemp(prefix="nereid-examples-")) / "model_repository"
        shutil.copytree(ROOT / "model_repository", copy)
        for path in copy.glob("*/config.toml"):
            text = with_isolation(path.read_text(), path.parent.name)
            path.unlink()
            write_config(path.parent, text)
        EXAMPLES = copy


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller of an xdist run ends last
        run = getattr(config.option, "testrunuid", None)
        if run is not None:
            shutil.rmtree(_ports_path(run), ignore_errors=True)
    if EXAMPLES != ROOT / "model_repository":
        shutil.rmtree(EXAMPLES.parent, ignore_errors=True)


def with_isolation(config: str, model: str) -> str:
    """``config`` (TOML text) of model ``model`` with ISOLATION on every instance group that
    sets none. With no group, the one added is Triton's default (one instance, KIND_AUTO,
    named after the model), so that only its isolation differs."""
    if ISOLATION == "thread":
        return config
    try:
        data = tomllib.loads(config)
    except tomllib.TOMLDecodeError:
        return config
    if data.get("platform") == "ensemble":  # an ensemble has no instances (its steps' models do)
        return config
    groups = data.get("instance_group")
    if groups is None:  # appended as a new top-level array of tables: valid after any table
        return f'{config.rstrip()}\n\n[[instance_group]]\nname = {json.dumps(model)}\nisolation = "{ISOLATION}"\n'
    if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
        return config
    if all("isolation" in group for group in groups):
        return config
    for group in groups:
        group.setdefault("isolation", ISOLATION)
    # Re-emitted with every top-level value inline (comments are lost; nothing reads them).
    text = "".join(f"{_toml_key(key)} = {_toml_value(value)}\n" for key, value in data.items())
    assert tomllib.loads(text) == data, text
    return text


def _toml_key(key: str) -> str:
    return json.dumps(key)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return value.isoformat()  # type: ignore[attr-defined]  # dates and times


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers come from the directory: tests/e2e -> e2e, tests/gpu -> gpu, tests/unit -> unit,
    tests/ray -> ray, tests/install -> install; e2e files named in ISOLATION_SENSITIVE,
    CONFIG_FORMAT_SENSITIVE or SMOKE get the extra passes' markers.
    Under ``--isolation process``, ``thread_only`` tests are skipped."""
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts[0] in ("e2e", "gpu", "unit", "ray", "install"):
            item.add_marker(parts[0])
        if parts[0] == "e2e":
            if parts[-1] in ISOLATION_SENSITIVE | SMOKE and not _asgi_engine(item):
                item.add_marker("isolation_sensitive")
            if parts[-1] in CONFIG_FORMAT_SENSITIVE | SMOKE:
                item.add_marker("config_format_sensitive")
            if (parts[-1] in WORKERS_SENSITIVE | SMOKE and not _asgi_engine(item) and not _grpcio_engine(item)
                    and not item.get_closest_marker("without_workers")):
                item.add_marker("workers_sensitive")
        if parts[0] in ("e2e", "gpu", "ray", "install") and item.get_closest_marker("timeout") is None:
            # A server started in setup may take START_TIMEOUT_S on a loaded machine; the
            # per-test limit (pyproject's, 120 s) must leave it that long and the test its time.
            item.add_marker(pytest.mark.timeout(START_TIMEOUT_S + 120))
        if parts[0] == "gpu" and not _cuda_available():
            item.add_marker(pytest.mark.skip(reason="no CUDA device visible"))
        thread_only = item.get_closest_marker("thread_only")
        if thread_only is not None and ISOLATION != "thread":
            item.add_marker(pytest.mark.skip(reason=f"thread instances only: {thread_only.args[0]}"))
        toml_only = item.get_closest_marker("toml_only")
        if toml_only is not None and REPO_FORMAT != "toml":
            item.add_marker(pytest.mark.skip(reason=f"config.toml only: {toml_only.args[0]}"))


def _asgi_engine(item: pytest.Item) -> bool:
    """Whether ``item`` is the run of a test (or of its server fixture) with an ASGI engine:
    one of its parameters names one."""
    return any(isinstance(value, str) and value in ASGI_ENGINES for value in _parameters(item))


def _grpcio_engine(item: pytest.Item) -> bool:
    """Whether ``item`` is the run of a test (or of its server fixture) with grpcio's gRPC
    server (a parameter ``grpcio``): the main process serves the gRPC port then, so only
    its HTTP crosses the workers, which its ``native`` twin exercises too."""
    return "grpcio" in _parameters(item)


def _parameters(item: pytest.Item) -> list[object]:
    """The values of ``item``'s parameters (its fixtures' too); none when it has none."""
    callspec = getattr(item, "callspec", None)
    return list(callspec.params.values()) if callspec is not None else []


#: The HTTP engines --http-server chooses besides the native one (start_server gives them no workers).
ASGI_ENGINES = frozenset({"uvicorn", "hypercorn", "granian"})


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@functools.cache
def visible_gpu_ids() -> tuple[int, ...]:
    """The GPUs the server sees: KIND_AUTO instances go there when there are any."""
    if not _cuda_available():
        return ()
    import torch

    return tuple(range(torch.cuda.device_count()))


# -- repositories -------------------------------------------------------------------------

#: A batching FP32 [4] -> FP32 [4] model's config (max_batch_size 8), for IDENTITY_MODEL;
#: tests append their own sections ([dynamic_batching], more outputs, ...).
IDENTITY_CONFIG = """
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [4]
"""

IDENTITY_MODEL = """
class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""


@dataclass
class RepoBuilder:
    """Writes model folders into a temporary repository."""

    root: Path

    def add(self, name: str, config: str, model: str | None = IDENTITY_MODEL, version: int | None = None,
            files: dict[str, str] | None = None) -> Path:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        for stale in ("config.toml", "config.pbtxt"):
            (folder / stale).unlink(missing_ok=True)
        write_config(folder, with_isolation(textwrap.dedent(config), name))
        target = folder / str(version) if version is not None else folder
        target.mkdir(parents=True, exist_ok=True)
        if model is not None:
            (target / "model.py").write_text(textwrap.dedent(model))
        for rel, text in (files or {}).items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        return folder


@pytest.fixture
def repo(tmp_path: Path) -> RepoBuilder:
    root = tmp_path / "models"
    root.mkdir()
    return RepoBuilder(root)


# -- servers ------------------------------------------------------------------------------


_HANDED_OUT: set[int] = set()


def _ports_path(run: str) -> Path:
    """The folder of xdist run ``run``'s port claims (see ``_ports_folder``)."""
    return Path(tempfile.gettempdir()) / f"nereid-test-ports-{run}"


def _ports_folder() -> Path | None:
    """Under pytest-xdist (``-n``): a folder every worker of this run shares, where a file
    per port handed out claims it for the whole run; None in a run of one process."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return None
    folder = _ports_path(run)
    folder.mkdir(exist_ok=True)
    return folder


def free_port() -> int:
    """A loopback port free now, and not handed out before in this run (by this process or,
    under pytest-xdist, by another worker): the socket is closed before the server binds
    it, so the OS may offer the same number again (a server's HTTP and gRPC ports then
    collided)."""
    folder = _ports_folder()
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port in _HANDED_OUT:
            continue
        _HANDED_OUT.add(port)
        if folder is not None:
            try:
                os.close(os.open(folder / str(port), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:  # another worker's
                continue
        return port


@dataclass
class RunningServer:
    """A nereid subprocess. ``url`` is ``127.0.0.1:PORT`` as tritonclient wants it."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    stopped: bool = field(default=False)
    #: the gRPC port (None when gRPC is off)
    grpc_port: int | None = None
    #: the metrics port start_server chose (None when the test passed its own or none)
    metrics_port: int | None = None
    #: the model repository folder it serves (start_server's first argument)
    repository: Path | None = None

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def gauge(self, name: str, model: str) -> float:
        """A per-model gauge of ``/metrics`` now, e.g. ``nv_inference_pending_request_count``
        (requests queued) or ``nereid_batches_executing`` (batches running): what a test
        waits on to know a request is queued or running, instead of sleeping."""
        from prometheus_client.parser import text_string_to_metric_families

        assert self.metrics_port is not None, "no metrics port chosen by start_server"
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.name == name and sample.labels.get("model") == model)

    def stop(self, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise AssertionError(f"nereid did not stop within {timeout}s on SIGTERM:\n{self.log()}")
        self.stopped = True
        return int(self.process.returncode)


def start_server(repository: Path, *args: str, log_dir: Path, wait_ready: bool = True,
                 timeout: float = START_TIMEOUT_S, engine: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 ready_headers: dict[str, str] | None = None) -> RunningServer:
    """Start ``python -m nereid serve`` on a free loopback port and wait for health
    (over HTTPS with ``ssl_context``; ``ready_headers`` for a restricted health group)."""
    port = free_port()
    log_path = log_dir / f"nereid-{port}.log"
    command = [sys.executable, "-m", "nereid", "serve", "--model-repository", str(repository),
               "--http-port", str(port), *args]
    metrics_port = None
    if "--metrics-port" not in args and "--allow-metrics" not in args:
        # Test servers run side by side: each gets its own free metrics port, never 8002.
        metrics_port = free_port()
        command += ["--metrics-port", str(metrics_port)]
    grpc_port = int(args[args.index("--grpc-port") + 1]) if "--grpc-port" in args else None
    if grpc_port is None and "--allow-grpc" not in args:
        grpc_port = free_port()  # likewise: never 8001
        command += ["--grpc-port", str(grpc_port)]
    if engine is not None:
        command += ["--http-server", engine]
    if WORKERS > 1 and engine in (None, "native") and not {"--http-workers", "--http-server"} & set(args):
        command += ["--http-workers", str(WORKERS)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = RunningServer(process, port, log_path, grpc_port=grpc_port, metrics_port=metrics_port, repository=repository)
    path = "/v2/health/ready" if wait_ready else "/v2/health/live"
    base = f"https://{server.url}" if ssl_context is not None else server.http

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"nereid exited with {process.returncode}:\n{server.log()}")
        try:
            ready = urllib.request.Request(base + path, headers=ready_headers or {})
            with urllib.request.urlopen(ready, timeout=1, context=ssl_context) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    try:
        wait_until(up, lambda: f"nereid {'ready' if wait_ready else 'live'}:\n{server.log()}", timeout=timeout, every=0.05)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    """``serve(repository, *flags)`` starts a server for this test; stopped afterwards."""
    servers: list[RunningServer] = []

    def _serve(repository: Path, *args: str, **kwargs: object) -> RunningServer:
        server = start_server(repository, *args, log_dir=tmp_path, **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield _serve
    for server in servers:
        if not server.stopped:
            server.stop()


@pytest.fixture(scope="session")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server over model_repository/ for the whole session."""
    server = start_server(EXAMPLES, log_dir=tmp_path_factory.mktemp("example-server"))
    yield server
    server.stop()
