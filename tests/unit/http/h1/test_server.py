"""The native engine's infer routing: which POST URLs take the fast path, and the memo of
routes stays bounded whatever URLs clients invent."""

from __future__ import annotations

from typing import Any

import pytest

from nereid.http.app import NereidApp
from nereid.http.h1.server import _MAX_ROUTES, NativeServer


def native_server() -> NativeServer:
    app = NereidApp(starlette=None, endpoints=None)  # type: ignore[arg-type]  # routing needs neither
    return NativeServer(app, graceful_timeout=1.0)


@pytest.mark.parametrize("url, route", [
    (b"/v2/models/identity/infer", ("identity", None)),
    (b"/v2/models/identity/versions/3/infer", ("identity", "3")),
    (b"/v2/models/a.b-c_d/infer", ("a.b-c_d", None)),
    # left to the ASGI app, which decodes escapes, drops queries and answers 404/405:
    (b"/v2/models/%69dentity/infer", None),
    (b"/v2/models/identity/infer?x=1", None),
    (b"/v2/models/identity/versions/x/infer", None),
    (b"/v2/models//infer", None),
    (b"/v2/models/identity/ready", None),
    (b"http://host/v2/models/identity/infer", None),
])
def test_infer_route(url: bytes, route: Any) -> None:
    server = native_server()
    assert server.infer_route(url) == route
    assert server.infer_route(url) == route  # remembered, same answer


def test_remembered_routes_stay_bounded() -> None:
    server = native_server()
    for index in range(3 * _MAX_ROUTES):
        assert server.infer_route(b"/v2/models/m%d/infer" % index) == (f"m{index}", None)
    assert len(server._routes) <= _MAX_ROUTES
