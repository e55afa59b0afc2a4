"""HeaderBlocks: a connection's HPACK decoder, with a cache for the blocks clients repeat,
and the checks RFC 9113 8.2-8.3 makes of a request's header list; PartialBlock, a block
arriving in CONTINUATION frames.

Clients send the same header block for call after call (grpc-core indexes its headers once,
then refers to them). A block seen before is not decoded again while the decoder's table
is the same as when it was decoded; the table counts its changes (``version``), so any
insertion, a re-insertion of the newest entry included, or a resize empties the cache
(``known``) as the decoding that made it ends, however it ends: what ``known`` holds is
always valid, and the connection looks a block up there before it calls ``decode``.
Only small blocks are kept, and only a few of them: the cache stays a few kilobytes per
connection.
"""

from __future__ import annotations

from typing import Iterable

import hpack
from hpack.table import HeaderTable

from nereid.grpc.h2.frames import ConnectionFailure, ErrorCode
from nereid.grpc.h2.limits import TransportLimits

__all__ = ["HeaderBlocks", "MalformedHeaders", "CompressionFailure", "PartialBlock"]

#: Header blocks remembered per connection, and the largest one remembered.
MAX_CACHED_BLOCKS = 32
MAX_CACHED_BLOCK = 1024

_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"))
_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))


class MalformedHeaders(Exception):
    """A request's header list breaks RFC 9113 8.2-8.3 (a stream error, PROTOCOL_ERROR)."""


class CompressionFailure(Exception):
    """The block cannot be decoded (a connection error, COMPRESSION_ERROR)."""


class PartialBlock:
    """A header block arriving in CONTINUATION frames: its stream, its HEADERS frame's
    flags, the bytes so far and how many CONTINUATION frames brought them."""

    __slots__ = ("stream_id", "flags", "block", "continuations")

    def __init__(self, stream_id: int, flags: int, first: bytes) -> None:
        self.stream_id = stream_id
        self.flags = flags
        self.block = bytearray(first)
        self.continuations = 0

    def extend(self, fragment: bytes, limits: TransportLimits) -> None:
        """One more CONTINUATION's fragment; a block past the header list size or the
        CONTINUATION count a client may use is a connection error (ENHANCE_YOUR_CALM:
        CVE-2024-27316's family)."""
        self.block += fragment
        self.continuations += 1
        if len(self.block) > limits.max_header_list:
            raise ConnectionFailure(ErrorCode.ENHANCE_YOUR_CALM, f"header block over {limits.max_header_list} bytes")
        if self.continuations > limits.max_continuations:
            raise ConnectionFailure(
                ErrorCode.ENHANCE_YOUR_CALM, f"header block in over {limits.max_continuations} CONTINUATION frames"
            )


class _CountingTable(HeaderTable):
    """hpack's dynamic table, counting every change (entries added, size changed)."""

    def __init__(self) -> None:
        super().__init__()
        self.version = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.version += 1
        super().add(name, value)

    @HeaderTable.maxsize.setter  # type: ignore[attr-defined, untyped-decorator]
    def maxsize(self, newmax: int) -> None:
        self.version += 1
        HeaderTable.maxsize.fset(self, newmax)  # type: ignore[attr-defined]


class HeaderBlocks:
    """Decodes a connection's header blocks (request headers and trailers) in order.
    ``known``: the blocks seen before and their header fields, valid as they are (any
    change to the table empties it), so a caller may look a block up there first."""

    __slots__ = ("_decoder", "_table", "known")

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._table = self._decoder.header_table = _CountingTable()
        self.known: dict[bytes, dict[bytes, bytes]] = {}

    def decode(self, block: bytes, *, trailers: bool = False) -> dict[bytes, bytes]:
        """The block's header fields (a name sent twice keeps its last value).
        CompressionFailure when it cannot be decoded, MalformedHeaders when it decodes
        but is no valid request header list (or trailer list)."""
        cached = self.known.get(block)
        if cached is not None:
            return cached
        table = self._table
        version = table.version
        try:
            headers = _checked(self._decoder.decode(block, raw=True), trailers)
        except hpack.HPACKError as exc:
            raise CompressionFailure(f"cannot decode a header block: {exc}") from exc
        finally:
            if table.version != version:  # the blocks seen before may mean something else now
                self.known.clear()
        if table.version == version and len(block) <= MAX_CACHED_BLOCK and len(self.known) < MAX_CACHED_BLOCKS:
            self.known[block] = headers  # a block that changed the table cannot be replayed
        return headers

    @property
    def cached_blocks(self) -> int:
        return len(self.known)


def _checked(fields: Iterable[tuple[bytes | str, bytes | str]], trailers: bool) -> dict[bytes, bytes]:
    headers: dict[bytes, bytes] = {}
    regular_seen = False
    for raw_name, raw_value in fields:
        name, value = bytes(raw_name), bytes(raw_value)  # type: ignore[arg-type]  # raw=True: bytes
        if not name:
            raise MalformedHeaders("an empty header name")
        if name[0] == 0x3A:  # ':'
            if trailers or regular_seen or name not in _REQUEST_PSEUDO:
                raise MalformedHeaders(f"pseudo-header {name.decode('latin-1')!r} not allowed here")
            if name in headers:
                raise MalformedHeaders(f"pseudo-header {name.decode('latin-1')!r} repeated")
        else:
            regular_seen = True
            if name != name.lower():
                raise MalformedHeaders(f"header name {name.decode('latin-1')!r} has uppercase letters")
            if name in _CONNECTION_SPECIFIC:
                raise MalformedHeaders(f"connection-specific header {name.decode('latin-1')!r}")
            if name == b"te" and value != b"trailers":
                raise MalformedHeaders("te header other than 'trailers'")
        headers[name] = value
    if not trailers:
        for required in (b":method", b":scheme", b":path"):
            if not headers.get(required):
                raise MalformedHeaders(f"request without {required.decode()}")
    return headers
