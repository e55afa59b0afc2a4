"""The requests a front-end worker answers itself: health, server and model metadata,
model config (``http.app.lookup_rows``: GET on their routes), from its copy of the
model manager's Directory (directory_sync.py), and statistics (``statistics_rows``) from
the figures the main process publishes in shared memory (shared_stats.py), with the main
process's own handlers (``http.endpoints.Lookups``), so the bytes are the same.

A request is left to the main process (forwarded) when its copy may be out of date, for
readiness that reads a version whose ``problem`` can change on its own (process
instances, an execution timeout, an ensemble: ``Directory.settled``), for statistics the
shared table cannot give (``StatisticsCopy.read``; all of them when the worker has no
table), when its group is restricted (the main app checks the key and counts refusals),
when its path belongs to a route the worker does not answer first (``SHADOWING_PATHS``:
``/v2/models/stats`` without statistics here), and for any other method or path.
"""

from __future__ import annotations

from typing import Any, MutableMapping

from starlette.routing import Match, Route

from nereid.frontends.directory_sync import DirectoryCopy
from nereid.frontends.shared_stats import StatisticsCopy
from nereid.http._asgi import Message, Scope, Send
from nereid.http.app import SHADOWING_PATHS, lookup_rows, statistics_rows
from nereid.http.endpoints import Lookups
from nereid.errors import NereidError
from nereid.models.admin import parse_version
from nereid.models.directory import Counted, Directory, Served, StatisticsPicture
from nereid.options import ServerOptions

__all__ = ["LocalAnswers"]


class _Pinned:
    """The Lookup the handlers read: the picture that was current when the request came
    (it cannot change while a handler runs: they do not wait)."""

    directory = Directory(False, False, {})

    def get(self, name: str, version: int | None = None) -> Served:
        return self.directory.get(name, version)

    def model_versions(self, name: str) -> list[Any]:
        return self.directory.model_versions(name)

    def is_ready(self, strict: bool = True) -> bool:
        return self.directory.is_ready(strict)


class _PinnedStatistics:
    """The StatsSource the statistics handlers read: the figures read for the request."""

    picture = StatisticsPicture({})

    def serving_models(self) -> list[Counted]:
        return list(self.picture.serving_models())

    def model_versions(self, name: str) -> list[Counted]:
        return list(self.picture.model_versions(name))


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def _route(routes: list[Route], scope: Scope) -> tuple[Route, MutableMapping[str, Any]] | None:
    """The route of ``routes`` that takes the request whole, and what it read of it."""
    for route in routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            return route, child
    return None


class LocalAnswers:
    """``answer(scope, send)`` answers the request when it is one of the worker's own
    (True), else leaves it (False: forward it). ``answered`` counts those it answered.
    ``statistics``: the shared figures (None: statistics are forwarded)."""

    def __init__(self, copy: DirectoryCopy, options: ServerOptions, statistics: StatisticsCopy | None = None) -> None:
        self.copy = copy
        self.strict = options.strict_readiness
        self.statistics = statistics
        self.answered = 0
        self._pinned = _Pinned()
        self._pinned_statistics = _PinnedStatistics()
        restricted = {group for restriction in options.http_restricted_api for group in restriction.groups}
        lookups = Lookups(self._pinned, options, self._pinned_statistics)
        self._routes = [
            Route(path, handler, methods=methods)  # type: ignore[arg-type]
            for path, handler, group, methods in lookup_rows(lookups)
            if group not in restricted
        ]
        self._statistics_routes = [
            Route(path, handler, methods=methods)  # type: ignore[arg-type]
            for path, handler, group, methods in statistics_rows(lookups)
            if group not in restricted and statistics is not None
        ]

    async def answer(self, scope: Scope, send: Send) -> bool:
        if scope["method"] != "GET":
            return False
        if self._statistics_routes and scope["path"].endswith("/stats") and await self._answer_statistics(scope, send):
            return True
        if scope["path"] in SHADOWING_PATHS:
            return False
        directory = self.copy.current()
        if directory is None:
            return False
        found = _route(self._routes, scope)
        if found is None:
            return False
        route, child = found
        if route.path.endswith("/ready") and not self._settled(directory, child["path_params"]):
            return False
        self._pinned.directory = directory
        self.answered += 1
        await route.handle({**scope, **child}, _no_body, send)
        return True

    async def _answer_statistics(self, scope: Scope, send: Send) -> bool:
        """A statistics request, answered from the figures read for it (False: it is not
        one, or the main process must answer it)."""
        found = _route(self._statistics_routes, scope)
        if found is None:
            return False
        route, child = found
        assert self.statistics is not None
        picture = self.statistics.read(child["path_params"].get("name"))
        if picture is None:
            return False
        self._pinned_statistics.picture = picture
        self.answered += 1
        await route.handle({**scope, **child}, _no_body, send)
        return True

    def _settled(self, directory: Directory, params: dict[str, Any]) -> bool:
        """Whether the readiness a ready route asks for is the picture's to tell."""
        if "name" not in params:  # /v2/health/ready
            return not self.strict or directory.settled()
        try:
            version = parse_version(params.get("version"))
        except NereidError:
            return True  # a version past Triton's range: an error, whatever the models
        return directory.settled(params["name"], version)
