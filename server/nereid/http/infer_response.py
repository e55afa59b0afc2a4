"""InferResult -> Triton's HTTP response: the JSON header, its binary blobs, the headers.

Owns the response side of an infer call (protocol.md §2.5, §3.3, §3.8): output selection
and encoding (JSON data or binary blobs, classification, shared-memory outputs), the
response compression an ``Accept-Encoding`` asks for, and the memo of recent response
headers. Pure functions, like ``codec.py`` (the request side), whose per-model
``ModelCodec`` holds that memo.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
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
from nereid.http import _tensors
from nereid.http.codec import ModelCodec
from nereid.inference import InferRequest, InferResult, RequestedOutput

__all__ = ["ShmWriter", "encode_infer_response", "known_answer", "parse_accept_encoding"]

#: ``write_shm(region, offset, data)`` copies an output's bytes into a registered region.
ShmWriter = Callable[[str, int, memoryview], None]

_NUMPY_OPTION = orjson.OPT_SERIALIZE_NUMPY
_CT_JSON = (b"content-type", b"application/json")
_CT_BINARY = (b"content-type", b"application/octet-stream")
_IHCL = b"inference-header-content-length"
_ENCODING_HEADERS = {"gzip": (b"content-encoding", b"gzip"), "deflate": (b"content-encoding", b"deflate")}
#: response headers remembered per model version (see _Reply).
_REPLY_CACHE_SIZE = 256


_STRTOD = re.compile(
    r"[ \t\n\v\f\r]*([+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan))",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=64)
def parse_accept_encoding(value: str | None) -> str | None:
    """The response compression Triton picks for an ``Accept-Encoding`` value (§3.8).

    Comma list; ``;q=`` weights (C ``stod`` prefix parse, bad weights skip the entry);
    only ``identity``, ``gzip``, ``deflate`` count; the highest weight wins and ties go to
    the first listed. Returns "gzip", "deflate" or None (identity). Memoised: clients
    send the same few values over and over.
    """
    if not value:
        return None
    best = "identity"
    best_weight = 0.0
    for entry in value.split(","):
        start = len(entry) - len(entry.lstrip(" "))
        weight_pos = entry.find(";q=")
        if start == len(entry) or (weight_pos != -1 and start >= weight_pos):
            continue
        coding = entry[start:] if weight_pos == -1 else entry[start:weight_pos]
        weight = 1.0
        if weight_pos != -1:
            match = _STRTOD.match(entry, weight_pos + 3)
            if match is None:
                continue
            weight = float(match.group(1))
            if math.isinf(weight) and "inf" not in match.group(1).lower():
                continue  # stod: out_of_range
        if coding in ("identity", "deflate", "gzip") and weight > best_weight:
            best, best_weight = coding, weight
    return None if best == "identity" else best


@dataclasses.dataclass(frozen=True, slots=True)
class _Reply:
    """The JSON header of a response whose outputs all go out as binary blobs.

    It depends only on the request's output selection, its id, the model version and
    each output's name, dtype and shape, never on the values: an answer with the same
    of all of those (every answer of a steady client) reuses it and only copies its
    blobs. ``requested`` is the very ``request.outputs`` object it was built for (the key
    holds its id, which is only meaningful while that object lives)."""

    requested: tuple[RequestedOutput, ...] | None
    header: bytes
    header_length: bytes
    #: the outputs sent, in order, with their datatypes.
    sent: tuple[tuple[str, DataType], ...]
    #: the uncompressed answer's HTTP headers, content-length included (the blobs' sizes
    #: follow from the dtypes and shapes in the key): one object, the same for every hit.
    headers: tuple[tuple[bytes, bytes], ...]
    #: every blob is one ``tobytes`` copy of its output (_tensors.copied_whole).
    copied: bool


def encode_infer_response(
    result: InferResult,
    request: InferRequest,
    config: ModelConfig | ModelCodec,
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
    try:
        return _encode(result, request, config, accept_encoding, labels, write_shm)
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
    config: ModelConfig | ModelCodec,
    accept_encoding: str | None,
    labels: Mapping[str, Sequence[str]] | None,
    write_shm: ShmWriter | None,
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    spec = ModelCodec.of(config)
    config = spec.config
    model_name = request.model_name
    produced = result.outputs
    response_id = request.id or result.id
    key = None
    if not result.parameters:
        key = _reply_key(request, result.model_name, result.model_version, produced, response_id)
    if key is not None:
        known = spec.replies.get(key)
        if known is not None and known.requested is request.outputs:
            blobs: list[Any] = []
            for name, dt in known.sent:
                blobs.extend(_tensors.binary_blob(produced[name], dt, name, model_name)[0])
            return _finish(known.header, known.header_length, blobs, accept_encoding)
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
    blobs = []
    # Whether the header may be reused for answers with the same key (see _Reply).
    reusable = key is not None
    sent: list[tuple[str, DataType]] = []
    blob_size = 0
    copied = True
    for name, value in produced.items():
        requested = None
        if wanted is not None:
            requested = wanted.get(name)
            if requested is None:
                continue
        arr, dt = _tensors.output_array(name, value, spec.output_types.get(name), model_name)
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
            elements, class_shape = _tensors.classify(arr, dt, classes, spec.batching, label_list)
            arr = _tensors.bytes_object_array(elements, class_shape)
            dt = _tensors.BYTES
        entry: dict[str, Any] = {"name": name, "datatype": dt.wire_name, "shape": list(arr.shape)}
        raw: bytes | None = None
        if binary:
            pieces, size = _tensors.binary_blob(arr, dt, name, model_name)
            blobs.extend(pieces)
            blob_size += size
            copied = copied and _tensors.copied_whole(dt, size)
            entry["parameters"] = {"binary_data_size": size}
            sent.append((name, dt))
        else:
            if not dt.json_allowed:
                raise InvalidInputError(
                    f"sending {dt.wire_name} data via JSON is not supported. Please use the binary data format "
                    f"for output '{name}' of model '{model_name}'",
                    model=model_name,
                )
            data, raw = _tensors.json_output_data(arr, dt)
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
    if reusable:
        if len(spec.replies) >= _REPLY_CACHE_SIZE:
            spec.replies.clear()  # answers of ever-changing shapes must not pile up
        assert key is not None
        headers = _content_headers(header_length, bool(blobs)) + (
            (b"content-length", b"%d" % (len(header) + blob_size)),
        )
        spec.replies[key] = _Reply(request.outputs, header, header_length, tuple(sent), headers, copied)
    return _finish(header, header_length, blobs, accept_encoding)


def known_answer(
    request: InferRequest, outputs: Mapping[str, Any], spec: ModelCodec, model_version: int
) -> tuple[tuple[tuple[bytes, bytes], ...], list[Any]] | None:
    """The uncompressed answer of a request whose response header is remembered (see
    _Reply: every answer of a steady client after its first): its HTTP headers, the
    same object each time, and its body as parts to join (JSON header, then blobs).
    None when it is not remembered: encode it with ``encode_infer_response``. The
    response id is the request's, as ``encode_infer_response`` gives it."""
    key = _reply_key(request, request.model_name, model_version, outputs, request.id)
    if key is None:
        return None
    known = spec.replies.get(key)
    if known is None or known.requested is not request.outputs:
        return None
    parts = [known.header]
    if known.copied:
        for name, _ in known.sent:
            parts.append(outputs[name].tobytes())
    else:
        for name, dt in known.sent:
            parts.extend(_tensors.binary_blob(outputs[name], dt, name, request.model_name)[0])
    return known.headers, parts


def _reply_key(
    request: InferRequest, model_name: str, model_version: int, outputs: Mapping[str, Any], response_id: str
) -> tuple[Any, ...] | None:
    """What a response's JSON header depends on, when every output is a numpy array."""
    key: list[Any] = [id(request.outputs), request.binary_data_output, response_id, model_name, model_version]
    for name, value in outputs.items():
        if type(value) is not np.ndarray:
            return None
        key.append((name, value.dtype, value.shape))
    return tuple(key)


def _content_headers(header_length: bytes, binary: bool) -> tuple[tuple[bytes, bytes], ...]:
    """Content-type, and inference-header-content-length when blobs follow the JSON."""
    return (_CT_BINARY, (_IHCL, header_length)) if binary else (_CT_JSON,)


def _finish(
    header: bytes, header_length: bytes, blobs: list[Any], accept_encoding: str | None
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The response body (JSON header, then the blobs) and its headers, compressed when
    ``accept_encoding`` selects gzip or deflate."""
    headers = list(_content_headers(header_length, bool(blobs)))
    parts = [header, *blobs] if blobs else [header]
    encoding = parse_accept_encoding(accept_encoding) if accept_encoding else None
    if encoding is None:
        return (header if len(parts) == 1 else b"".join(parts)), headers
    compressor = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)
    compressed = [compressor.compress(part) for part in parts]
    compressed.append(compressor.flush())
    headers.append(_ENCODING_HEADERS[encoding])
    return b"".join(compressed), headers


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
    pieces, size = _tensors.binary_blob(arr, dt, name, model_name)
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
