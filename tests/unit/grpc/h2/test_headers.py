"""HeaderBlocks (grpc/headers.py): the decoder cache answers exactly as a fresh hpack
decoder, whatever the blocks do to the dynamic table (re-insertions of the newest entry
included), and request header lists are checked as RFC 9113 8.2-8.3 asks."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereid.grpc.h2.frames import hpack_int, literal
from nereid.grpc.h2.headers import MAX_CACHED_BLOCK, CompressionFailure, HeaderBlocks, MalformedHeaders

NAMES = [b"x-a", b"x-b", b"grpc-timeout"]
#: values large enough that three entries fill hpack's default 4096-byte table
VALUES = [b"1", b"v" * 1300, b"w" * 1300, b"u" * 1300]


def indexed(index: int) -> bytes:
    return hpack_int(index, 7, 0x80)


def inserted(name: bytes, value: bytes) -> bytes:
    """Literal with incremental indexing, new name (RFC 7541 6.2.1)."""
    return b"\x40" + hpack_int(len(name), 7, 0) + name + hpack_int(len(value), 7, 0) + value


def plain(name: bytes, value: bytes) -> bytes:
    """Literal without indexing, new name."""
    return literal(name, value)


def reference_dict(decoder: hpack.Decoder, block: bytes) -> dict[bytes, bytes]:
    return {bytes(name): bytes(value) for name, value in decoder.decode(block, raw=True)}


def test_a_reinsertion_of_the_newest_entry_invalidates_the_cache() -> None:
    """A full table, then the newest entry inserted again: the oldest is evicted and every
    index past 62 moves, while the table's length and newest entry stay the same."""
    blocks = HeaderBlocks(16 << 10)
    reference = hpack.Decoder()
    a, b, c = (NAMES[0], VALUES[1]), (NAMES[1], VALUES[2]), (NAMES[2], VALUES[3])
    fill = inserted(*c) + inserted(*b) + inserted(*a)  # table: a (62), b (63), c (64)
    assert blocks.decode(fill, trailers=True) == reference_dict(reference, fill)
    second = indexed(63)
    assert blocks.decode(second, trailers=True) == reference_dict(reference, second) == {b[0]: b[1]}
    assert blocks.cached_blocks == 1
    again = inserted(*a)  # table: a, a, b (c evicted)
    assert blocks.decode(again, trailers=True) == reference_dict(reference, again)
    assert blocks.decode(second, trailers=True) == reference_dict(reference, second) == {a[0]: a[1]}


#: one block each: insert (name, value); refer to the k-th dynamic entry; insert the newest
#: entry again; resize the table; a literal that leaves the table alone
blocks_steps = st.lists(
    st.tuples(
        st.sampled_from(["insert"] * 3 + ["refer"] * 3 + ["again"] * 2 + ["resize", "plain"]),
        st.integers(0, 2), st.integers(1, 3),
    ),
    min_size=1, max_size=30,
)


@settings(max_examples=1000, deadline=None)
@given(blocks_steps)
def test_the_cache_answers_as_a_fresh_decoder_whatever_the_table_does(steps: list[tuple[str, int, int]]) -> None:
    blocks = HeaderBlocks(16 << 10)
    reference = hpack.Decoder()
    for kind, first, second in steps:
        entries = reference.header_table.dynamic_entries
        if kind == "insert":
            block = inserted(NAMES[first], VALUES[second])
        elif kind == "refer" and entries:
            block = indexed(62 + first % len(entries))
        elif kind == "again" and entries:
            block = inserted(*entries[0])
        elif kind == "resize":
            block = hpack_int((256, 1024, 4096)[first], 5, 0x20) + plain(b"x-c", b"z")
        else:
            block = plain(b"x-c", b"z")
        assert blocks.decode(block, trailers=True) == reference_dict(reference, block)


def test_only_small_blocks_are_remembered() -> None:
    blocks = HeaderBlocks(16 << 10)
    large = plain(b"x-a", b"v" * MAX_CACHED_BLOCK)
    blocks.decode(large, trailers=True)
    assert blocks.cached_blocks == 0
    blocks.decode(plain(b"x-a", b"v"), trailers=True)
    assert blocks.cached_blocks == 1


REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/p"), (b":authority", b"x")]


@pytest.mark.parametrize("fields, reason", [
    (REQUEST + [(b"X-Upper", b"1")], "uppercase"),
    (REQUEST + [(b"connection", b"keep-alive")], "connection-specific"),
    (REQUEST + [(b"te", b"gzip")], "te header"),
    (REQUEST[:2], "without :path"),
    ([(b"x-a", b"1")] + REQUEST, "not allowed here"),
    (REQUEST + [(b":status", b"200")], "not allowed here"),
    (REQUEST + [(b":path", b"/q")], "repeated"),
])
def test_malformed_requests_are_named(fields: list[tuple[bytes, bytes]], reason: str) -> None:
    block = hpack.Encoder().encode(fields)
    with pytest.raises(MalformedHeaders, match=reason):
        HeaderBlocks(16 << 10).decode(block)


def test_trailers_carry_no_pseudo_headers_and_bad_blocks_are_compression_failures() -> None:
    with pytest.raises(MalformedHeaders):
        HeaderBlocks(16 << 10).decode(hpack.Encoder().encode([(b":path", b"/")]), trailers=True)
    with pytest.raises(CompressionFailure):
        HeaderBlocks(16 << 10).decode(indexed(70))  # no such entry
    with pytest.raises(CompressionFailure):  # a decoded list over the advertised size
        HeaderBlocks(1024).decode(hpack.Encoder().encode(REQUEST + [(b"x-a", b"v" * 2000)]))


def test_a_block_that_changes_the_table_and_then_fails_its_checks_empties_the_known_blocks() -> None:
    """``known`` is read by the connection without calling ``decode``: it must never hold
    a block the table no longer means the same way, whatever ended the decoding."""
    blocks = HeaderBlocks(16 << 10)
    reference = hpack.Decoder()
    first = inserted(NAMES[0], VALUES[1])
    assert blocks.decode(first, trailers=True) == reference_dict(reference, first)
    refer = indexed(62)
    assert blocks.decode(refer, trailers=True) == reference_dict(reference, refer)
    assert refer in blocks.known
    bad = inserted(NAMES[1], VALUES[2]) + plain(b"X-Upper", b"1")  # inserts, then breaks RFC 9113 8.2
    with pytest.raises(MalformedHeaders):
        blocks.decode(bad, trailers=True)
    reference_dict(reference, bad)
    assert blocks.known == {}
    assert blocks.decode(refer, trailers=True) == reference_dict(reference, refer) == {NAMES[1]: VALUES[2]}
