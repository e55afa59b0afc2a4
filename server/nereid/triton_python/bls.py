"""Business Logic Scripting: how a TritonPythonModel's ``InferenceRequest.exec()`` reaches
its own server's models.

Two servers may share a process, and user code imports one ``triton_python_backend_utils``
for all of them, so the way to the server is no module attribute: each TritonModel holds
its server's ``BlsTarget`` (the model loader hands it over) and runs ``initialize`` and
``execute`` inside ``calls_through(target)``, which sets it in a context variable. Code
that ``execute`` calls, awaits, or runs with ``asyncio.to_thread`` sees it (contexts are
copied there); a thread the model starts itself sees it when started in
``contextvars.copy_context().run``.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING, Iterator, Protocol

from nereid.triton_python.context_scope import set_within

if TYPE_CHECKING:
    from nereid.triton_python.messages import InferenceRequest, InferenceResponse

__all__ = ["BlsTarget", "NotToItself", "calls_through", "current_target"]


class BlsTarget(Protocol):
    """One server's way to run a model's BLS requests (``nereid.local.ServerBls``)."""

    def infer(self, request: InferenceRequest, /) -> InferenceResponse:
        """Run ``request`` on the named model; its response (an error response on failure)."""

    def stream(self, request: InferenceRequest, /) -> Iterator[InferenceResponse]:
        """Run ``request`` on the named (decoupled) model; its responses as they come."""


class NotToItself:
    """A model's BLS target when the model has one instance: a request to the model
    itself is an error response (UNAVAILABLE) instead of a wait for ever (its only
    instance is the caller); requests to other models go to ``target``."""

    def __init__(self, target: BlsTarget, model: str, instance: str) -> None:
        self.target = target
        self.model = model
        self.instance = instance

    def infer(self, request: InferenceRequest, /) -> InferenceResponse:
        refused = self._refused(request)
        return refused if refused is not None else self.target.infer(request)

    def stream(self, request: InferenceRequest, /) -> Iterator[InferenceResponse]:
        refused = self._refused(request)
        return iter((refused,)) if refused is not None else self.target.stream(request)

    def _refused(self, request: InferenceRequest) -> InferenceResponse | None:
        if request.model_name() != self.model:
            return None
        from nereid.triton_python.messages import InferenceResponse, TritonError

        return InferenceResponse(error=TritonError(
            f'BLS request from model "{self.model}" instance {self.instance} to its own model: "{self.model}" '
            "has no other instance to run it (it would wait for itself); give it a second instance",
            TritonError.UNAVAILABLE,
        ))


#: The target of the model code running in this context (None: no server, where BLS is
#: not available). A context variable, not shared state.
_target: contextvars.ContextVar[BlsTarget | None] = contextvars.ContextVar("nereid_bls_target", default=None)


def calls_through(target: BlsTarget | None) -> contextlib.AbstractContextManager[None]:
    """Model code run inside this block sends its BLS requests to ``target``."""
    return set_within(_target, target)


def current_target() -> BlsTarget | None:
    """The BLS target of the model code running now (None: BLS is not available)."""
    return _target.get()
