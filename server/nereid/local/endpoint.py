"""LocalEndpoint: async in-process requests on the served models, each one's Python values
made a checked InferRequest (python_inputs.py) and handed to the model's batcher as an
HTTP request's would be; its optional arguments: RequestOptions.
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator, Mapping, TypedDict, Unpack

import numpy as np

from nereid.errors import UnsupportedError
from nereid.inference import InferRequest, ParameterValue, SequenceFlags
from nereid.local.python_inputs import build_request
from nereid.models.manager import ModelManager
from nereid.models.serving import ServingModel

__all__ = ["LocalEndpoint", "RequestOptions"]


class RequestOptions(TypedDict, total=False):
    """The optional arguments of one in-process request."""

    version: int | None
    parameters: Mapping[str, ParameterValue] | None
    priority: int
    timeout_us: int | None
    #: sequence batching: the correlation id and the START / END flags (as tritonclient's
    #: ``sequence_id``, ``sequence_start``, ``sequence_end``).
    sequence_id: int | str
    sequence_start: bool
    sequence_end: bool


class LocalEndpoint:
    """Async in-process inference over a ModelManager (Triton's in-process API, Ray's
    handle). Inputs are checked against the model config like HTTP requests are.
    Options (``RequestOptions``): ``version``, ``parameters``, ``priority``, ``timeout_us``,
    and for a sequence model ``sequence_id``, ``sequence_start``, ``sequence_end``."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    async def infer(
        self, model: str, inputs: Mapping[str, Any], **options: Unpack[RequestOptions]
    ) -> dict[str, np.ndarray]:
        """One request; returns its outputs (name -> numpy array, batch dim included)."""
        received = time.monotonic_ns()
        serving, request = self._request(model, inputs, options)
        if serving.config.decoupled:
            raise UnsupportedError(f"model '{model}' is decoupled (it streams): use stream() instead of infer()")
        return await serving.infer(request, received)

    async def stream(
        self, model: str, inputs: Mapping[str, Any], **options: Unpack[RequestOptions]
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """One request; yields its outputs step by step (a non-decoupled model yields once)."""
        received = time.monotonic_ns()
        serving, request = self._request(model, inputs, options)
        if not serving.config.decoupled:
            yield await serving.infer(request, received)
            return
        async for step in serving.stream(request, received):
            yield step

    def _request(self, model: str, inputs: Mapping[str, Any], options: RequestOptions) -> tuple[ServingModel, InferRequest]:
        serving = self.manager.get(model, options.get("version"))
        request = build_request(
            serving.config, model, inputs, options.get("parameters"), options.get("priority", 0),
            options.get("timeout_us"),
        )
        if "sequence_id" in options or "sequence_start" in options or "sequence_end" in options:
            request.sequence = SequenceFlags(
                options.get("sequence_id", 0), options.get("sequence_start", False), options.get("sequence_end", False)
            )
        return serving, request
