"""RepeatMatcher: recognises a request that repeats a connection's last infer request head
byte for byte, so the native connection can take it without its HTTP parser.

Clients repeat the same head: perf_analyzer and tritonclient send the same URL, headers and
Content-Length with every request of a given shape. The same bytes read from a message
boundary parse the same way, so a request that starts with a learnt ``head`` is that head
followed by ``length`` body bytes, and the parser (whose Python callbacks cost more than the
rest of reading the request) need not see it.

Pure bytes in, bytes out: no transport, no event loop, no endpoints. What a repeat means
(which request it repeats, which route it takes) is the connection's business.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MAX_REPEAT_BODY", "RepeatMatcher"]

#: Bodies up to this size may teach a head (a larger body is rarely repeated at its length).
MAX_REPEAT_BODY = 64 << 10

#: Headers whose request is never repeated: its framing is not "head, then length bytes".
_NOT_REPEATABLE = (b"transfer-encoding", b"expect", b"upgrade")


class RepeatMatcher:
    """A learnt request head: ``head`` (request line and headers, up to and including the
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
    ) -> RepeatMatcher | None:
        """The matcher of the one request ``read`` held, when ``read`` (one read, starting
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
        return f"RepeatMatcher(head={self.head!r}, length={self.length})"
