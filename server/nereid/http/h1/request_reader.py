"""RequestReader: one native connection's requests, read from its bytes within the limits.

Owns httptools' parser of one connection and everything about reading a request: the
head limits (URL 414; header count and head size 431, an unfinished head's bytes
included), the body size limit (--max-request-size), the server's body budget (503),
``Expect: 100-continue``, and the head and body timers. Complete requests, and the
refusals of requests that broke a limit, go to its ``Reading`` (the Connection); it
knows nothing about answering them. Limits and texts: connection_limits.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import httptools

from nereid.errors import InvalidInputError
from nereid.http._asgi import body_too_large, check_declared_length, error_parts
from nereid.http.endpoints import InferHeaders
from nereid.http.errors import error_json
from nereid.http.h1.heads import CONTINUE

if TYPE_CHECKING:
    from nereid.http.h1.server import NativeServer

__all__ = ["Answer", "Reading", "Request", "RequestReader", "refusal"]

_JSON = (b"content-type", b"application/json")

#: A complete answer: status, headers (content-length added when written), body.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


def refusal(status: int, message: str) -> Answer:
    """Triton's ``{"error": ...}`` answer with ``status``."""
    return status, [_JSON], error_json(message)


class Request:
    """One complete request waiting for (or getting) its answer."""

    __slots__ = ("method", "url", "headers", "body", "keep_alive", "http_version", "refusal", "infer_headers",
                 "reserved")

    def __init__(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
        keep_alive: bool, http_version: str, refusal: Answer | None,
        infer_headers: InferHeaders | None = None,
    ) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http_version = http_version
        #: answered with this instead of being served (a limit, an unparsable request).
        self.refusal = refusal
        #: what the infer path reads of ``headers`` (made when first needed, by
        #: ``parsed_infer_headers``; repeats share the one of the request they repeat).
        self.infer_headers = infer_headers
        #: body bytes this request holds of the server's RequestBudget until it is answered.
        self.reserved = 0

    def parsed_infer_headers(self) -> InferHeaders:
        """``infer_headers``, made from ``headers`` the first time."""
        parsed = self.infer_headers
        if parsed is None:
            parsed = self.infer_headers = InferHeaders(self.headers)
        return parsed


class Reading(Protocol):
    """What a RequestReader hands its requests to (the Connection)."""

    def take(self, request: Request, /) -> None:
        """A complete request, in order."""

    def take_refusal(self, request: Request, /) -> None:
        """A request that broke a limit: answer it with ``request.refusal``, read no more."""

    def may_continue(self) -> bool:
        """Whether ``100 Continue`` may be written now (nothing before it is unanswered)."""


class RequestReader:
    """Feeds one connection's bytes to httptools and turns its callbacks into Requests."""

    def __init__(self, reading: Reading, server: NativeServer, transport: Any) -> None:
        self._reading = reading
        self._server = server
        self._limits = server.limits
        self._budget = server.body_budget
        self._transport = transport
        self._parser: Any = httptools.HttpRequestParser(self)  # None once closed (it refers back)
        #: inside a request (not at a boundary), and past its head (in its body)
        self.in_message = False
        self.headers_done = False
        #: when the head, or the latest part of the body, began to arrive (the server's coarse clock)
        self.since = server.now
        self._begun = 0  # requests begun during the current read
        self._completed: Request | None = None  # the last request completed
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._size = 0
        self._refusal: Answer | None = None
        self._header_count = 0
        self._head_size = 0  # bytes of the request line and headers so far
        self._head_bytes = 0  # bytes read since the read that began an unfinished head
        self._reserved = 0  # body bytes of the request being read, held of the budget
        self._held = 0  # body bytes of this connection's requests, held of the budget

    def feed(self, data: bytes) -> Request | None:
        """Parse one read. Returns the request when the read, begun at a boundary, was that
        one whole request and nothing else (what a repeat head is learnt from). Raises
        httptools' HttpParserUpgrade and HttpParserError."""
        at_boundary = not self.in_message
        self._begun = 0
        self._completed = None
        self._parser.feed_data(data)
        if self._begun == 1 and at_boundary and not self.in_message:
            return self._completed
        if self.in_message and not self.headers_done and self._refusal is None:
            self._check_head_bytes(len(data))
        return None

    def timed_out(self, now: float) -> bool:
        """Refuse the request being read (408) when its head or body stalled past its
        timeout; True if it did."""
        if not self.in_message or self._refusal is not None:
            return False
        limits = self._limits
        if not self.headers_done and now - self.since > limits.header_timeout:
            self._refuse(refusal(408, limits.head_timed_out()))
            return True
        if self.headers_done and now - self.since > limits.body_timeout:
            self._refuse(refusal(408, limits.body_timed_out()))
            return True
        return False

    def release(self, request: Request) -> None:
        """``request`` was answered: its body bytes go back to the budget."""
        if request.reserved:
            self._give_back(request.reserved)
            request.reserved = 0

    def close(self) -> None:
        """The connection is gone: give back every byte held and drop the parser and the
        connection (both refer back to this object) and the buffers, so they go now, not
        at the next cyclic collection."""
        self._give_back(self._held)
        self._reserved = 0
        self._parser = None
        self._chunks = []
        self._headers = []
        self._url = b""
        self._completed = None
        self.in_message = False
        self._reading = self._transport = None  # type: ignore[assignment]  # it refers back too

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self.headers_done = False
        self.since = self._server.now
        self._begun += 1
        self._url = b""
        self._headers = []
        self._chunks = []
        self._size = 0
        self._refusal = None
        self._header_count = 0
        self._head_size = 0
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        if self._refusal is not None:
            return
        self._url += url
        if len(self._url) > self._limits.max_url_size:
            self._refuse(refusal(414, self._limits.url_too_long()))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refusal is not None:
            return
        self._headers.append((name.lower(), value))
        self._header_count += 1
        self._head_size += len(name) + len(value) + 4
        limits = self._limits
        if self._header_count > limits.max_header_count:
            self._refuse(refusal(431, limits.too_many_headers()))
        elif self._head_size + len(self._url) > limits.max_header_size:
            self._refuse(refusal(431, limits.head_too_large()))

    def on_headers_complete(self) -> None:
        if self._refusal is not None:
            return
        self.headers_done = True
        self.since = self._server.now
        limit = self._limits.max_request_size
        expect_continue = False
        for name, value in self._headers:
            if name == b"content-length":
                try:
                    check_declared_length(value, limit)
                except InvalidInputError as exc:
                    self._refuse(error_parts(exc))
                    return
                if value.isdigit() and not self._reserve(int(value)):
                    return
            elif name == b"expect" and value.lower() == b"100-continue":
                expect_continue = True
        if expect_continue and self._reading.may_continue():
            self._transport.write(CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._refusal is not None:
            return
        self.since = self._server.now
        self._size += len(body)
        if self._size > self._limits.max_request_size:
            self._refuse(error_parts(body_too_large(self._limits.max_request_size)))
            return
        if self._size > self._reserved and not self._reserve(self._size - self._reserved):  # chunked
            return
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        if self._refusal is not None:
            return  # already handed over by _refuse
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        parser = self._parser
        request = Request(parser.get_method(), self._url, self._headers, body, parser.should_keep_alive(),
                          parser.get_http_version(), None)
        if self._reserved:
            request.reserved = self._reserved
            self._reserved = 0
        self._completed = request
        self._chunks = []
        self._reading.take(request)

    # -- limits --------------------------------------------------------------------------

    def _check_head_bytes(self, size: int) -> None:
        """Bound what the parser buffers of an unfinished head (it holds a header line
        until the line ends): the reads after the one that began it count."""
        if self._begun:
            self._head_bytes = 0
            return
        self._head_bytes += size
        if self._head_bytes > self._limits.max_header_size:
            self._refuse(refusal(431, self._limits.head_too_large()))

    def _reserve(self, size: int) -> bool:
        """Hold ``size`` more body bytes of the server's budget for the request being
        read; False (and a 503) when the budget cannot take them now."""
        budget = self._budget
        if not budget.admits(size):
            self._refuse(refusal(503, self._limits.budget_exhausted(budget.held, size)))
            return False
        budget.held += size
        self._held += size
        self._reserved += size
        return True

    def _give_back(self, size: int) -> None:
        """Return ``size`` held body bytes to the server's budget."""
        self._budget.held -= size
        self._held -= size

    def _refuse(self, answer: Answer) -> None:
        """Hand over the request being read as a refusal (``answer``) without reading the
        rest of it: what follows on the socket cannot be framed."""
        self._refusal = answer
        self._chunks = []
        self.in_message = False
        self._give_back(self._reserved)
        self._reserved = 0
        method = self._parser.get_method() if self.headers_done else b"GET"
        self._reading.take_refusal(Request(method, self._url, self._headers, b"", False, "1.1", answer))
