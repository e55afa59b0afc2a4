"""What a TritonPythonModel's ``execute`` receives and returns, as Triton's
Python-backend stub names them: ``Tensor``, ``InferenceRequest`` (also the Business Logic
Scripting request a model builds to call another model of its server: ``exec()`` goes
through ``bls.py``), ``InferenceResponse``, ``InferenceResponseSender``, ``TritonError``
with its codes and ``TritonModelException``. ``pb_utils.py`` re-exports them.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nereid.triton_python.bls import current_target

__all__ = [
    "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "Tensor", "TritonError",
    "TritonModelException", "get_input_tensor_by_name", "get_output_tensor_by_name", "numpy_to_triton_type",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
]

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

#: TRITONSERVER_DataType numbers (1 BOOL ... 13 BYTES) -> numpy types.
NUMBERED_TYPES = (None, np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32,
                  np.int64, np.float16, np.float32, np.float64, np.object_)


def numpy_to_triton_type(data_type: Any) -> int | None:
    if data_type in (np.object_, np.bytes_):
        return 13
    for number, kind in enumerate(NUMBERED_TYPES):
        if kind is not None and data_type == kind:
            return number
    return None


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
        target = current_target()
        if target is None:
            raise TritonModelException(
                "BLS is not available here (no server, or a thread the model started outside its execute's "
                "context)"
            )
        return target.stream(self) if decoupled else target.infer(self)

    async def async_exec(self, decoupled: bool = False) -> Any:
        return await asyncio.to_thread(self.exec, decoupled)
