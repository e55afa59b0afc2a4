"""The in-process surface: infer on a served model from Python, without HTTP.

Owns turning Python values (a dict of arrays) into a checked InferRequest and back, for
``nereid.Server``'s ``infer`` / ``stream`` methods. Goes through the same ModelManager
and batchers as HTTP; knows nothing about HTTP or JSON.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import queue
import threading
import time
from types import TracebackType
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence, TypedDict, Unpack

import numpy as np

from nereid.config.schema import ModelConfig, ModelInput
from nereid.datatypes import DataType
from nereid.errors import InvalidInputError, NereidError, UnsupportedError
from nereid.inference import InferRequest, ParameterValue, SequenceFlags
from nereid.models.manager import IndexEntry, ModelManager
from nereid.models.serving import ServingModel
from nereid.options import ServerOptions, repository_paths
from nereid.tensors.checks import ConfigRules, Facts, Problem, triton_text
from nereid.triton_python import pb_utils

__all__ = ["LocalEndpoint", "InProcessServer", "RequestOptions", "ServerBls"]


class RequestOptions(TypedDict, total=False):
    """The optional arguments of one in-process request."""

    version: int | None
    parameters: Mapping[str, ParameterValue] | None
    priority: int
    timeout_us: int | None
    #: sequence batching: the correlation id and the START / END flags (as tritonclient's
    #: ``sequence_id``, ``sequence_start``, ``sequence_end``).
    sequence_id: int | str
    sequence_start: bool
    sequence_end: bool


class LocalEndpoint:
    """Async in-process inference over a ModelManager (Triton's in-process API, Ray's
    handle). Inputs are checked against the model config like HTTP requests are.
    Options (``RequestOptions``): ``version``, ``parameters``, ``priority``, ``timeout_us``,
    and for a sequence model ``sequence_id``, ``sequence_start``, ``sequence_end``."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    async def infer(
        self, model: str, inputs: Mapping[str, Any], **options: Unpack[RequestOptions]
    ) -> dict[str, np.ndarray]:
        """One request; returns its outputs (name -> numpy array, batch dim included)."""
        received = time.monotonic_ns()
        serving, request = self._request(model, inputs, options)
        if serving.config.decoupled:
            raise UnsupportedError(f"model '{model}' is decoupled (it streams): use stream() instead of infer()")
        return await serving.infer(request, received)

    async def stream(
        self, model: str, inputs: Mapping[str, Any], **options: Unpack[RequestOptions]
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """One request; yields its outputs step by step (a non-decoupled model yields once)."""
        received = time.monotonic_ns()
        serving, request = self._request(model, inputs, options)
        if not serving.config.decoupled:
            yield await serving.infer(request, received)
            return
        async for step in serving.stream(request, received):
            yield step

    def _request(self, model: str, inputs: Mapping[str, Any], options: RequestOptions) -> tuple[ServingModel, InferRequest]:
        serving = self.manager.get(model, options.get("version"))
        request = build_request(
            serving.config, model, inputs, options.get("parameters"), options.get("priority", 0),
            options.get("timeout_us"),
        )
        if "sequence_id" in options or "sequence_start" in options or "sequence_end" in options:
            request.sequence = SequenceFlags(
                options.get("sequence_id", 0), options.get("sequence_start", False), options.get("sequence_end", False)
            )
        return serving, request


class ServerBls:
    """One server's BLS target: lets its Triton Python-backend models call its other
    models (``pb_utils.InferenceRequest(...).exec()``), through a LocalEndpoint on the
    server's loop, from their instance threads. The model loader hands it to each
    TritonModel (``nereid.triton_python.bls``); ``bind`` gives it the server's endpoint
    and loop once the server runs."""

    def __init__(self) -> None:
        self._endpoint: LocalEndpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, endpoint: LocalEndpoint, loop: asyncio.AbstractEventLoop) -> None:
        """The server's endpoint, and the loop its models run on (where BLS requests go)."""
        self._endpoint, self._loop = endpoint, loop

    def infer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        endpoint, loop = self._running()
        if _on(loop):
            raise pb_utils.TritonModelException("exec() cannot wait on the server's event loop: use async_exec()")
        return asyncio.run_coroutine_threadsafe(self._infer(endpoint, request), loop).result()

    def stream(self, request: pb_utils.InferenceRequest) -> Iterator[pb_utils.InferenceResponse]:
        steps: queue.SimpleQueue[pb_utils.InferenceResponse | None] = queue.SimpleQueue()
        model, inputs, options = _bls_arguments(request)
        wanted = request.requested_output_names()

        endpoint, loop = self._running()

        async def pump() -> None:
            try:
                async for step in endpoint.stream(model, inputs, **options):
                    steps.put(_bls_response(step, wanted))
            except NereidError as exc:
                steps.put(_bls_failed(exc))
            finally:
                steps.put(None)

        asyncio.run_coroutine_threadsafe(pump(), loop)
        while (item := steps.get()) is not None:
            yield item

    async def ainfer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        """``infer`` on the server's loop (a process instance's BLS request)."""
        return await self._infer(self._running()[0], request)

    async def astream(self, request: pb_utils.InferenceRequest) -> AsyncIterator[pb_utils.InferenceResponse]:
        """``stream`` on the server's loop (a process instance's BLS request)."""
        endpoint = self._running()[0]
        model, inputs, options = _bls_arguments(request)
        wanted = request.requested_output_names()
        try:
            async for step in endpoint.stream(model, inputs, **options):
                yield _bls_response(step, wanted)
        except NereidError as exc:
            yield _bls_failed(exc)

    @staticmethod
    async def _infer(endpoint: LocalEndpoint, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        model, inputs, options = _bls_arguments(request)
        try:
            outputs = await endpoint.infer(model, inputs, **options)
        except NereidError as exc:
            return _bls_failed(exc)
        return _bls_response(outputs, request.requested_output_names())

    def _running(self) -> tuple[LocalEndpoint, asyncio.AbstractEventLoop]:
        endpoint, loop = self._endpoint, self._loop
        if endpoint is None or loop is None or loop.is_closed():
            raise pb_utils.TritonModelException("BLS is not available here: the server is not running")
        return endpoint, loop


def _bls_arguments(request: pb_utils.InferenceRequest) -> tuple[str, dict[str, Any], RequestOptions]:
    version = request.model_version()
    options = RequestOptions(
        version=version if version >= 0 else None, parameters=json_parameters(request.parameters())
    )
    if request.timeout():
        options["timeout_us"] = request.timeout()
    return request.model_name(), {t.name(): t.as_numpy() for t in request.inputs()}, options


def _bls_response(outputs: Mapping[str, np.ndarray], wanted: list[str]) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in outputs.items() if not wanted or n in wanted])


def _bls_failed(exc: NereidError) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(exc.message))


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def json_parameters(text: str) -> dict[str, Any]:
    value = json.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


def build_request(
    config: ModelConfig,
    model: str,
    inputs: Mapping[str, Any],
    parameters: Mapping[str, ParameterValue] | None = None,
    priority: int = 0,
    timeout_us: int | None = None,
) -> InferRequest:
    """A checked InferRequest from Python values: each value becomes an array of its
    input's datatype here, then the request is checked by the one checking core
    (``nereid.tensors.checks``), its problems worded for Python callers. Raises
    InvalidInputError naming the model, the input, what was expected and what was given."""
    arrays: dict[str, np.ndarray] = {}
    facts: dict[str, _ArrayFacts] = {}
    known = {tensor.name: tensor for tensor in config.input}
    for name, value in inputs.items():
        spec = known.get(name)
        array = _as_array(model, spec, value) if spec is not None else np.asarray(value, dtype=object)
        arrays[name] = array
        facts[name] = _ArrayFacts(array, spec)
    _, rows = ConfigRules(config).check_inputs(facts, model, render=_python_text)
    return InferRequest(
        model_name=model,
        inputs=arrays,
        rows=rows,
        parameters=dict(parameters or {}),
        priority=priority,
        timeout_us=timeout_us,
    )


class _ArrayFacts:
    """An array as the checking core reads an input. Its datatype is the config's (the
    array was made, or checked, for it by _as_array); an unknown input has none."""

    __slots__ = ("dt", "shape", "size", "negative")

    def __init__(self, array: np.ndarray, spec: ModelInput | None) -> None:
        self.dt: DataType | None = spec.data_type if spec is not None else None
        self.shape: tuple[int, ...] = array.shape
        self.size = array.nbytes
        self.negative = False


def _python_text(facts: Facts) -> str:
    """A problem of an in-process request, in Python's terms (shapes as lists)."""
    p, m, name, d = facts.problem, facts.model, facts.input, facts.detail
    where = f"model '{m}', input '{name}'"
    if p is Problem.UNEXPECTED_INPUT:
        return f"unexpected inference input '{name}' for model '{m}' (inputs: {list(d['inputs'])})"
    if p is Problem.INPUT_COUNT:
        if d["missing"]:
            return f"model '{m}': missing required input '{d['missing'][0]}'"
        return f"model '{m}': expected at most {d['inputs']} inputs, got {len(d['got'])}: {list(d['got'])}"
    if p is Problem.NO_BATCH_DIMENSION or p is Problem.SHAPE:
        return f"{where}: expected shape {list(d['expected'])}, got {list(d['got'])}"
    if p is Problem.BATCH_MISMATCH:
        return f"{where}: expected batch size {d['expected']} (as the other inputs), got {d['got']}"
    if p is Problem.BATCH_SIZE:
        return f"{where}: expected a batch of 1..{d['max']} rows, got {d['batch']}"
    return triton_text(facts)  # datatype and byte size: _as_array made them right


def _as_array(model: str, spec: ModelInput, value: Any) -> np.ndarray:
    dtype = spec.data_type
    if dtype.is_bytes:
        array = np.asarray(value, dtype=object)
        flat = array.reshape(-1)
        for index, item in enumerate(flat):
            if isinstance(item, str):
                flat[index] = item.encode("utf-8")
            elif not isinstance(item, bytes):
                raise InvalidInputError(
                    f"model '{model}', input '{spec.name}': expected str or bytes elements (STRING), "
                    f"got {type(item).__name__}",
                    model=model, input=spec.name,
                )
        return array
    if isinstance(value, np.ndarray):
        if value.dtype != dtype.numpy:
            raise InvalidInputError(
                f"model '{model}', input '{spec.name}': expected data type {dtype.wire_name} "
                f"(numpy {dtype.numpy}), got numpy {value.dtype}",
                model=model, input=spec.name,
            )
        return value
    if type(value).__module__.startswith("torch"):
        return _as_array(model, spec, value.detach().cpu().numpy())
    try:
        return np.asarray(value, dtype=dtype.numpy)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"model '{model}', input '{spec.name}': expected values convertible to {dtype.wire_name}, got {exc}",
            model=model, input=spec.name,
        ) from exc


class InProcessServer:
    """Load a model repository and infer on it from Python, through the same model
    manager, batchers and instances as the HTTP server (which extends this class).

    Sync use starts a private event loop on a background thread::

        with nereid.Server("model_repository") as server:
            outputs = server.infer("add_one", {"INPUT0": np.array([[41]])})
            for step in server.stream("text_generator", {"text_input": [["Hello"]]}):
                ...

    Async use runs on the caller's loop: ``async with nereid.Server(...) as server:
    await server.ainfer(...)``, ``async for step in server.astream(...)``. Calls from
    many threads (or tasks) at once are batched together like HTTP requests.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | ServerOptions = "model_repository",
        **options: Any,
    ) -> None:
        if isinstance(model_repository, ServerOptions):
            self.options = dataclasses.replace(model_repository, **options) if options else model_repository
        else:
            self.options = ServerOptions(model_repository=repository_paths(model_repository), **options)
        #: how this server's Triton models reach its other models (BLS)
        self.bls = ServerBls()
        self.manager = self._make_manager()
        self.local = LocalEndpoint(self.manager)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _make_manager(self) -> ModelManager:
        options = self.options
        return ModelManager(
            options.model_repositories,
            mode=options.model_control_mode,
            startup_models=options.load_model,
            poll_secs=options.repository_poll_secs,
            bls=self.bls,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the models (as the control mode says) on the running loop."""
        self.bind_bls()
        await self.manager.start()

    def bind_bls(self) -> None:
        """Let this server's Triton models call its other models, through the running loop."""
        self.bls.bind(self.local, asyncio.get_running_loop())

    async def aclose(self) -> None:
        """Drain and unload every model."""
        await self.manager.close()

    async def __aenter__(self) -> InProcessServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> InProcessServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="nereid-inprocess", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self._call(self.start())
        except BaseException:
            self._stop_thread()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self._call(self.aclose())
        finally:
            self._stop_thread()

    def _stop_thread(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
        self._loop = self._thread = None

    def _call(self, coro: Any) -> Any:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the server is not started: use `with nereid.Server(...) as server:` "
                               "(or `async with` and the a-prefixed methods)")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # -- inference -------------------------------------------------------------------------

    def infer(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> dict[str, np.ndarray]:
        """Blocking: one request's outputs. Keyword arguments: version, parameters,
        priority, timeout_us; sequence_id, sequence_start, sequence_end for a sequence model."""
        result: dict[str, np.ndarray] = self._call(self.local.infer(model, inputs, **kwargs))
        return result

    async def ainfer(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> dict[str, np.ndarray]:
        """One request's outputs, on the caller's loop (``async with`` use)."""
        return await self.local.infer(model, inputs, **kwargs)

    def stream(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> Iterator[dict[str, np.ndarray]]:
        """Blocking iterator over one request's streamed outputs (decoupled models)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the server is not started: use `with nereid.Server(...) as server:`")
        steps: queue.Queue[Any] = queue.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for step in self.local.stream(model, inputs, **kwargs):
                    steps.put(step)
            except BaseException as exc:  # handed to the caller's thread
                steps.put(exc)
            finally:
                steps.put(done)

        future: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(pump(), loop)
        try:
            while True:
                item = steps.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            future.cancel()  # the caller stopped early: stop the request

    async def astream(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> AsyncIterator[dict[str, np.ndarray]]:
        """One request's streamed outputs, on the caller's loop."""
        async for step in self.local.stream(model, inputs, **kwargs):
            yield step

    # -- state -----------------------------------------------------------------------------

    def is_ready(self) -> bool:
        return self.manager.is_ready(self.options.strict_readiness)

    def models(self) -> list[IndexEntry]:
        """Every model the server knows, with each version's state and reason."""
        return self.manager.states()
