"""Infer requests decoded and answers encoded in a front-end worker, so that the main
process only queues, batches and runs.

The main process announces each model version the worker may decode for (a MODEL
message: its config, version and labels, under a token); the worker parses the body
against it with the same tables, checks and memo as the main process would
(``read_request``), lays the input tensors side by side in an arena block (layout.py)
and sends the rest of the request as a template it sends once (rows, requested outputs,
parameters, priority, timeout, the tensors' layout) and names by number afterwards. The
outputs come back the same way and are encoded here (``InferMemo.answer``, else the full
encoder, compressed if asked).

Anything this does not cover goes to the main process as a raw body instead
(``decode`` returns None): a model not announced or a version named in the URL, a
compressed or heavy body, client shared memory, BYTES tensors, sequence parameters, a request the worker's
parser refuses (the main process then says what is wrong, with the config it serves).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from nereid.config.schema import ModelConfig
from nereid.errors import InternalError, NereidError
from nereid.frontends.layout import layout_size, write_arrays
from nereid.http import infer_response
from nereid.http._asgi import error_parts
from nereid.http.compression import parse_accept_encoding
from nereid.http.heavy_bodies import JSON_OFF_LOOP_BYTES
from nereid.http.infer import InferHeaders, Responder, encode_answer, read_request
from nereid.http.infer_memo import HttpModelTables
from nereid.inference import InferRequest, InferResult

__all__ = ["Announced", "Decoded", "Template", "answer", "decode", "lay_out"]

_log = logging.getLogger("nereid")

#: (rows, requested outputs, parameters as items, priority, timeout_us,
#:  binary_data_output, input layout): what the main process rebuilds a request from
Template = tuple[Any, ...]


@dataclass(slots=True)
class Announced:
    """A model version the main process lets this worker decode for."""

    token: int
    version: int
    tables: HttpModelTables
    labels: Mapping[str, list[str]]

    @classmethod
    def of(cls, token: int, version: int, config: ModelConfig, labels: Mapping[str, list[str]]) -> Announced:
        return cls(token, version, HttpModelTables.for_config(config), labels)


@dataclass(slots=True)
class Decoded:
    """A request decoded here: what the answer is encoded with, and what goes over."""

    request: InferRequest
    template: Template
    size: int


class _NeedsMain(Exception):
    """The request uses client shared memory, which the main process holds."""


def _no_shared_memory(region: str, offset: int, size: int) -> memoryview:
    raise _NeedsMain(region)


def decode(model: Announced, name: str, headers: InferHeaders, body: bytes, max_json_size: int) -> Decoded | None:
    """The decoded request, or None when the main process must take the raw body."""
    if headers.content_encoding or len(body) > JSON_OFF_LOOP_BYTES:
        return None
    try:
        request = read_request(body, headers.header_length, model.tables, name, model.version, max_json_size,
                               _no_shared_memory)
    except Exception:  # shared memory, or a bad request: the main process answers it
        return None
    return decoded_for_main(request)


def decoded_for_main(request: InferRequest) -> Decoded | None:
    """``request`` (decoded here, from HTTP or gRPC) with the template and arena size it
    goes to the main process with; None when the main process must take it whole: a
    sequence (its id and flags differ each request: no template), outputs to shared
    memory, or inputs the arena cannot lay out."""
    if request.sequence is not None:
        return None
    outputs = request.outputs
    if outputs is not None and any(output.shm_region is not None for output in outputs):
        return None
    size = layout_size(request.inputs)
    if size is None:
        return None
    parameters = request.parameters
    template = (request.rows, outputs, tuple(parameters.items()) if parameters else (), request.priority,
                request.timeout_us, request.binary_data_output, ())
    return Decoded(request, template, size)


def lay_out(decoded: Decoded, block: memoryview) -> Template:
    """Write the request's tensors into ``block``; the template with their layout."""
    layout = write_arrays(block, decoded.request.inputs)
    return decoded.template[:6] + (layout,)


def answer(
    model: Announced, name: str, request: InferRequest, accept_encoding: str | None, version: int,
    outputs: Mapping[str, np.ndarray], responder: Responder,
) -> None:
    """Encode the outputs the main process sent and hand them to ``responder`` (at once:
    the outputs are views on the arena, reused as soon as this returns)."""
    try:
        if accept_encoding is None or parse_accept_encoding(accept_encoding) is None:
            repeat = model.tables.memo.answer(request, outputs, version)
            if repeat is not None:
                responder.reply_repeat(*repeat)
                return
        encoded = encode_answer(
            model.tables, InferResult(name, version, outputs, request.id), request, labels=model.labels,
            write_shm=_no_shared_memory,
        )
        payload, headers = infer_response.finish(encoded, accept_encoding)
        headers.append((b"content-length", str(len(payload)).encode()))
        responder.reply(200, headers, bytes(payload))
    except NereidError as exc:
        responder.reply(*error_parts(exc))
    except Exception as exc:  # a bug: this request fails, loudly
        _log.exception("answering infer on model %r in a front-end worker failed unexpectedly", name)
        responder.reply(*error_parts(InternalError(f"internal error in infer on model '{name}': {exc}")))
