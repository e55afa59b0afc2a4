"""``triton_python_backend_utils`` as a Triton Python-backend model imports it.

The names and behaviour of the module Triton's Python-backend stub provides, backed by
nereid's own objects: ``Tensor``, ``InferenceRequest`` (what ``execute`` receives, and
the Business Logic Scripting request a model builds to call another model of the same
server), ``InferenceResponse``, ``TritonError`` with its codes, ``TritonModelException``,
the config helpers (``get_input_config_by_name`` & co), the dtype helpers, ``ModelConfig``
for ``auto_complete_config``, ``Logger`` and the flags. ``adapter.py`` registers this
module as ``triton_python_backend_utils`` before a model file is imported.

BLS: ``InferenceRequest.exec()`` / ``async_exec()`` run through the server's batcher of
the named model, from the model's thread; the server installs how (``set_bls_executor``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np


__all__ = [
    "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "Logger", "ModelConfig", "Tensor",
    "TritonError", "TritonModelException", "get_input_config_by_name", "get_input_tensor_by_name",
    "get_output_config_by_name", "get_output_tensor_by_name", "numpy_to_triton_type", "set_bls_executor",
    "triton_string_to_numpy", "triton_to_numpy_type", "using_decoupled_model_transaction_policy",
    "serialize_byte_tensor", "deserialize_bytes_tensor",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

_log = logging.getLogger("nereid")

#: Triton's config data-type names -> numpy types (TYPE_STRING: object arrays of bytes).
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
#: TRITONSERVER_DataType numbers (1 BOOL ... 13 BYTES) -> numpy types.
_NUMBERED = (None, np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32,
             np.int64, np.float16, np.float32, np.float64, np.object_)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return _NUMBERED[data_type] if 0 < data_type < len(_NUMBERED) else None


def numpy_to_triton_type(data_type: Any) -> int | None:
    if data_type in (np.object_, np.bytes_):
        return 13
    for number, kind in enumerate(_NUMBERED):
        if kind is not None and data_type == kind:
            return number
    return None


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
    for entry in model_config.get("input", ()):
        if entry["name"] == name:
            return dict(entry)
    return None


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    for entry in model_config.get("output", ()):
        if entry["name"] == name:
            return dict(entry)
    return None


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# -- errors ----------------------------------------------------------------------------------


class TritonError:
    """An error a response carries (``InferenceResponse(error=...)``): only that request fails."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by a model (fails the whole batch), or by BLS for the called model's error."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


# -- tensors ---------------------------------------------------------------------------------


class Tensor:
    """A named tensor: a numpy array (CPU), or a DLPack capsule's data."""

    def __init__(self, name: str, data: Any) -> None:
        if not isinstance(name, str):
            raise TritonModelException(f"tensor name must be a str, got {type(name).__name__}")
        array = np.asarray(data) if not isinstance(data, np.ndarray) else data
        if array.dtype.kind in "US":  # str / fixed bytes: Triton's BYTES are object arrays of bytes
            array = np.array([x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in array.flat],
                             dtype=np.object_).reshape(array.shape)
        self._name = name
        self._array: np.ndarray | None = array
        self._torch: Any = None

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._array is None:  # pragma: no cover - GPU only
            raise TritonModelException(f"tensor '{self._name}' lives on a GPU: use to_dlpack()")
        return self._array

    def is_cpu(self) -> bool:
        return self._torch is None or self._torch.device.type == "cpu"

    def shape(self) -> list[int]:
        source: Any = self._torch if self._torch is not None else self._array
        return list(source.shape)

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self.as_numpy().dtype.type)

    def to_dlpack(self) -> Any:
        source: Any = self._torch if self._torch is not None else self._array
        return source.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor from an object with ``__dlpack__`` (torch, numpy, cupy) or a capsule."""
        try:
            array = np.from_dlpack(capsule)
        except (TypeError, RuntimeError, BufferError):
            import torch  # a GPU tensor, or a bare capsule: torch reads both

            data = torch.utils.dlpack.from_dlpack(capsule)
            if data.device.type != "cpu":
                tensor = Tensor(name, np.empty(0))
                tensor._array = None
                tensor._torch = data
                return tensor
            array = data.numpy()
        return Tensor(name, array)

    def _value(self) -> Any:
        """What nereid's output conversion takes: the array, or the torch tensor."""
        return self._torch if self._torch is not None else self._array

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()})"


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return inference_request._by_name.get(name)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


# -- requests and responses ------------------------------------------------------------------


class InferenceResponse:
    def __init__(self, output_tensors: Sequence[Tensor] = (), error: TritonError | None = None,
                 parameters: Mapping[str, Any] | str | None = None) -> None:
        self._tensors = list(output_tensors)
        self._error = error
        self._parameters: dict[str, Any] = json.loads(parameters) if isinstance(parameters, str) else dict(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


class InferenceResponseSender:
    """A decoupled request's way back: ``send`` responses, the last one flagged
    ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (with or without a response)."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, bool], None]) -> None:
        self._deliver = deliver
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self._lock:
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if final:
                self._closed = True
        if response is None and not final:
            raise TritonModelException("Inference Response object must be provided when the response flags is "
                                       "not set to TRITONSERVER_RESPONSE_COMPLETE_FINAL")
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return self._closed


#: How BLS requests reach other models: set by the server (``set_bls_executor``).
_bls_executor: Callable[[InferenceRequest], InferenceResponse] | None = None
_bls_stream_executor: Callable[[InferenceRequest], Iterator[InferenceResponse]] | None = None


def set_bls_executor(
    execute: Callable[[InferenceRequest], InferenceResponse] | None,
    stream: Callable[[InferenceRequest], Iterator[InferenceResponse]] | None = None,
) -> None:
    """Install how ``InferenceRequest.exec()`` runs a request on this server (None: BLS off)."""
    global _bls_executor, _bls_stream_executor
    _bls_executor = execute
    _bls_stream_executor = stream


class InferenceRequest:
    """A request: what ``execute`` receives, or (built by a model) a BLS request."""

    def __init__(self, model_name: str = "", inputs: Sequence[Tensor] = (), requested_output_names: Sequence[str] = (),
                 request_id: str = "", correlation_id: int | str = 0, flags: int = 0, timeout: int = 0,
                 model_version: int = -1, preferred_memory: Any = None, trace: Any = None,
                 parameters: Mapping[str, Any] | str | None = None) -> None:
        if isinstance(model_name, bytes):
            model_name = model_name.decode("utf-8")
        self._model_name = model_name
        self._inputs = list(inputs)
        self._by_name = {tensor.name(): tensor for tensor in self._inputs}
        self._requested = list(requested_output_names)
        self._id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._model_version = model_version
        self._parameters: dict[str, Any] = json.loads(parameters) if isinstance(parameters, str) else dict(parameters or {})
        self._sender: InferenceResponseSender | None = None
        self._cancelled: Callable[[], bool] = lambda: False

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def requested_output_names(self) -> list[str]:
        return list(self._requested)

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("Unable to get response sender: the model is not decoupled")
        return self._sender

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def set_release_flags(self, flags: int) -> None:
        """Triton's request rescheduling is not supported; RELEASE_ALL is what happens anyway."""
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException("request rescheduling is not supported by nereid")

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on the named model of this server (BLS): an InferenceResponse,
        or with ``decoupled=True`` an iterator of them."""
        if decoupled:
            if _bls_stream_executor is None:
                raise TritonModelException("BLS is not available here (a process instance, or no server)")
            return _bls_stream_executor(self)
        if _bls_executor is None:
            raise TritonModelException("BLS is not available here (a process instance, or no server)")
        return _bls_executor(self)

    async def async_exec(self, decoupled: bool = False) -> Any:
        return await asyncio.to_thread(self.exec, decoupled)


# -- auto-complete ---------------------------------------------------------------------------


class ModelConfig:
    """The config ``auto_complete_config`` receives and returns (Triton's JSON form)."""

    def __init__(self, model_config: Mapping[str, Any] | str) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else dict(model_config)
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._model_config = config

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {current}, but in auto-complete-config "
                             f"function for model '{self._name()}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                                 f"function for model '{self._name()}' tries to set scheduling_choice as "
                                 "'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: Mapping[str, Any]) -> None:  # noqa: A002 (Triton's name)
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: Mapping[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def _add(self, kind: str, tensor: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._name()
        name = tensor.get("name")
        extra = [key for key in tensor if key not in allowed]
        if extra:
            listed = ", ".join(f"'{key}'" for key in allowed[:-1]) + f" and '{allowed[-1]}'"
            raise ValueError(f"{kind} '{name}' in auto-complete-config function for model '{model}' contains "
                             f"property other than {listed}.")
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                where = f"{kind} '{name}'" if required != "name" else kind
                raise ValueError(f"{where} in auto-complete-config function for model '{model}' is missing "
                                 f"'{required}' property.")
        for current in self._model_config[kind]:
            if current["name"] != name:
                continue
            data_type = current.get("data_type", "TYPE_INVALID")
            if data_type != "TYPE_INVALID" and data_type != tensor["data_type"]:
                raise ValueError(f"unable to load model '{model}', configuration expects datatype {data_type} for "
                                 f"{kind} '{name}', model provides {tensor['data_type']}")
            dims = [int(d) for d in current.get("dims", [])]
            if dims and dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(f"model '{model}', tensor '{name}': the model expects dims {list(tensor['dims'])} "
                                 f"but the model configuration specifies dims {dims}")
            current.update(tensor)
            return
        self._model_config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        model = self._name()
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(f"model transaction property in auto-complete-config function for model '{model}' "
                                 "contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            if "decoupled" in policy and policy["decoupled"] != transaction_policy_dict["decoupled"]:
                raise ValueError(f"trying to change decoupled property in auto-complete-config for model '{model}', "
                                 f"which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = transaction_policy_dict["decoupled"]


# -- logging ---------------------------------------------------------------------------------


class Logger:
    """``pb_utils.Logger.log_info(...)`` & co: the server's log, as the model's own lines."""

    INFO, WARNING, ERROR, VERBOSE = 0, 1, 2, 3

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        _log.log((logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG)[level], "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message)
