"""RequestBudget: the bytes of requests a server holds at once, over HTTP and gRPC.

Every request body (HTTP) and every request message (gRPC) is counted from the moment
its size is known until its call is answered or gone. A request larger than
``SMALL_REQUEST`` is refused (HTTP 503, gRPC RESOURCE_EXHAUSTED) while it would take the
total past the limit (``--max-request-bytes-in-flight``); smaller ones always pass, so
health checks and ordinary infer requests keep working while large uploads wait their
turn. One budget per server, shared by its HTTP and gRPC engines.
"""

from __future__ import annotations

__all__ = ["RequestBudget", "SMALL_REQUEST"]

#: Requests up to this size are never refused by the budget.
SMALL_REQUEST = 64 * 1024


class RequestBudget:
    """Bytes of requests held over all connections of a server (received, not answered)."""

    __slots__ = ("limit", "held")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def admits(self, size: int) -> bool:
        """Whether a request bringing ``size`` more bytes may be read now."""
        return size <= SMALL_REQUEST or self.held + size <= self.limit

    def refusal(self, size: int) -> str:
        """What a client refused by ``admits`` is told."""
        return (
            f"server busy: {self.held} bytes of requests in flight and this request brings {size} more, "
            f"past the limit of {self.limit} (--max-request-bytes-in-flight); retry later"
        )
