"""Triton's generate extension: POST /v2/models/{m}[/versions/{v}]/generate and
/generate_stream (protocol.md §1.3.11, Triton's docs/protocol/extension_generate.md).

Owns the text-oriented request (JSON keys -> input tensors and request parameters), the
one-JSON response of ``/generate`` and the server-sent events of ``/generate_stream``.
Reaches models only through ModelManager (``ServingModel.infer`` and its batcher's
``stream``); the binary infer protocol belongs to codec.py.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import orjson

from nereid.config.schema import ModelConfig, ModelInput
from nereid.errors import (
    InternalError,
    InvalidInputError,
    MalformedRequestError,
    NereidError,
)
from nereid.http._asgi import ClientGone, read_body, send_error, send_json
from nereid.http.endpoints import Receive, Scope, Send, parse_version
from nereid.http.errors import error_json
from nereid.inference import InferRequest, ParameterValue
from nereid.model_manager import ModelManager, ServingModel
from nereid.options import ServerOptions

__all__ = ["GenerateHandler", "parse_generate_request", "generate_response", "collect_steps"]

_log = logging.getLogger("nereid")


_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_U64_LIMIT = 1 << 64


class GenerateHandler:
    """The raw ASGI app of ``/generate`` (``stream=False``) or ``/generate_stream``
    (``stream=True``) for one ModelManager. Starlette routes it with ``name`` and, when the
    URL has one, ``version`` as path parameters.

    ``/generate`` answers exactly one JSON object. For a decoupled model it collects the
    steps the model streams: a STRING output is the concatenation of its pieces over all
    steps (element by element), any other output is the one from the last step that
    produced it. ``/generate_stream`` answers ``text/event-stream; charset=utf-8``, one
    ``data: {json}`` event per step (one event for a model that is not decoupled). An
    error before the first event is a normal JSON error with its status; after it, the
    stream carries ``data: {"error": "..."}`` and ends. A client that disconnects stops
    its request: it leaves the queue, or its batch (whose generator is closed once no
    request of the batch listens any more).
    """

    def __init__(self, manager: ModelManager, options: ServerOptions, *, stream: bool) -> None:
        self.manager = manager
        self.options = options
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        received_ns = time.monotonic_ns()
        params = scope.get("path_params", {})
        name: str = params["name"]
        try:
            serving, request = await self._request(scope, receive, name, params.get("version"))
        except NereidError as exc:
            await send_error(send, exc)
            return
        except ClientGone:
            return
        except Exception as exc:  # a bug: still Triton's JSON error, never a bare 500 page
            _log.exception("generate request for model '%s' failed unexpectedly", name)
            error = InternalError(f"generate request for model '{name}' failed: unexpected {type(exc).__name__}: {exc}")
            await send_error(send, error)
            return
        steps: AsyncIterator[Any]
        if serving.config.decoupled:
            # The batcher's own generator, iterated directly: closing it is what takes the
            # request out of its queue or batch.
            steps = serving.batcher.stream(request, received_ns)
        else:
            steps = _single_step(serving, request, received_ns)
        if self.stream:
            await _answer_events(serving, request, steps, receive, send)
        else:
            await _answer_collected(serving, request, steps, receive, send)

    async def _request(
        self, scope: Scope, receive: Receive, name: str, version: Any
    ) -> tuple[ServingModel, InferRequest]:
        content_encoding = content_length = None
        for key, value in scope["headers"]:
            if key == b"content-encoding":
                content_encoding = value.decode("latin-1")
            elif key == b"content-length":
                content_length = value
        body = await read_body(receive, content_length, self.options.max_request_size)
        serving = self.manager.get(name, parse_version(version))
        if content_encoding and content_encoding != "identity":
            # protocol.md §3.8: the generate endpoints never decompress.
            raise InvalidInputError(
                f"generate request for model '{name}': unsupported Content-Encoding '{content_encoding}': "
                "the generate endpoints accept only uncompressed (identity) request bodies"
            )
        max_json = self.options.http_max_input_size
        if len(body) > max_json:
            raise InvalidInputError(
                f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of "
                f"{max_json} bytes. Use --http-max-input-size to increase the limit."
            )
        request = parse_generate_request(body, serving.config, model_name=name, model_version=serving.version)
        return serving, request


# -- request --------------------------------------------------------------------------


def parse_generate_request(
    body: bytes, config: ModelConfig, *, model_name: str, model_version: int | None = None
) -> InferRequest:
    """A generate request body -> an InferRequest for ``config``'s model.

    The body is a JSON object. A key named like a model input becomes that input: a
    scalar is one element, a list (nested lists are flattened) its elements, typed by the
    config input (STRING inputs as UTF-8 bytes; JSON strings only; integers range-checked;
    booleans only for BOOL). The shape is the config ``dims`` with a ``-1`` taking the
    element count, prefixed by a batch dimension of 1 when the model batches. ``id`` (a
    string) is the request id, echoed in the response. The ``parameters`` object and
    every other key become request parameters (string, number or boolean; ``parameters``
    wins over a top-level key of the same name); ``priority`` and ``timeout`` (unsigned
    integers) are the scheduling fields of the infer protocol, ``triton_*`` is reserved.

    Raises MalformedRequestError (bad JSON, 500 as in Triton) or InvalidInputError (400).
    """
    try:
        root = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequestError(f"failed to parse the request JSON buffer: {exc}") from None
    if type(root) is not dict:
        raise MalformedRequestError(
            f"failed to parse the request JSON buffer: expected a JSON object, got {_json_kind(root)}"
        )
    where = f"generate request for model '{model_name}'"
    request_id = root.get("id", "")
    if type(request_id) is not str:
        raise InvalidInputError(f"{where}: field 'id': expected a JSON string, got {_json_kind(request_id)}")
    inputs: dict[str, np.ndarray] = {}
    custom: dict[str, ParameterValue] = {}
    priority = 0
    timeout_us: int | None = None
    explicit = root.get("parameters", {})
    if type(explicit) is not dict:
        raise InvalidInputError(f"{where}: field 'parameters': expected a JSON object, got {_json_kind(explicit)}")
    merged: list[tuple[str, Any, str]] = []
    for key, value in root.items():
        if key in ("id", "parameters"):
            continue
        spec = config.input_by_name(key)
        if spec is not None:
            inputs[key] = _input_array(value, spec, config.max_batch_size > 0, model_name)
        else:
            merged.append((key, value, f"field '{key}' (not an input of the model, so a request parameter)"))
    merged.extend((key, value, f"parameter '{key}'") for key, value in explicit.items())
    for key, value, what in merged:
        if key.startswith("triton_"):
            raise InvalidInputError(
                f"{where}: {what}: parameter keys starting with 'triton_' are reserved for Triton usage "
                "and should not be specified."
            )
        if key in ("priority", "timeout"):
            if type(value) is not int or not 0 <= value < _U64_LIMIT:
                raise InvalidInputError(f"{where}: {what}: expected an unsigned integer, got {_describe(value)}")
            if key == "priority":
                priority = value
            else:
                timeout_us = value
            continue
        if type(value) not in (str, int, bool, float):
            raise InvalidInputError(
                f"{where}: {what}: expected a JSON string, number or boolean, got {_json_kind(value)}"
            )
        custom[key] = value
    missing = [spec.name for spec in config.input if not spec.optional and spec.name not in inputs]
    if missing:
        wanted = ", ".join(f"'{name}'" for name in missing)
        fields = ", ".join(f"'{key}'" for key in root) or "none"
        raise InvalidInputError(
            f"{where}: missing required input(s) {wanted}: send each as a top-level JSON field "
            f"(model inputs: {', '.join(repr(spec.name) for spec in config.input)}; got fields: {fields})",
            model=model_name,
            input=missing[0],
        )
    return InferRequest(
        model_name=model_name,
        inputs=inputs,
        rows=1,
        id=request_id,
        model_version=model_version,
        parameters=custom,
        priority=priority,
        timeout_us=timeout_us,
    )


def _input_array(value: Any, spec: ModelInput, batching: bool, model_name: str) -> np.ndarray:
    dt = spec.data_type
    where = f"model '{model_name}', input '{spec.name}' ({dt.wire_name}, dims {list(spec.dims)})"
    elements = _flatten(value) if type(value) is list else [value]
    if dt.is_bytes:
        bad = next((e for e in elements if type(e) is not str), _NONE)
        if bad is not _NONE:
            raise InvalidInputError(
                f"{where}: expected a JSON string (or a list of them), got {_describe(bad)}",
                model=model_name,
                input=spec.name,
            )
        array = np.empty(len(elements), dtype=object)
        array[:] = [e.encode("utf-8") for e in elements]
    else:
        kind = dt.numpy.kind
        low = high = 0
        if kind == "b":
            expected = "a JSON boolean"
        elif kind in "iu":
            info = np.iinfo(dt.numpy)
            low, high = int(info.min), int(info.max)
            expected = f"a JSON integer in [{low}, {high}]"
        else:
            expected = "a JSON number"
        bad = next((e for e in elements if not _element_ok(e, kind, low, high)), _NONE)
        if bad is not _NONE:
            raise InvalidInputError(
                f"{where}: expected {expected} (or a list of them), got {_describe(bad)}",
                model=model_name,
                input=spec.name,
            )
        collect = np.float64 if kind not in "biu" else dt.numpy
        array = np.array(elements, dtype=collect).astype(dt.numpy, copy=False)
    shape = _shape_for(spec.dims, len(elements))
    if shape is None:
        raise InvalidInputError(
            f"{where}: {len(elements)} element(s) do not fit dims {list(spec.dims)}",
            model=model_name,
            input=spec.name,
        )
    return array.reshape(((1,) if batching else ()) + shape)


_NONE = object()


def _element_ok(element: Any, kind: str, low: int, high: int) -> bool:
    if kind == "b":
        return type(element) is bool
    if kind in "iu":
        return type(element) is int and low <= element <= high
    return type(element) is int or type(element) is float


def _flatten(value: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(value)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _shape_for(dims: tuple[int, ...], count: int) -> tuple[int, ...] | None:
    """The shape with ``dims``' fixed sizes holding ``count`` elements: the last ``-1``
    takes what is left (other ``-1`` are 1); None when they do not fit."""
    fixed = math.prod(d for d in dims if d != -1)
    variable = [axis for axis, d in enumerate(dims) if d == -1]
    if not variable:
        return tuple(dims) if fixed == count else None
    if fixed == 0:
        return None if count else tuple(0 if d == -1 else d for d in dims)
    if count % fixed:
        return None
    shape = [1 if d == -1 else d for d in dims]
    shape[variable[-1]] = count // fixed
    return tuple(shape)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "boolean"
    if type(value) in (int, float):
        return "number"
    if type(value) is str:
        return "string"
    if type(value) is list:
        return "array"
    return "object"


def _describe(value: Any) -> str:
    kind = _json_kind(value)
    if kind in ("object", "array"):
        return f"JSON {kind}"
    text = orjson.dumps(value).decode()
    if len(text) > 40:
        text = text[:37] + "..."
    return f"JSON {kind} {text}"


# -- responses ------------------------------------------------------------------------


def generate_response(
    model_name: str, model_version: int, request_id: str, outputs: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """The generate response object: ``id`` (when the request had one), ``model_name``,
    ``model_version``, then one key per output: a single-element output as its value, a
    larger one as the flat list of its elements; BYTES decoded as UTF-8 (invalid bytes
    replaced by U+FFFD)."""
    response: dict[str, Any] = {}
    if request_id:
        response["id"] = request_id
    response["model_name"] = model_name
    response["model_version"] = str(model_version)
    for name, array in outputs.items():
        response[name] = _json_value(array)
    return response


def _json_value(array: np.ndarray) -> Any:
    flat = np.asarray(array).reshape(-1)
    if flat.dtype == object or flat.dtype.kind in "SU":
        items: list[Any] = [_text(item) for item in flat]
    elif flat.dtype.kind in "biuf":
        items = flat.tolist()
    else:  # bfloat16 and other numpy extension types
        items = flat.astype(np.float64).tolist()
    return items[0] if len(items) == 1 else items


def _text(item: Any) -> str:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item).decode("utf-8", errors="replace")
    return str(item)


def collect_steps(collected: dict[str, np.ndarray], step: Mapping[str, np.ndarray]) -> None:
    """Fold one step of a decoupled model into ``collected`` (the ``/generate`` rule):
    BYTES outputs concatenate element by element (as bytes, so a character split over
    two steps comes out whole), other outputs are replaced by the newer step's."""
    for name, array in step.items():
        previous = collected.get(name)
        if previous is not None and array.dtype == object and previous.dtype == object and previous.shape == array.shape:
            joined = np.empty(array.shape, dtype=object)
            joined.reshape(-1)[:] = [
                _as_bytes(a) + _as_bytes(b) for a, b in zip(previous.reshape(-1), array.reshape(-1))
            ]
            collected[name] = joined
        else:
            collected[name] = array


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, str):
        return item.encode("utf-8")
    return bytes(item)


# -- running and answering --------------------------------------------------------------


async def _single_step(serving: ServingModel, request: InferRequest, received_ns: int) -> AsyncIterator[Any]:
    yield await serving.infer(request, received_ns)


async def _until_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class _Steps:
    """Iterates the steps of one request while watching its client: ``next()`` returns the
    next step, raises StopAsyncIteration at the end, or ClientGone when the client
    disconnected first (the pending step is then cancelled, which takes the request out of
    its queue or batch). ``close()`` always runs."""

    def __init__(self, steps: AsyncIterator[Any], receive: Receive) -> None:
        self._steps = steps
        self._gone = asyncio.ensure_future(_until_disconnect(receive))
        self._pending: asyncio.Future[Any] | None = None

    async def next(self) -> Any:
        pending = self._pending = asyncio.ensure_future(self._steps.__anext__())
        await asyncio.wait((pending, self._gone), return_when=asyncio.FIRST_COMPLETED)
        if not pending.done():
            await self._cancel_pending()
            raise ClientGone()
        self._pending = None
        return pending.result()

    async def _cancel_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)

    async def close(self) -> None:
        # Also on cancellation of the handler (server shutdown): a step still awaited
        # must end before the generator can be closed.
        await self._cancel_pending()
        self._gone.cancel()
        await asyncio.gather(self._gone, return_exceptions=True)
        aclose = getattr(self._steps, "aclose", None)
        if aclose is not None:
            await aclose()


async def _answer_collected(
    serving: ServingModel, request: InferRequest, steps: AsyncIterator[Any], receive: Receive, send: Send
) -> None:
    iterator = _Steps(steps, receive)
    collected: dict[str, np.ndarray] = {}
    try:
        while True:
            try:
                step = await iterator.next()
            except StopAsyncIteration:
                break
            collect_steps(collected, step)
        body = orjson.dumps(generate_response(request.model_name, serving.version, request.id, collected))
    except ClientGone:
        return
    except NereidError as exc:
        await send_error(send, exc)
        return
    except Exception as exc:
        error = _unexpected(request, exc)
        await send_error(send, error)
        return
    finally:
        await iterator.close()
    await send_json(send, 200, body)


async def _answer_events(
    serving: ServingModel, request: InferRequest, steps: AsyncIterator[Any], receive: Receive, send: Send
) -> None:
    iterator = _Steps(steps, receive)
    started = False
    try:
        while True:
            try:
                step = await iterator.next()
                event = orjson.dumps(generate_response(request.model_name, serving.version, request.id, step))
            except StopAsyncIteration:
                break
            except NereidError as exc:
                error: NereidError = exc
            except ClientGone:
                return
            except Exception as exc:
                error = _unexpected(request, exc)
            else:
                if not started:
                    started = True
                    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                await send({"type": "http.response.body", "body": b"data: " + event + b"\n\n", "more_body": True})
                continue
            if not started:
                await send_error(send, error)
                return
            await send(
                {"type": "http.response.body", "body": b"data: " + error_json(error.message) + b"\n\n", "more_body": True}
            )
            break
        if not started:  # a stream without steps: still a (empty) stream
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:  # the client went away while we wrote (engines that raise on it)
        return
    finally:
        await iterator.close()


def _unexpected(request: InferRequest, exc: Exception) -> NereidError:
    _log.exception("generate request for model '%s' failed unexpectedly", request.model_name)
    return InternalError(
        f"generate request for model '{request.model_name}' failed: unexpected {type(exc).__name__}: {exc}"
    )


