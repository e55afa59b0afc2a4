"""The requests a front-end worker answers itself: health, server and model metadata,
model config (``http.app.lookup_rows``: GET on their routes), from its copy of the
model manager's Directory (directory_sync.py), with the main process's own handlers
(``http.endpoints.Lookups``), so the bytes are the same.

A request is left to the main process (forwarded) when its copy may be out of date, for
readiness that reads a version whose ``problem`` can change on its own (process
instances, an execution timeout, an ensemble: ``Directory.settled``), when its group is
restricted (the main app checks the key and counts refusals), when its path
belongs to another route first (``SHADOWING_PATHS``: ``/v2/models/stats``), and for any
other method or path.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Match, Route

from nereid.frontends.directory_sync import DirectoryCopy
from nereid.http._asgi import Message, Scope, Send
from nereid.http.app import SHADOWING_PATHS, lookup_rows
from nereid.http.endpoints import Lookups
from nereid.errors import NereidError
from nereid.models.admin import parse_version
from nereid.models.directory import Directory, Served
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


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class LocalAnswers:
    """``answer(scope, send)`` answers the request when it is one of the worker's own
    (True), else leaves it (False: forward it). ``answered`` counts those it answered."""

    def __init__(self, copy: DirectoryCopy, options: ServerOptions) -> None:
        self.copy = copy
        self.strict = options.strict_readiness
        self.answered = 0
        self._pinned = _Pinned()
        restricted = {group for restriction in options.http_restricted_api for group in restriction.groups}
        self._routes = [
            Route(path, handler, methods=methods)  # type: ignore[arg-type]
            for path, handler, group, methods in lookup_rows(Lookups(self._pinned, options))
            if group not in restricted
        ]

    async def answer(self, scope: Scope, send: Send) -> bool:
        if scope["method"] != "GET" or scope["path"] in SHADOWING_PATHS:
            return False
        directory = self.copy.current()
        if directory is None:
            return False
        for route in self._routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                if route.path.endswith("/ready") and not self._settled(directory, child["path_params"]):
                    return False
                self._pinned.directory = directory
                self.answered += 1
                await route.handle({**scope, **child}, _no_body, send)
                return True
        return False

    def _settled(self, directory: Directory, params: dict[str, Any]) -> bool:
        """Whether the readiness a ready route asks for is the picture's to tell."""
        if "name" not in params:  # /v2/health/ready
            return not self.strict or directory.settled()
        try:
            version = parse_version(params.get("version"))
        except NereidError:
            return True  # a version past Triton's range: an error, whatever the models
        return directory.settled(params["name"], version)
