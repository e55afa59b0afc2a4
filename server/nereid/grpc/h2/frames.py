"""HTTP/2's wire vocabulary as gRPC uses it: frame types, flags, settings, error codes
(RFC 9113 sections 6, 6.5.2 and 7), and the few byte strings nereid writes itself (frame
headers, HPACK literals that leave the peer's decoder table alone, gRPC's message prefix
and percent-encoded grpc-message), and the two failures a frame can cause (RFC 9113 5.4):
``ConnectionFailure`` (GOAWAY, the connection closes) and ``StreamFailure`` (RST_STREAM)."""

from __future__ import annotations

import enum
import struct

__all__ = [
    "PREFACE", "FrameType", "Flag", "Setting", "ErrorCode", "FRAME_HEADER", "MESSAGE_PREFIX", "U32", "SETTING",
    "DEFAULT_WINDOW", "MAX_WINDOW", "MIN_MAX_FRAME", "MAX_MAX_FRAME", "frame", "data_frame_header", "hpack_int", "literal",
    "percent_encoded", "RESPONSE_HEAD", "TRAILERS_OK", "ConnectionFailure", "StreamFailure", "unpad",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class FrameType(enum.IntEnum):
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


class Flag(enum.IntFlag):
    END_STREAM = 0x1
    ACK = 0x1
    END_HEADERS = 0x4
    PADDED = 0x8
    PRIORITY = 0x20


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 1
    ENABLE_PUSH = 2
    MAX_CONCURRENT_STREAMS = 3
    INITIAL_WINDOW_SIZE = 4
    MAX_FRAME_SIZE = 5
    MAX_HEADER_LIST_SIZE = 6


class ErrorCode(enum.IntEnum):
    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    SETTINGS_TIMEOUT = 4
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9
    ENHANCE_YOUR_CALM = 11


#: A frame header: the 24-bit length as 8 + 16 bits, type, flags, stream id.
FRAME_HEADER = struct.Struct(">BHBBL")
#: gRPC's message prefix: compressed flag, length.
MESSAGE_PREFIX = struct.Struct(">BL")
U32 = struct.Struct(">L")
SETTING = struct.Struct(">HL")

DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1
MIN_MAX_FRAME = 16384
MAX_MAX_FRAME = 2**24 - 1


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return FRAME_HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def data_frame_header(size: int, stream_id: int, flags: int = 0) -> bytes:
    """The 9 bytes before ``size`` bytes of DATA (any size a frame may have: 24 bits)."""
    return FRAME_HEADER.pack(size >> 16, size & 0xFFFF, FrameType.DATA, flags, stream_id)


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's integer (RFC 7541 5.1) with ``first``'s high bits set in its first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field "without indexing, new name", no Huffman: nothing in the peer's
    decoder table depends on it."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


#: ``:status 200`` (static index 8) and ``content-type: application/grpc``.
RESPONSE_HEAD = b"\x88" + literal(b"content-type", b"application/grpc")
TRAILERS_OK = literal(b"grpc-status", b"0")


def percent_encoded(message: str) -> bytes:
    """gRPC's grpc-message encoding: UTF-8, with bytes outside printable ASCII and '%' escaped."""
    data = message.encode("utf-8", "replace")
    if all(0x20 <= byte <= 0x7E and byte != 0x25 for byte in data):
        return data
    return b"".join(
        bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte for byte in data
    )


class ConnectionFailure(Exception):
    """A connection error (RFC 9113 5.4.1): the client is told GOAWAY ``code`` with
    ``reason``, and the connection closes."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class StreamFailure(Exception):
    """A stream error (RFC 9113 5.4.2): the stream is reset with ``code``; the
    connection goes on."""

    def __init__(self, stream_id: int, code: int) -> None:
        super().__init__(stream_id, code)
        self.stream_id = stream_id
        self.code = code


def unpad(payload: bytes) -> bytes:
    """A PADDED frame's payload without its pad length and padding (RFC 9113 6.1)."""
    if not payload:
        raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1:len(payload) - pad]
