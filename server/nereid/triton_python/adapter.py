"""TritonModel: a Triton Python-backend ``TritonPythonModel`` as a nereid model instance.

Triton calls ``initialize(args)`` once per instance, ``execute(requests)`` with the list of
requests the scheduler batched (one ``InferenceResponse`` back per request, or, for a
decoupled model, responses sent through each request's sender), and ``finalize()`` at
unload. ``ModelInstance`` (instances/thread.py) drives this object the same way with the batch
its DynamicBatcher formed: ``execute`` answers each request on its own (an error response
fails only its request); ``execute_decoupled`` hands each sent response to ``deliver``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import sys
import types
from typing import Any, Callable, Iterator, Sequence

from nereid.context import ModelContext
from nereid.errors import (
    InvalidInputError,
    ModelExecutionError,
    ModelNotFoundError,
    NereidError,
    RequestCancelledError,
    UnavailableError,
    UnsupportedError,
)
from nereid.inference import InferRequest
from nereid.triton_python import pb_utils
from nereid.triton_python.bls import BlsTarget, NotToItself, calls_through
from nereid.triton_python.metrics import metrics_through

__all__ = ["MODULE_NAME", "TritonModel", "install_pb_utils"]

#: What a Triton model file imports.
MODULE_NAME = "triton_python_backend_utils"

#: How a TritonError's code fails its request (Triton's codes -> nereid's errors).
_ERRORS: dict[int, type[NereidError]] = {
    pb_utils.TritonError.INVALID_ARG: InvalidInputError,
    pb_utils.TritonError.NOT_FOUND: ModelNotFoundError,
    pb_utils.TritonError.UNAVAILABLE: UnavailableError,
    pb_utils.TritonError.UNSUPPORTED: UnsupportedError,
    pb_utils.TritonError.CANCELLED: RequestCancelledError,
}

#: One answer of ``execute``: the request's outputs by name, or the error that fails it.
RequestAnswer = dict[str, Any] | NereidError


def install_pb_utils() -> types.ModuleType:
    """Make ``import triton_python_backend_utils`` give nereid's module (idempotent)."""
    sys.modules.setdefault(MODULE_NAME, pb_utils)
    return pb_utils


def is_triton_model(module: types.ModuleType) -> bool:
    return isinstance(getattr(module, "TritonPythonModel", None), type)


class TritonModel:
    """One instance of a user's TritonPythonModel, built on the instance's thread.
    ``bls``: where its BLS requests go (its server's models; None: BLS not available);
    its custom metrics go to ``context.metrics``."""

    def __init__(self, triton_class: type, context: ModelContext, bls: BlsTarget | None = None) -> None:
        self.name = context.model_name
        if bls is not None and _instance_count(context.config) == 1:
            bls = NotToItself(bls, context.model_name, context.instance_name)
        self.bls = bls
        self.metrics = context.metrics
        self.model = triton_class()
        config = dict(context.config)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        folder = context.model_dir.parent if context.model_dir.name.isdigit() else context.model_dir
        args = {
            "model_config": json.dumps(config),
            "model_instance_kind": context.kind,
            "model_instance_name": context.instance_name,
            "model_instance_device_id": str(context.device_id or 0),
            "model_repository": str(folder),
            "model_version": str(context.model_version),
            "model_name": context.model_name,
        }
        initialize = getattr(self.model, "initialize", None)
        if initialize is not None:
            with self._server_calls():
                initialize(args)

    def execute(self, requests: Sequence[InferRequest]) -> list[RequestAnswer]:
        """One answer per request, in order. Raises what the model raises (the whole batch
        fails), or ModelExecutionError when ``execute`` does not answer every request."""
        with self._server_calls():
            responses = _settled(self.model.execute([self._request(request) for request in requests]))
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            got = len(responses) if isinstance(responses, (list, tuple)) else type(responses).__name__
            raise ModelExecutionError(
                f'model "{self.name}": execute must return one InferenceResponse per request '
                f"({len(requests)}), got {got}",
                model=self.name,
            )
        return [self._answer(response) for response in responses]

    def execute_decoupled(
        self, requests: Sequence[InferRequest], deliver: Callable[[int, RequestAnswer | None, bool], None],
        cancelled: Callable[[int], bool],
    ) -> None:
        """Start a decoupled batch: each response a request's sender sends reaches
        ``deliver(index, answer, final)`` (answer None: a final flag without a response),
        from whichever thread sends it. Raises what ``execute`` raises."""
        batch = []
        for index, request in enumerate(requests):
            wrapped = self._request(request)

            def send(response: pb_utils.InferenceResponse | None, final: bool, index: int = index) -> None:
                deliver(index, None if response is None else self._answer(response), final)

            wrapped._sender = pb_utils.InferenceResponseSender(send)
            wrapped._cancelled = lambda index=index: cancelled(index)  # type: ignore[misc]
            batch.append(wrapped)
        with self._server_calls():
            result = _settled(self.model.execute(batch))
        if result is not None:
            raise ModelExecutionError(
                f'model "{self.name}": a decoupled model\'s execute must return None and send its responses '
                f"through each request's response sender, got {type(result).__name__}",
                model=self.name,
            )

    def close(self) -> None:
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            with self._server_calls():
                finalize()

    @contextlib.contextmanager
    def _server_calls(self) -> Iterator[None]:
        """Model code in this block reaches its server: BLS requests, custom metrics."""
        with calls_through(self.bls), metrics_through(self.metrics):
            yield

    @staticmethod
    def _request(request: InferRequest) -> pb_utils.InferenceRequest:
        inputs = [pb_utils.Tensor(name, array) for name, array in request.inputs.items()]
        wanted = [output.name for output in request.outputs] if request.outputs is not None else []
        parameters = {key: value for key, value in request.parameters.items()}
        sequence = request.sequence
        flags = 0 if sequence is None else (
            (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if sequence.start else 0)
            | (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if sequence.end else 0))
        return pb_utils.InferenceRequest(
            model_name=request.model_name, inputs=inputs, requested_output_names=wanted, request_id=request.id,
            correlation_id=0 if sequence is None else sequence.id, flags=flags,
            model_version=request.model_version if request.model_version is not None else -1,
            timeout=request.timeout_us or 0, parameters=parameters,
        )

    def _answer(self, response: Any) -> RequestAnswer:
        if not isinstance(response, pb_utils.InferenceResponse):
            return ModelExecutionError(
                f'model "{self.name}": expected a pb_utils.InferenceResponse, got {type(response).__name__}',
                model=self.name,
            )
        error = response.error()
        if error is not None:
            kind = _ERRORS.get(error.code())
            if kind is None:
                return ModelExecutionError(error.message(), model=self.name)
            return kind(error.message())
        return {tensor.name(): tensor._value() for tensor in response.output_tensors()}


def _instance_count(config: Any) -> int:
    """The instances of a model, from its Triton JSON config (``count`` per group, per
    GPU of a KIND_GPU group)."""
    total = 0
    for group in config.get("instance_group", ()):
        gpus = group.get("gpus") or ()
        total += int(group.get("count", 1)) * (len(gpus) if group.get("kind") == "KIND_GPU" and gpus else 1)
    return total


def _settled(result: Any) -> Any:
    """What ``execute`` returned; an ``async def execute``'s coroutine is run to its end
    here, on the instance thread (its ``async_exec`` BLS calls wait on the server's loop)."""
    if inspect.isawaitable(result):
        async def wait() -> Any:
            return await result

        return asyncio.run(wait())
    return result
