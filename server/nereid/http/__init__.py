"""nereid's HTTP surface: Triton's KServe v2 protocol as a Starlette/ASGI app."""

from nereid.http.app import NereidApp, create_app

__all__ = ["create_app", "NereidApp"]
