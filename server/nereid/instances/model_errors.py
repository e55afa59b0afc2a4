"""What model code raises, as the event loop and the batcher may handle it: a
cancellation of the loop's own goes on up (``cancelled_by_loop``); any other
BaseException (SystemExit, KeyboardInterrupt, a CancelledError of the model's own) is
carried as an Exception (``as_exception``), and an exception type met in a process
instance is stood for by a class of its name (``model_exception``), so that messages
read the same however the instance runs.
"""

from __future__ import annotations

import asyncio
import functools

__all__ = ["ModelBaseException", "as_exception", "cancelled_by_loop", "model_exception"]


def cancelled_by_loop(exc: BaseException) -> bool:
    """Whether ``exc``, caught on the loop, is the loop cancelling the running task
    (shutdown, a drain timeout): that must go on up. A CancelledError raised by model code
    itself, while nobody cancels the task, is the model's failure like any exception."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class ModelBaseException(Exception):
    """A BaseException that is not an Exception (SystemExit, KeyboardInterrupt,
    GeneratorExit, a CancelledError of the model's own), raised by model code where the
    caller handles Exceptions only: carried as an Exception, so that it fails that call
    alone. ``as_exception`` makes one of a class named like the original, so that a
    message built of type name and text reads as the original's."""



def as_exception(exc: BaseException) -> ModelBaseException:
    """A ModelBaseException carrying ``exc`` (its arguments, traceback and, as cause, itself)."""
    carrier = _carrier(type(exc))  # type: ignore[arg-type]  # (classes hash; typeshed disagrees)
    carried = carrier(*exc.args).with_traceback(exc.__traceback__)
    carried.__cause__ = exc
    return carried


@functools.cache  # one class per BaseException class met (a few at most)
def _carrier(cls: type[BaseException]) -> type[ModelBaseException]:
    namespace = {"__qualname__": cls.__qualname__, "__module__": cls.__module__}
    return type(cls.__name__, (ModelBaseException,), namespace)


def model_exception(type_name: str, text: str) -> Exception:
    """An Exception standing for what model code raised in a process instance: its class
    is named like the original's, so that a message built of type name and text reads as
    for a thread instance (``Model.batch_size(inputs) raised SystemExit: 9``)."""
    return _stand_in_exception(type_name)(text)


@functools.cache  # one class per exception type name met (a few at most)
def _stand_in_exception(type_name: str) -> type[Exception]:
    return type(type_name, (Exception,), {"__module__": "nereid.instances.worker"})
