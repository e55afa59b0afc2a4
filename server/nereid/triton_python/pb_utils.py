"""``triton_python_backend_utils`` as a Triton Python-backend model imports it.

The names and behaviour of the module Triton's Python-backend stub provides, backed by
nereid's own objects: the messages (``Tensor``, ``InferenceRequest``, ``InferenceResponse``,
``TritonError`` & co: ``messages.py``), ``ModelConfig`` for ``auto_complete_config``
(``auto_complete_config.py``), and here the config helpers (``get_input_config_by_name``
& co), the dtype helpers, ``Logger`` and the flags; custom metrics (``MetricFamily``,
``Metric``: ``metrics.py``). ``adapter.py`` registers this module as
``triton_python_backend_utils`` before a model file is imported.

BLS: ``InferenceRequest.exec()`` / ``async_exec()`` run through the batcher of the named
model of the calling model's own server (``bls.py``). This module holds no state.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

import numpy as np

from nereid.triton_python.auto_complete_config import ModelConfig
from nereid.triton_python.metrics import Metric, MetricFamily
from nereid.triton_python.messages import (
    NUMBERED_TYPES,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    Tensor,
    TritonError,
    TritonModelException,
    get_input_tensor_by_name,
    get_output_tensor_by_name,
    numpy_to_triton_type,
)

__all__ = [
    "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "Logger", "Metric", "MetricFamily",
    "ModelConfig", "Tensor",
    "TritonError", "TritonModelException", "get_input_config_by_name", "get_input_tensor_by_name",
    "get_output_config_by_name", "get_output_tensor_by_name", "numpy_to_triton_type",
    "triton_string_to_numpy", "triton_to_numpy_type", "using_decoupled_model_transaction_policy",
    "serialize_byte_tensor", "deserialize_bytes_tensor",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2

_log = logging.getLogger("nereid")

#: Triton's config data-type names -> numpy types (TYPE_STRING: object arrays of bytes).
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return NUMBERED_TYPES[data_type] if 0 < data_type < len(NUMBERED_TYPES) else None


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """BYTES elements as Triton lays them out: each a 4-byte little-endian length, then
    the bytes (C order), as a flat uint8 array."""
    if input_tensor.size == 0:
        return None
    parts = []
    for item in input_tensor.flatten(order="C"):
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(len(data).to_bytes(4, "little") + data)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    items = []
    offset = 0
    data = bytes(encoded_tensor)
    while offset < len(data):
        size = int.from_bytes(data[offset:offset + 4], "little")
        offset += 4
        items.append(data[offset:offset + size])
        offset += size
    return np.array(items, dtype=np.object_)


# -- config helpers --------------------------------------------------------------------------


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    return _tensor_config(model_config, "input", name)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    return _tensor_config(model_config, "output", name)


def _tensor_config(model_config: Mapping[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    """A copy of the config's ``kind`` ("input" or "output") entry named ``name``."""
    for entry in model_config.get(kind, ()):
        if entry["name"] == name:
            return dict(entry)
    return None


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# -- logging ---------------------------------------------------------------------------------


def _log_at(level: int) -> Callable[[str], None]:
    def log(message: str) -> None:
        _log.log(level, "%s", message)

    return log


class Logger:
    """``pb_utils.Logger.log_info(...)`` & co: the server's log, as the model's own lines."""

    INFO, WARNING, ERROR, VERBOSE = 0, 1, 2, 3

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        _log.log((logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG)[level], "%s", message)

    log_info = staticmethod(_log_at(logging.INFO))
    log_warn = staticmethod(_log_at(logging.WARNING))
    log_error = staticmethod(_log_at(logging.ERROR))
    log_verbose = staticmethod(_log_at(logging.DEBUG))
