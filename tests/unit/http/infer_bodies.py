"""Infer bodies exactly as stock tritonclient builds and reads them, and the small configs
the HTTP infer-codec tests share (test_infer*, test_compression, test_infer_memo*): requests
built with tritonclient's own request builder, responses decoded with its own InferResult.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
from hypothesis import strategies as st
from nereid.config.schema import ModelConfig, ModelInput, ModelOutput
from nereid.datatypes import DATATYPES, DataType, by_wire_name
from nereid.errors import InvalidInputError, NereidError
from nereid.http import infer, infer_request, infer_response
from nereid.http.infer_memo import HttpModelTables
from nereid.inference import InferRequest, InferResult
from nereid.tensors.checks import InputProblem
from tritonclient.http import InferInput, InferRequestedOutput, InferResult as ClientResult  # type: ignore[import-untyped]
from tritonclient.http._utils import _get_inference_request  # type: ignore[import-untyped]

NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)
NUMERIC_WIRE = [dt.wire_name for dt in DATATYPES if not dt.is_bytes]
JSON_WIRE = [dt.wire_name for dt in DATATYPES if dt.json_allowed]


def dtype(wire: str) -> DataType:
    found = by_wire_name(wire)
    assert found is not None
    return found


def config(
    inputs: Sequence[tuple[str, str, tuple[int, ...]]] = (("INPUT0", "FP32", (16,)),),
    outputs: Sequence[tuple[str, str, tuple[int, ...]]] = (("OUTPUT0", "FP32", (16,)),),
    max_batch_size: int = 8,
    optional: Sequence[str] = (),
    label_outputs: Sequence[str] = (),
) -> ModelConfig:
    return ModelConfig(
        name="m",
        max_batch_size=max_batch_size,
        input=tuple(ModelInput(n, dtype(w), d, optional=n in optional) for n, w, d in inputs),
        output=tuple(
            ModelOutput(n, dtype(w), d, label_filename="labels.txt" if n in label_outputs else "")
            for n, w, d in outputs
        ),
    )


IDENTITY = config()


def client_input(name: str, array: np.ndarray, wire: str, binary: bool = True) -> InferInput:
    tensor = InferInput(name, list(array.shape), wire)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def client_body(
    inputs: list[InferInput],
    outputs: list[InferRequestedOutput] | None = None,
    request_id: str = "",
    priority: int = 0,
    timeout: int | None = None,
    parameters: dict[str, Any] | None = None,
    sequence_id: int | str = 0,
    sequence_start: bool = False,
    sequence_end: bool = False,
) -> tuple[bytes, str | None]:
    """The body and Inference-Header-Content-Length tritonclient sends (None: header absent)."""
    body, json_size = _get_inference_request(
        inputs=inputs,
        request_id=request_id,
        outputs=outputs,
        sequence_id=sequence_id,
        sequence_start=sequence_start,
        sequence_end=sequence_end,
        priority=priority,
        timeout=timeout,
        custom_parameters=parameters,
    )
    if isinstance(body, str):
        body = body.encode()
    return body, None if json_size is None else str(json_size)


def parse(
    body: bytes, header: str | None = None, cfg: ModelConfig | HttpModelTables = IDENTITY, **kwargs: Any
) -> InferRequest:
    """The full parser for a plain config; for a HttpModelTables, the endpoint's way
    (``infer.read_request``: its repeats first, then the full parser, which they learn from)."""
    if isinstance(cfg, HttpModelTables):
        return infer.read_request(
            body, header, cfg, "m", 1, kwargs.get("max_json_size", 64 << 20), kwargs.get("resolve_shm")
        )
    return infer_request.parse_infer_request(body, header, config=cfg, model_name="m", model_version=1, **kwargs)


def parse_json(doc: dict[str, Any], cfg: ModelConfig = IDENTITY, blobs: bytes = b"", **kw: Any) -> InferRequest:
    header = orjson.dumps(doc)
    return parse(header + blobs, str(len(header)) if blobs else None, cfg, **kw)


def fp32_input(shape: Sequence[int] = (1, 16), binary: bool = True) -> dict[str, Any]:
    count = int(np.prod(shape))
    if binary:
        return {
            "name": "INPUT0",
            "shape": list(shape),
            "datatype": "FP32",
            "parameters": {"binary_data_size": 4 * count},
        }
    return {"name": "INPUT0", "shape": list(shape), "datatype": "FP32", "data": [0.0] * count}


def encode(
    outputs: dict[str, np.ndarray],
    request: InferRequest,
    cfg: ModelConfig = IDENTITY,
    **kwargs: Any,
) -> tuple[bytes, dict[bytes, bytes]]:
    result = InferResult("m", 1, outputs, request.id)
    body, headers = infer_response.encode_infer_response(result, request, cfg, **kwargs)
    as_dict = dict(headers)
    assert len(as_dict) == len(headers), "a header was sent twice"
    return body, as_dict


def client_result(body: bytes, headers: dict[bytes, bytes]) -> ClientResult:
    length = headers.get(b"inference-header-content-length")
    encoding = headers.get(b"content-encoding")
    return ClientResult.from_response_body(
        body,
        verbose=False,
        header_length=None if length is None else int(length),
        content_encoding=None if encoding is None else encoding.decode(),
    )


def sample(wire: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if wire == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if wire == "BYTES":
        return np.array([f"s{i}-é".encode() * (i % 3) for i in range(count)], dtype=object).reshape(shape)
    if wire == "BF16":
        return rng.normal(size=shape).astype(ml_dtypes.bfloat16)
    np_dtype = dtype(wire).numpy
    if np_dtype.kind == "f":
        return rng.normal(size=shape).astype(np_dtype)
    info = np.iinfo(np_dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=np_dtype)


@contextlib.contextmanager
def raises(cls: type[NereidError], message: str) -> Iterator[None]:
    """pytest.raises for an exact class (not a subclass) and an exact message."""
    with pytest.raises(cls) as info:
        yield
    exact = type(info.value) is cls or (cls is InvalidInputError and type(info.value) is InputProblem)
    assert exact, f"{type(info.value).__name__}: {info.value}"  # InputProblem: the checking core's 400s
    assert info.value.message == message



def tensor(name: Any = "INPUT0", shape: Any = (1, 16), datatype: str = "FP32", **rest: Any) -> dict[str, Any]:
    return {
        "name": name,
        "shape": list(shape) if isinstance(shape, tuple) else shape,
        "datatype": datatype,
        **rest,
    }


def binary(size: int) -> dict[str, Any]:
    return {"parameters": {"binary_data_size": size}}


# -- configs the error and hostile-input tests share ------------------------------------

M_BATCH = config(inputs=(("X", "FP32", (-1, 16)),), outputs=(), max_batch_size=8)
M_TWO = config(
    inputs=(("A", "FP32", (2,)), ("B", "FP32", (2,))), outputs=(("Y", "FP32", (2,)),), max_batch_size=0
)
M_OPTIONAL = config(inputs=(("A", "FP32", (2,)), ("B", "FP32", (2,))), max_batch_size=0, optional=("B",))
M_BYTES = config(inputs=(("S", "BYTES", (2,)),), max_batch_size=0)
M_INT = config(inputs=(("I", "INT32", (2,)),), max_batch_size=0)



WILD_CONFIGS = [
    config(inputs=(("X", wire, dims),), max_batch_size=mbs)
    for wire in ("FP32", "BYTES", "BOOL", "UINT64", "FP16")
    for dims, mbs in (((-1,), 4), ((2, -1), 0), ((-1, -1), 0))
]
dims_values = st.sampled_from([0, 1, 2, 3, 4, 2**31, 2**62, 2**63 - 1, 2**63, 2**64 - 1])
scalars = st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=3)
data_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5), max_leaves=12)


@st.composite
def wild_requests(draw: st.DrawFn) -> tuple[bytes, str | None]:
    entries = []
    blobs = b""
    for _ in range(draw(st.integers(0, 2))):
        entry: dict[str, Any] = {
            "name": draw(st.sampled_from(["X", "Y"])),
            "datatype": draw(st.sampled_from(["FP32", "BYTES", "BOOL", "UINT64", "FP16", "INT8"])),
            "shape": draw(st.lists(dims_values, max_size=3)),
        }
        if draw(st.booleans()):
            entry["data"] = draw(st.lists(data_values, max_size=6))
        else:
            blob = draw(st.binary(max_size=24))
            entry["parameters"] = {"binary_data_size": len(blob) + draw(st.sampled_from([0, 0, 0, 1, -1]))}
            blobs += blob
        entries.append(entry)
    doc: dict[str, Any] = {"inputs": entries}
    if draw(st.booleans()):
        doc["outputs"] = [
            {
                "name": draw(st.sampled_from(["OUTPUT0", "Q"])),
                "parameters": {"classification": draw(st.integers(0, 3))},
            }
        ]
    head = json.dumps(doc).encode()
    return head + blobs, str(len(head)) if blobs else None
