"""Directory: a picture of what the model manager shows, for answering health, metadata
and config away from it (a front-end worker), word for word as the manager would.

``Lookup`` is what those answers read (``models.admin``'s ``why_not_ready``,
``model_metadata``, ``model_config`` and server readiness): the ModelManager is one, a
Directory another. A Directory holds, per model the manager knows, the READY versions
(number, config, config JSON, problem and whether it can change on its own) and the
reasons the index gives, so ``get`` raises the same error with the same words
(``states.not_serving_error``); it is made of plain records that pickle. Knows no HTTP
and no processes.

``StatsSource`` is what the statistics answers read (``models.admin.model_statistics``):
the ModelManager, or a ``StatisticsPicture`` of its served versions' figures taken away
from it (a front-end worker's, read from shared memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from nereid.config.schema import ModelConfig
from nereid.errors import NereidError
from nereid.models.manager import ModelManager
from nereid.models.states import not_serving_error
from nereid.stats import ModelStats

__all__ = [
    "Counted", "Directory", "Lookup", "ModelFacts", "Served", "StatisticsPicture", "StatsSource", "VersionFacts",
    "VersionStatistics",
]


class Served(Protocol):
    """A READY version as the admin answers read it (a ServingModel, or VersionFacts)."""

    @property
    def version(self) -> int: ...
    @property
    def config(self) -> ModelConfig: ...
    @property
    def config_json(self) -> dict[str, Any]: ...
    @property
    def problem(self) -> str | None: ...


class Lookup(Protocol):
    """What the health, metadata and config answers read: ModelManager or Directory."""

    def get(self, name: str, version: int | None = None) -> Served: ...
    def model_versions(self, name: str) -> Sequence[Served]: ...
    def is_ready(self, strict: bool = True) -> bool: ...


class Counted(Protocol):
    """A READY version as the statistics answers read it (a ServingModel, or VersionStatistics)."""

    @property
    def version(self) -> int: ...
    @property
    def stats(self) -> ModelStats: ...
    @property
    def has_process_instances(self) -> bool: ...
    @property
    def restarts(self) -> int: ...


class StatsSource(Protocol):
    """What the statistics answers read: ModelManager or StatisticsPicture."""

    def serving_models(self) -> Sequence[Counted]: ...
    def model_versions(self, name: str) -> Sequence[Counted]: ...


@dataclass(frozen=True, slots=True)
class VersionStatistics:
    """A READY version's statistics at one moment: its figures, and how often its process
    instances were restarted (``has_process_instances`` False: it has none)."""

    version: int
    stats: ModelStats
    has_process_instances: bool
    restarts: int


@dataclass(frozen=True, slots=True)
class StatisticsPicture:
    """The statistics of READY versions, by model name (each model's versions lowest
    first): ``serving_models`` and ``model_versions`` answer as the manager's own do, for
    the models the picture holds."""

    models: Mapping[str, Sequence[VersionStatistics]]

    def serving_models(self) -> list[VersionStatistics]:
        return [served for name in sorted(self.models) for served in self.models[name]]

    def model_versions(self, name: str) -> list[VersionStatistics]:
        return list(self.models.get(name, ()))


@dataclass(frozen=True, slots=True)
class VersionFacts:
    """A READY version: its number, config (records and Triton JSON), why none of its
    instances can serve (None: one can) when the picture was taken, and whether that
    can change on its own (``ServingModel.settled``: if not, the picture's ``problem``
    may be out of date, and so may readiness)."""

    version: int
    config: ModelConfig
    config_json: dict[str, Any]
    problem: str | None
    settled: bool


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """One model the manager knows: its READY versions, the versions the index has a row
    for, and what ``ModelRecord.why_not_serving`` says of it (``why``) and of each of
    those versions (``why_version``)."""

    serving: Mapping[int, VersionFacts]
    statuses: frozenset[int]
    why: str
    why_version: Mapping[int, str]

    def why_not_serving(self, version: int | None = None) -> str:
        if version is None:
            return self.why
        return self.why_version.get(version, "")

    @classmethod
    def of(cls, manager: ModelManager, name: str) -> ModelFacts:
        record = manager.records[name]
        serving = {
            number: VersionFacts(number, version.config, version.config_json, version.problem, version.settled)
            for number, version in record.serving.items()
        }
        why_version = {number: record.why_not_serving(number) for number in record.statuses}
        return cls(serving, frozenset(record.statuses), record.why_not_serving(), why_version)


@dataclass(frozen=True, slots=True)
class Directory:
    """What the manager shows, at one moment: server readiness (strict and not) and every
    model it knows. ``Directory.of(manager)`` takes the picture; ``get``,
    ``model_versions`` and ``is_ready`` answer as the manager's own do."""

    ready: bool
    ready_strict: bool
    models: Mapping[str, ModelFacts]

    @classmethod
    def of(cls, manager: ModelManager) -> Directory:
        models = {name: ModelFacts.of(manager, name) for name in manager.records}
        return cls(manager.is_ready(strict=False), manager.is_ready(strict=True), models)

    def get(self, name: str, version: int | None = None) -> VersionFacts:
        facts = self.models.get(name)
        if facts is not None and facts.serving:
            serving = facts.serving.get(max(facts.serving) if version is None else version)
            if serving is not None:
                return serving
        raise not_serving_error(name, version, facts)

    def model_versions(self, name: str) -> list[VersionFacts]:
        facts = self.models.get(name)
        return [facts.serving[number] for number in sorted(facts.serving)] if facts is not None else []

    def is_ready(self, strict: bool = True) -> bool:
        return self.ready_strict if strict else self.ready

    def settled(self, name: str | None = None, version: int | None = None) -> bool:
        """Whether the readiness this picture gives is still true: of model ``name``
        (``version``: None for the latest; an error answer always is), or with no name of
        the server under strict readiness (every READY version settled)."""
        if name is None:
            return all(served.settled for facts in self.models.values() for served in facts.serving.values())
        try:
            return self.get(name, version).settled
        except NereidError:  # no READY version: what the error says involves no instance
            return True
