"""An ensemble's dependencies on its step models, as Triton's model repository manager
keeps them: loading an ensemble loads the step models no one loaded (and waits for those
loading), never in a cycle; unloading it with ``unload_dependents`` unloads the step
models loaded only for it. The model manager (manager.py) holds one ``Dependencies``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from nereid.config.schema import ModelConfig
from nereid.models.serving import ServingModel
from nereid.models.states import ModelRecord

__all__ = ["Dependencies", "step_models"]

_log = logging.getLogger("nereid")

#: the manager's record of a model, under its lock (ModelManager._locked)
Locked = Callable[[str], contextlib.AbstractAsyncContextManager[ModelRecord]]


def step_models(config: ModelConfig) -> list[str]:
    """The models an ensemble's steps run, each once, in step order ([] for a model)."""
    scheduling = config.ensemble_scheduling
    return list(dict.fromkeys(step.model_name for step in scheduling.step)) if scheduling is not None else []


class Dependencies:
    """The step models loaded only for ensembles, and the ensemble loads waiting for a
    step model's load (to see a cycle before it could deadlock)."""

    def __init__(self) -> None:
        #: models loaded only as an ensemble's steps (unload_dependents unloads them)
        self.implicit: set[str] = set()
        #: ensemble -> the step model whose lock its load waits for
        self._waiting: dict[str, str] = {}

    async def load_steps(self, name: str, config: ModelConfig, *, startup: bool, serving: Mapping[str, ServingModel],
                         locked: Locked, load: Callable[[str, bool], Awaitable[None]]) -> None:
        """Load the step models of ensemble ``name`` that no one loaded (a load under way
        is waited for). A step model that failed to load at start-up is not tried again;
        one whose load would wait for this ensemble (a cycle) is left out: the ensemble's
        load then fails, naming it. ``serving``: the READY models by name; ``locked``:
        a model's record under its lock; ``load(name, startup)``: load one, logging a failure."""
        for step in step_models(config):
            holder = step
            while holder in self._waiting:
                holder = self._waiting[holder]
            if holder == name or step == name:
                _log.error("circular dependency between ensembles: '%s' and '%s' use each other as steps", name, step)
                continue
            if step in serving:
                continue
            self._waiting[name] = step
            try:
                async with locked(step) as record:  # waits for a load under way
                    known, attempted = bool(record.serving), bool(record.statuses or record.reason)
                if not known and not (startup and attempted):
                    self.implicit.add(step)
                    await load(step, startup)
            finally:
                del self._waiting[name]

    def dependents(self, unloaded: Iterable[ServingModel], serving: Iterable[ServingModel]) -> list[str]:
        """The step models of the ``unloaded`` ensemble versions that were loaded only for
        ensembles and that no ``serving`` ensemble uses: what unload_dependents unloads."""
        steps = {step for model in unloaded for step in step_models(model.config)}
        used = {step for model in serving for step in step_models(model.config)}
        found = sorted(steps & self.implicit - used)
        self.implicit.difference_update(found)
        return found
