"""Triton's generate extension: POST /v2/models/{m}[/versions/{v}]/generate and
/generate_stream (protocol.md §1.3.11, Triton's docs/protocol/extension_generate.md).

Owns the one-JSON response of ``/generate`` and the server-sent events of
``/generate_stream``; the request is generate_request.py's.
Reaches models only through the serving handle (``ServingModel.infer`` and
``stream``); the binary infer protocol belongs to infer.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import orjson

from nereid.errors import (
    InternalError,
    InvalidInputError,
    NereidError,
)
from nereid.http._asgi import ClientGone, read_body, send_error, send_json
from nereid.http._asgi import Receive, Scope, Send
from nereid.http.infer import parse_version
from nereid.http.errors import error_json
from nereid.http.generate_request import parse_generate_request
from nereid.inference import InferRequest
from nereid.models.manager import ModelManager, ServingModel
from nereid.options import ServerOptions

__all__ = ["GenerateHandler", "generate_response", "collect_steps"]

_log = logging.getLogger("nereid")


_SSE_HEADERS = ((b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"))


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
            # The serving handle's generator, iterated directly: closing it is what takes
            # the request out of its queue or batch.
            steps = serving.stream(request, received_ns)
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


