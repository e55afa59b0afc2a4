"""Restricted HTTP endpoint groups (``--http-restricted-api``): each route's group, and
its handler wrapped at app build time when that group needs a key.

Owns the route-to-group decision and the refusal (Triton's: 403 and
``{"error":"This API is restricted, expecting header '<key>'"}``). A route of an
unrestricted group is not wrapped: with no restriction configured, requests pay nothing.
Parsing and comparing keys is ``nereid.network.access``' business.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import Response

from nereid.network.access import Refusals, Restriction
from nereid.http._asgi import Receive, Scope, Send, send_json
from nereid.http.errors import error_json

__all__ = ["Guard", "guarded", "header_value"]

_JSON = (b"content-type", b"application/json")


def header_value(headers: Any, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case) in an ASGI / native header list."""
    for key, value in headers:
        if key == name:  # ASGI and the native engine give header names in lower case
            return bytes(value)
    return None


class Guard:
    """One restricted group's check: ``allows(headers)`` compares the key's header in
    constant time and counts a refusal; ``refusal`` is the answer to give then."""

    __slots__ = ("group", "restriction", "refusals", "_name", "refusal")

    def __init__(self, group: str, restriction: Restriction, refusals: Refusals) -> None:
        self.group = group
        self.restriction = restriction
        self.refusals = refusals
        self._name = restriction.name.encode("latin-1")
        #: (status, headers, body) of a refused request
        self.refusal: tuple[int, list[tuple[bytes, bytes]], bytes] = (
            403, [_JSON], error_json(restriction.http_message())
        )

    def permits(self, headers: Any) -> bool:
        """Whether ``headers`` carry the key (nothing counted)."""
        return self.restriction.allows(header_value(headers, self._name))

    def allows(self, headers: Any) -> bool:
        """``permits``, counting a refusal."""
        if self.restriction.allows(header_value(headers, self._name)):
            return True
        self.refusals.count("http", self.group)
        return False


def guarded(endpoint: Any, guard: Guard | None) -> Any:
    """``endpoint`` (a request handler or a raw ASGI app), refusing requests ``guard``
    does not allow; ``endpoint`` itself when its group is not restricted."""
    if guard is None:
        return endpoint
    status, _, body = guard.refusal
    if inspect.isfunction(endpoint) or inspect.ismethod(endpoint):
        handler: Callable[[Request], Any] = endpoint

        async def checked(request: Request) -> Response:
            if guard.allows(request.scope["headers"]):
                return await handler(request)  # type: ignore[no-any-return]
            return Response(body, status_code=status, media_type="application/json")

        return checked

    return _GuardedApp(endpoint, guard)


class _GuardedApp:
    """A raw ASGI app behind a Guard (a class instance: Starlette's Route mounts it as an
    app, not as a request handler)."""

    __slots__ = ("_app", "_guard")

    def __init__(self, app: Callable[[Scope, Receive, Send], Any], guard: Guard) -> None:
        self._app = app
        self._guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guard = self._guard
        if guard.allows(scope["headers"]):
            await self._app(scope, receive, send)
        else:
            await send_json(send, guard.refusal[0], guard.refusal[2])
