"""InferResult -> Triton's HTTP response: the JSON header, its binary blobs, the headers.

Owns the response side of an infer call (protocol.md §2.5, §3.3, §3.8): output selection
and encoding (JSON data or binary blobs, classification, shared-memory outputs) and the
response compression an ``Accept-Encoding`` asks for. The full encoder, with no memo:
``infer_memo.py`` sits in front of it and learns from what ``encode_answer`` tells.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from numpy.typing import NDArray

from nereid.config.schema import ModelConfig
from nereid.datatypes import DataType
from nereid.errors import (
    InternalError,
    InvalidInputError,
    ModelExecutionError,
    NereidError,
    UnsupportedError,
)
from nereid.tensors import wire_outputs
from nereid.http.compression import ENCODING_HEADERS, compress, parse_accept_encoding
from nereid.http.infer_memo import HttpModelTables
from nereid.http.infer_memo import LearntAnswer
from nereid.inference import InferRequest, InferResult, RequestedOutput

__all__ = ["EncodedAnswer", "ShmWriter", "encode_answer", "encode_infer_response", "finish"]

#: ``write_shm(region, offset, data)`` copies an output's bytes into a registered region.
ShmWriter = Callable[[str, int, memoryview], None]

_NUMPY_OPTION = orjson.OPT_SERIALIZE_NUMPY
_CT_JSON = (b"content-type", b"application/json")
_CT_BINARY = (b"content-type", b"application/octet-stream")
_IHCL = b"inference-header-content-length"


@dataclasses.dataclass(slots=True)
class EncodedAnswer:
    """An answer as the encoder made it, before compression: the JSON header, its length
    as text, the blobs that follow, and, when this header may serve repeats (every
    output a binary blob of an unconverted numpy array, nothing request-specific), what
    ``InferMemo.learn_answer`` keeps."""

    header: bytes
    header_length: bytes
    blobs: list[Any]
    learnt: LearntAnswer | None


def encode_infer_response(
    result: InferResult,
    request: InferRequest,
    config: ModelConfig | HttpModelTables,
    *,
    accept_encoding: str | None = None,
    labels: Mapping[str, Sequence[str]] | None = None,
    write_shm: ShmWriter | None = None,
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """An InferResult -> (body, headers) exactly as Triton writes them (§2.5, §3.3).

    Outputs keep the model's order, filtered to ``request.outputs`` when the request
    listed any. Headers are lowercase byte pairs: content-type, then
    inference-header-content-length (only when a non-empty blob follows) and
    content-encoding (when ``accept_encoding`` selects gzip/deflate). ``labels`` maps an
    output name to its label file's lines (classification). Shared-memory outputs are
    written through ``write_shm``; without it they raise UnsupportedError.
    """
    return finish(encode_answer(result, request, config, labels=labels, write_shm=write_shm), accept_encoding)


def encode_answer(
    result: InferResult,
    request: InferRequest,
    config: ModelConfig | HttpModelTables,
    *,
    labels: Mapping[str, Sequence[str]] | None = None,
    write_shm: ShmWriter | None = None,
) -> EncodedAnswer:
    """``encode_infer_response`` before compression (see EncodedAnswer)."""
    try:
        return _encode(result, request, HttpModelTables.of(config), labels, write_shm)
    except NereidError:
        raise
    except Exception as exc:  # last resort: an output the checks above did not foresee
        raise ModelExecutionError(
            f"failed to encode the response of model '{request.model_name}': {type(exc).__name__}: {exc}",
            model=request.model_name,
        ) from exc


def _encode(
    result: InferResult,
    request: InferRequest,
    spec: HttpModelTables,
    labels: Mapping[str, Sequence[str]] | None,
    write_shm: ShmWriter | None,
) -> EncodedAnswer:
    model_name = request.model_name
    produced = result.outputs
    response_id = request.id or result.id
    wanted: dict[str, RequestedOutput] | None = None
    if request.outputs is not None:
        wanted = {out.name: out for out in request.outputs}
        if any(name not in produced for name in wanted):
            missing = [name for name in wanted if name not in produced]
            raise ModelExecutionError(
                f"model '{model_name}' did not produce the requested output(s) {', '.join(map(repr, missing))}",
                model=model_name,
            )

    entries: list[dict[str, Any]] = []
    raw_data: list[bytes | None] = []
    spliced = False
    blobs: list[Any] = []
    # Whether the header may serve repeats (see EncodedAnswer).
    reusable = not result.parameters
    sent: list[tuple[str, DataType]] = []
    blob_size = 0
    copied = True
    for name, value in produced.items():
        requested = None
        if wanted is not None:
            requested = wanted.get(name)
            if requested is None:
                continue
        arr, dt = wire_outputs.output_array(name, value, spec.output_types.get(name), model_name)
        if requested is None:
            binary, classes = request.binary_data_output, 0
        else:
            if requested.shm_region is not None:
                entries.append({"name": name, "datatype": dt.wire_name, "shape": list(arr.shape)})
                raw_data.append(None)
                _write_shm_output(name, arr, dt, requested, model_name, write_shm)
                reusable = False
                continue
            binary, classes = requested.binary_data, requested.classification
        if classes or not binary or arr is not value or dt.is_bytes:
            reusable = False
        if classes:
            label_list = labels.get(name) if labels is not None else None
            elements, class_shape = wire_outputs.classify(arr, dt, classes, spec.batching, label_list)
            arr = wire_outputs.bytes_object_array(elements, class_shape)
            dt = wire_outputs.BYTES
        entry: dict[str, Any] = {"name": name, "datatype": dt.wire_name, "shape": list(arr.shape)}
        raw: bytes | None = None
        if binary:
            pieces, size = wire_outputs.binary_blob(arr, dt, name, model_name)
            blobs.extend(pieces)
            blob_size += size
            copied = copied and wire_outputs.copied_whole(dt, size)
            entry["parameters"] = {"binary_data_size": size}
            sent.append((name, dt))
        else:
            if not dt.json_allowed:
                raise InvalidInputError(
                    f"sending {dt.wire_name} data via JSON is not supported. Please use the binary data format "
                    f"for output '{name}' of model '{model_name}'",
                    model=model_name,
                )
            data, raw = wire_outputs.json_output_data(arr, dt)
            if raw is None:
                entry["data"] = data
            else:
                spliced = True
        entries.append(entry)
        raw_data.append(raw)

    head: dict[str, Any] = {}
    if response_id:
        head["id"] = response_id
    head["model_name"] = result.model_name
    head["model_version"] = str(result.model_version)
    if result.parameters:
        head["parameters"] = dict(result.parameters)
    if spliced:
        header = _dump_spliced(head, entries, raw_data)
    else:
        head["outputs"] = entries
        header = orjson.dumps(head, option=_NUMPY_OPTION)
    header_length = str(len(header)).encode()
    learnt = None
    if reusable:
        headers = _content_headers(header_length, bool(blobs)) + (
            (b"content-length", b"%d" % (len(header) + blob_size)),
        )
        learnt = LearntAnswer(header, tuple(sent), headers, copied)
    return EncodedAnswer(header, header_length, blobs, learnt)


def _content_headers(header_length: bytes, binary: bool) -> tuple[tuple[bytes, bytes], ...]:
    """Content-type, and inference-header-content-length when blobs follow the JSON."""
    return (_CT_BINARY, (_IHCL, header_length)) if binary else (_CT_JSON,)


def finish(encoded: EncodedAnswer, accept_encoding: str | None) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The response body (JSON header, then the blobs) and its headers, compressed when
    ``accept_encoding`` selects gzip or deflate."""
    header, blobs = encoded.header, encoded.blobs
    headers = list(_content_headers(encoded.header_length, bool(blobs)))
    parts = [header, *blobs] if blobs else [header]
    encoding = parse_accept_encoding(accept_encoding) if accept_encoding else None
    if encoding is None:
        return (header if len(parts) == 1 else b"".join(parts)), headers
    headers.append(ENCODING_HEADERS[encoding])
    return compress(parts, encoding), headers


def _write_shm_output(
    name: str,
    arr: NDArray[Any],
    dt: DataType,
    requested: RequestedOutput,
    model_name: str,
    write_shm: ShmWriter | None,
) -> None:
    if write_shm is None:
        raise UnsupportedError(
            f"output '{name}' of model '{model_name}' was requested in shared memory region "
            f"'{requested.shm_region}', which this server cannot write yet"
        )
    pieces, size = wire_outputs.binary_blob(arr, dt, name, model_name)
    if size > requested.shm_byte_size:
        raise InternalError(
            f"shared memory size specified with the request for output '{name}' ({requested.shm_byte_size} bytes) "
            f"should be at least {size} bytes to hold the results"
        )
    assert requested.shm_region is not None
    data = pieces[0] if len(pieces) == 1 else memoryview(b"".join(pieces))
    write_shm(requested.shm_region, requested.shm_offset, data)


def _dump_spliced(head: dict[str, Any], entries: list[dict[str, Any]], raw_data: list[bytes | None]) -> bytes:
    """The response JSON when some output's data had to be written by hand (NaN/Infinity
    tokens, invalid UTF-8): those ready-made texts are spliced in as the entries' last key.
    (Otherwise the whole response is one orjson call, keys in Triton's order.)"""
    parts = []
    for entry, raw in zip(entries, raw_data, strict=True):
        text = orjson.dumps(entry, option=_NUMPY_OPTION)
        parts.append(text if raw is None else text[:-1] + b',"data":' + raw + b"}")
    return orjson.dumps(head)[:-1] + b',"outputs":[' + b",".join(parts) + b"]}"
