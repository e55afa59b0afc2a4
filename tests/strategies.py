"""Shared Hypothesis strategies: model inputs, request shapes, batch workloads.

Each strategy builds valid values only (the edges are tested by hand, in the unit tests);
anything that needs a random array draws a seed and uses numpy, so examples stay cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from nereid.config.schema import ModelConfig, ModelInput, ModelOutput
from nereid.datatypes import DataType, by_config_name
from nereid.inference import InferRequest

__all__ = [
    "BatchWorkload",
    "batch_workloads",
    "datatype_named",
    "datatypes",
    "identity_outputs",
    "model_inputs",
    "random_array",
    "request_rows",
    "request_shape",
    "variable_sizes",
]


def datatype_named(name: str) -> DataType:
    """``FP32`` / ``TYPE_FP32`` -> DataType, for tests that build configs by hand."""
    datatype = by_config_name(name)
    assert datatype is not None, name
    return datatype


#: A spread of element types: float, int, unsigned, half, bool and variable-length BYTES.
DATATYPE_NAMES = ("FP32", "FP64", "FP16", "INT32", "INT64", "UINT8", "BOOL", "BYTES")


def datatypes() -> st.SearchStrategy[DataType]:
    return st.sampled_from([datatype_named(name) for name in DATATYPE_NAMES])


def request_rows(max_rows: int = 4) -> st.SearchStrategy[int]:
    """A request's batch size: how many rows it carries along axis 0."""
    return st.integers(min_value=1, max_value=max_rows)


def variable_sizes(max_size: int = 5) -> st.SearchStrategy[int]:
    """The length of one -1 dim in one request (0 included: an empty sequence)."""
    return st.integers(min_value=0, max_value=max_size)


@st.composite
def model_inputs(
    draw: st.DrawFn,
    name: str = "INPUT0",
    *,
    padded: bool | None = None,
    optional: bool | None = None,
) -> ModelInput:
    """One ``[[input]]`` with 1-3 dims (each fixed 1..4 or -1); ``pad_value`` set when
    ``padded`` (drawn when None). BYTES inputs always pad with b"", so their pad_value is 0."""
    datatype = draw(datatypes())
    dims = tuple(draw(st.lists(st.sampled_from([-1, 1, 2, 3, 4]), min_size=1, max_size=3)))
    if padded is None:
        padded = draw(st.booleans())
    pad_value: float | int | None = None
    if padded:
        if datatype.is_bytes:
            pad_value = 0
        elif datatype.wire_name == "BOOL":
            pad_value = draw(st.sampled_from([0, 1]))
        elif datatype.numpy.kind == "u":
            pad_value = draw(st.integers(min_value=0, max_value=9))
        elif datatype.numpy.kind == "f":
            pad_value = draw(st.sampled_from([0.0, -1.0, 0.5, 7]))
        else:
            pad_value = draw(st.integers(min_value=-9, max_value=9))
    if optional is None:
        optional = draw(st.booleans())
    return ModelInput(name, datatype, dims, optional=optional, pad_value=pad_value)


def request_shape(spec: ModelInput, rows: int, sizes: list[int]) -> tuple[int, ...]:
    """The full shape of one request's array: ``rows`` first, then the spec's dims with
    each -1 replaced, in order, by the next of ``sizes``."""
    lengths = iter(sizes)
    return (rows, *(next(lengths) if d == -1 else d for d in spec.dims))


def random_array(shape: tuple[int, ...], datatype: DataType, seed: int) -> np.ndarray:
    """An array of ``shape`` and the datatype's numpy dtype, contents from ``seed``."""
    rng = np.random.default_rng(seed)
    if datatype.is_bytes:
        out = np.empty(shape, dtype=object)
        flat = out.reshape(-1)
        for index in range(flat.size):
            flat[index] = rng.bytes(int(rng.integers(0, 4)))
        return out
    kind = datatype.numpy.kind
    if kind == "b":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if kind == "f":
        return rng.standard_normal(size=shape).astype(datatype.numpy)
    return rng.integers(0, 100, size=shape).astype(datatype.numpy)


@dataclass(frozen=True)
class BatchWorkload:
    """Requests that may share one batch of one model (equal batch signatures)."""

    config: ModelConfig
    requests: tuple[InferRequest, ...]


@st.composite
def batch_workloads(
    draw: st.DrawFn, *, max_requests: int = 8, max_inputs: int = 3, max_rows: int = 4
) -> BatchWorkload:
    """A batching model (outputs ``OUT_<input>`` mirroring its inputs) and 1..max_requests
    requests that fit one batch: same present inputs, same fixed dims, same -1 lengths
    except on padded inputs, where each request has its own; each request with its own
    row count and data."""
    count = draw(st.integers(min_value=1, max_value=max_inputs))
    inputs = [draw(model_inputs(f"INPUT{i}")) for i in range(count)]
    present = [not spec.optional or draw(st.booleans()) for spec in inputs]
    if not any(present):
        present[0] = True
    outputs = tuple(ModelOutput(f"OUT_{spec.name}", spec.data_type, spec.dims) for spec in inputs)
    n_requests = draw(st.integers(min_value=1, max_value=max_requests))
    rows = [draw(request_rows(max_rows)) for _ in range(n_requests)]
    config = ModelConfig(
        name="identity", max_batch_size=max(64, sum(rows)), input=tuple(inputs), output=outputs
    )

    n_variable = [spec.dims.count(-1) for spec in inputs]
    shared = [[draw(variable_sizes()) for _ in range(n)] for n in n_variable]
    requests = []
    for k in range(n_requests):
        arrays: dict[str, np.ndarray] = {}
        for i, spec in enumerate(inputs):
            if not present[i]:
                continue
            if spec.pad_value is None:
                sizes = shared[i]
            else:
                sizes = [draw(variable_sizes()) for _ in range(n_variable[i])]
            shape = request_shape(spec, rows[k], sizes)
            seed = draw(st.integers(min_value=0, max_value=2**32 - 1))
            arrays[spec.name] = random_array(shape, spec.data_type, seed)
        requests.append(InferRequest(model_name="identity", inputs=arrays, rows=rows[k], id=str(k)))
    return BatchWorkload(config, tuple(requests))


def identity_outputs(batch: dict[str, Any]) -> dict[str, Any]:
    """What an identity model returns for ``batch``: each input as ``OUT_<name>``."""
    return {f"OUT_{name}": array for name, array in batch.items()}
