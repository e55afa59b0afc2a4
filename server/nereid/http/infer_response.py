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
    """Each output the request wants, in the model's order, into the answer being built."""
    model_name = request.model_name
    wanted = _wanted_outputs(request, result.outputs)
    answer = _AnswerBuilder(reusable=not result.parameters)
    for name, value in result.outputs.items():
        requested = None
        if wanted is not None:
            requested = wanted.get(name)
            if requested is None:
                continue
        arr, dt = wire_outputs.output_array(name, value, spec.output_types.get(name), model_name)
        if requested is None:
            binary, classes = request.binary_data_output, 0
        elif requested.shm_region is not None:
            answer.add_to_shared_memory(name, arr, dt, requested, model_name, write_shm)
            continue
        else:
            binary, classes = requested.binary_data, requested.classification
        if classes or not binary or arr is not value or dt.is_bytes:
            answer.reusable = False
        if classes:
            label_list = labels.get(name) if labels is not None else None
            elements, class_shape = wire_outputs.classify(arr, dt, classes, spec.batching, label_list)
            arr, dt = wire_outputs.bytes_object_array(elements, class_shape), wire_outputs.BYTES
        if binary:
            answer.add_blob(name, arr, dt, model_name)
        else:
            answer.add_json(name, arr, dt, model_name)
    return answer.finish(result, request.id or result.id)


def _wanted_outputs(request: InferRequest, produced: Mapping[str, Any]) -> dict[str, RequestedOutput] | None:
    """The outputs the request listed, by name (None: all of them); each must have been produced."""
    if request.outputs is None:
        return None
    wanted = {out.name: out for out in request.outputs}
    missing = [name for name in wanted if name not in produced]
    if missing:
        raise ModelExecutionError(
            f"model '{request.model_name}' did not produce the requested output(s) {', '.join(map(repr, missing))}",
            model=request.model_name,
        )
    return wanted


class _AnswerBuilder:
    """One answer as the encoder builds it: the JSON header's output entries (with the
    hand-written data texts of spliced ones), the blobs that follow the header, and
    whether the header may serve repeats (``reusable``; see EncodedAnswer)."""

    __slots__ = ("entries", "raw_data", "spliced", "blobs", "blob_size", "sent", "copied", "reusable")

    def __init__(self, reusable: bool) -> None:
        self.entries: list[dict[str, Any]] = []
        self.raw_data: list[bytes | None] = []
        self.spliced = False
        self.blobs: list[Any] = []
        self.blob_size = 0
        self.sent: list[tuple[str, DataType]] = []
        self.copied = True
        self.reusable = reusable

    def add_to_shared_memory(
        self, name: str, arr: NDArray[Any], dt: DataType, requested: RequestedOutput, model_name: str,
        write_shm: ShmWriter | None,
    ) -> None:
        self.entries.append({"name": name, "datatype": dt.wire_name, "shape": list(arr.shape)})
        self.raw_data.append(None)
        _write_shm_output(name, arr, dt, requested, model_name, write_shm)
        self.reusable = False

    def add_blob(self, name: str, arr: NDArray[Any], dt: DataType, model_name: str) -> None:
        pieces, size = wire_outputs.binary_blob(arr, dt, name, model_name)
        self.blobs.extend(pieces)
        self.blob_size += size
        self.copied = self.copied and wire_outputs.copied_whole(dt, size)
        self.sent.append((name, dt))
        self.entries.append({
            "name": name, "datatype": dt.wire_name, "shape": list(arr.shape), "parameters": {"binary_data_size": size},
        })
        self.raw_data.append(None)

    def add_json(self, name: str, arr: NDArray[Any], dt: DataType, model_name: str) -> None:
        if not dt.json_allowed:
            raise InvalidInputError(
                f"sending {dt.wire_name} data via JSON is not supported. Please use the binary data format "
                f"for output '{name}' of model '{model_name}'",
                model=model_name,
            )
        entry: dict[str, Any] = {"name": name, "datatype": dt.wire_name, "shape": list(arr.shape)}
        data, raw = wire_outputs.json_output_data(arr, dt)
        if raw is None:
            entry["data"] = data
        else:
            self.spliced = True
        self.entries.append(entry)
        self.raw_data.append(raw)

    def finish(self, result: InferResult, response_id: str) -> EncodedAnswer:
        """The JSON header (keys in Triton's order) over the outputs added, and the answer."""
        head: dict[str, Any] = {}
        if response_id:
            head["id"] = response_id
        head["model_name"] = result.model_name
        head["model_version"] = str(result.model_version)
        if result.parameters:
            head["parameters"] = dict(result.parameters)
        if self.spliced:
            header = _dump_spliced(head, self.entries, self.raw_data)
        else:
            head["outputs"] = self.entries
            header = orjson.dumps(head, option=_NUMPY_OPTION)
        header_length = str(len(header)).encode()
        learnt = None
        if self.reusable:
            headers = _content_headers(header_length, bool(self.blobs)) + (
                (b"content-length", b"%d" % (len(header) + self.blob_size)),
            )
            learnt = LearntAnswer(header, tuple(self.sent), headers, self.copied)
        return EncodedAnswer(header, header_length, self.blobs, learnt)


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
