"""RequestReader: one native connection's requests, read from its bytes within the limits.

Owns httptools' parser of one connection and everything about reading a request: the
head limits (URL 414; header count and head size 431, an unfinished head's bytes
included), the body size limit (--max-request-size), the server's body budget (503),
``Expect: 100-continue``, and the head and body timers. Complete requests, and the
refusals of requests that broke a limit, go to its ``Reading`` (the Connection); it
knows nothing about answering them. Limits and texts: limits.py.

``RepeatedHead`` recognises a request that repeats a connection's last infer request head
byte for byte, so the connection can take it without the parser. Clients repeat the same
head: perf_analyzer and tritonclient send the same URL, headers and Content-Length with
every request of a given shape. The same bytes read from a message boundary parse the
same way, so a request that starts with a learnt ``head`` is that head followed by
``length`` body bytes, and the parser (whose Python callbacks cost more than the rest of
reading the request) need not see it. Pure bytes in, bytes out: what a repeat means
(which request it repeats, which route it takes) is the connection's business.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import httptools

from nereid.errors import InvalidInputError
from nereid.http._asgi import body_too_large, check_declared_length, error_parts
from nereid.http.endpoints import InferHeaders
from nereid.http.errors import error_json
from nereid.http.h1.heads import CONTINUE

if TYPE_CHECKING:
    from nereid.http.h1.server import NativeServer

__all__ = ["MAX_REPEAT_BODY", "Reading", "RepeatedHead", "Request", "RequestReader", "ResponseParts", "refusal"]

_JSON = (b"content-type", b"application/json")

#: A complete response: status, headers (content-length added when written), body.
ResponseParts = tuple[int, list[tuple[bytes, bytes]], bytes]


def refusal(status: int, message: str) -> ResponseParts:
    """Triton's ``{"error": ...}`` answer with ``status``."""
    return status, [_JSON], error_json(message)


@dataclass(slots=True)
class Request:
    """One complete request waiting for (or getting) its answer."""

    method: bytes
    url: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    keep_alive: bool
    http_version: str
    #: answered with this instead of being served (a limit, an unparsable request).
    refusal: ResponseParts | None
    #: what the infer path reads of ``headers`` (made when first needed, by
    #: ``parsed_infer_headers``; repeats share the one of the request they repeat).
    infer_headers: InferHeaders | None = None
    #: body bytes this request holds of the server's RequestBudget until it is answered.
    reserved: int = 0

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
        self._refusal: ResponseParts | None = None
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
            self._refuse(refusal(408, limits.told("header_timeout")))
            return True
        if self.headers_done and now - self.since > limits.body_timeout:
            self._refuse(refusal(408, limits.told("body_timeout")))
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
            self._refuse(refusal(414, self._limits.told("max_url_size")))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refusal is not None:
            return
        self._headers.append((name.lower(), value))
        self._header_count += 1
        self._head_size += len(name) + len(value) + 4
        limits = self._limits
        if self._header_count > limits.max_header_count:
            self._refuse(refusal(431, limits.told("max_header_count")))
        elif self._head_size + len(self._url) > limits.max_header_size:
            self._refuse(refusal(431, limits.told("max_header_size")))

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
            self._refuse(refusal(431, self._limits.told("max_header_size")))

    def _reserve(self, size: int) -> bool:
        """Hold ``size`` more body bytes of the server's budget for the request being
        read; False (and a 503) when the budget cannot take them now."""
        budget = self._budget
        if not budget.admits(size):
            self._refuse(refusal(503, budget.refusal(size)))
            return False
        budget.held += size
        self._held += size
        self._reserved += size
        return True

    def _give_back(self, size: int) -> None:
        """Return ``size`` held body bytes to the server's budget."""
        self._budget.held -= size
        self._held -= size

    def _refuse(self, answer: ResponseParts) -> None:
        """Hand over the request being read as a refusal (``answer``) without reading the
        rest of it: what follows on the socket cannot be framed."""
        self._refusal = answer
        self._chunks = []
        self.in_message = False
        self._give_back(self._reserved)
        self._reserved = 0
        method = self._parser.get_method() if self.headers_done else b"GET"
        self._reading.take_refusal(Request(method, self._url, self._headers, b"", False, "1.1", answer))


#: Bodies up to this size may teach a head (a larger body is rarely repeated at its length).
MAX_REPEAT_BODY = 64 << 10

#: Headers whose request is never repeated: its framing is not "head, then length bytes".
_NOT_REPEATABLE = (b"transfer-encoding", b"expect", b"upgrade")


class RepeatedHead:
    """A learnt request head, to recognise the requests that repeat it byte for byte
    without the parser: ``head`` (request line and headers, up to and including the
    empty line) and the ``length`` of the body that follows it. ``size`` is one whole
    repeat, head and body."""

    __slots__ = ("head", "length", "size")

    def __init__(self, head: bytes, length: int) -> None:
        self.head = head
        self.length = length
        self.size = len(head) + length

    @classmethod
    def learn(
        cls, read: bytes, method: bytes, headers: Iterable[tuple[bytes, bytes]], body: bytes
    ) -> RepeatedHead | None:
        """The repeated head of the one request ``read`` held, when ``read`` (one read, starting
        at a message boundary) was exactly that complete request, as the parser gave it
        (``method``; ``headers`` with lowercase names; its ``body``), and its repeats can be
        matched: a POST with one Content-Length that its body fills (at most
        MAX_REPEAT_BODY bytes), no Transfer-Encoding, Expect or Upgrade. None otherwise."""
        if method != b"POST" or len(body) > MAX_REPEAT_BODY:
            return None
        length = None
        for name, value in headers:
            if name == b"content-length":
                if length is not None or not value.isdigit():
                    return None
                length = int(value)
            elif name in _NOT_REPEATABLE:
                return None
        if length != len(body) or not read.endswith(body):
            return None
        head = read[: len(read) - length]
        # A head ends at its first empty line. If the read held more than this request's
        # head and body (line breaks after the body, which the parser skips), "the read
        # minus the body" runs past that line: then nothing is learnt.
        if head.find(b"\r\n\r\n") != len(head) - 4:
            return None
        return cls(head, length)

    def match(self, data: bytes) -> list[bytes]:
        """The bodies of the complete repeats ``data`` (bytes from a message boundary)
        begins with, in order; what follows them (``data[len(bodies) * size:]``) is not a
        repeat, or not a complete one yet. Empty: ``data`` does not begin with a complete
        repeat (another request, or more bytes needed)."""
        head = self.head
        if not data.startswith(head):
            return []
        size = self.size
        end = len(data)
        if end == size:  # the usual read: exactly one repeat
            return [data[len(head):]]
        bodies = []
        start = len(head)
        pos = 0
        while end >= pos + size and data.startswith(head, pos):
            bodies.append(data[pos + start : pos + size])
            pos += size
        return bodies

    def __repr__(self) -> str:
        return f"RepeatedHead(head={self.head!r}, length={self.length})"
