"""RepeatMatcher, the pure byte matcher of repeated request heads: which reads teach a
head, and what a read that starts with repeats is cut into."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereid.http.h1.repeated_heads import MAX_REPEAT_BODY, RepeatMatcher

HEAD = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
HEADERS = [(b"host", b"x"), (b"content-length", b"5")]


def learnt() -> RepeatMatcher:
    matcher = RepeatMatcher.learn(HEAD + b"hello", b"POST", HEADERS, b"hello")
    assert matcher is not None
    return matcher


def test_a_read_of_exactly_one_content_length_post_teaches_its_head() -> None:
    matcher = learnt()
    assert (matcher.head, matcher.length, matcher.size) == (HEAD, 5, len(HEAD) + 5)


@pytest.mark.parametrize("read, method, headers, body", [
    pytest.param(HEAD + b"hello", b"PUT", HEADERS, b"hello", id="not a POST"),
    pytest.param(HEAD + b"hello", b"POST", [*HEADERS, (b"content-length", b"5")], b"hello", id="two lengths"),
    pytest.param(HEAD + b"hello", b"POST", [(b"content-length", b"+5")], b"hello", id="length not digits"),
    pytest.param(HEAD + b"hello", b"POST", [(b"content-length", b"6")], b"hello", id="length not the body's"),
    pytest.param(HEAD + b"hello", b"POST", [], b"hello", id="no length"),
    pytest.param(HEAD + b"hello", b"POST", [*HEADERS, (b"transfer-encoding", b"chunked")], b"hello", id="chunked"),
    pytest.param(HEAD + b"hello", b"POST", [*HEADERS, (b"expect", b"100-continue")], b"hello", id="expect"),
    pytest.param(HEAD + b"hello", b"POST", [*HEADERS, (b"upgrade", b"h2c")], b"hello", id="upgrade"),
    pytest.param(HEAD + b"hello\r\n", b"POST", HEADERS, b"hello", id="bytes after the body"),
    pytest.param(HEAD + b"hello" + b"\r\n", b"POST", [(b"content-length", b"5")], b"lo\r\n", id="read not ending in body"),
    pytest.param(b"\r\n\r\n" + HEAD + b"hello", b"POST", HEADERS, b"hello", id="empty line before the head's end"),
])
def test_reads_that_teach_nothing(read: bytes, method: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    assert RepeatMatcher.learn(read, method, headers, body) is None


def test_line_breaks_after_a_body_do_not_teach_a_head_cut_in_the_body() -> None:
    # body "\r\n\r\n" and a stray line break after it: "the read minus the body" would be
    # the head plus two bytes of the body.
    head = HEAD.replace(b"5", b"4")
    assert RepeatMatcher.learn(head + b"\r\n\r\n\r\n", b"POST", [(b"content-length", b"4")], b"\r\n\r\n") is None


def test_a_large_body_teaches_nothing() -> None:
    body = bytes(MAX_REPEAT_BODY + 1)
    head = b"POST /i HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
    assert RepeatMatcher.learn(head + body, b"POST", [(b"content-length", b"%d" % len(body))], body) is None
    fits = body[:-1]
    head = b"POST /i HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(fits)
    assert RepeatMatcher.learn(head + fits, b"POST", [(b"content-length", b"%d" % len(fits))], fits) is not None


@pytest.mark.parametrize("data, bodies", [
    (HEAD + b"abcde", [b"abcde"]),
    (HEAD + b"abcde" + HEAD + b"fghij", [b"abcde", b"fghij"]),
    (HEAD + b"abcde" + HEAD + b"fgh", [b"abcde"]),  # the second is not complete yet
    (HEAD + b"abcde" + b"GET / HTTP/1.1\r\n\r\n", [b"abcde"]),
    (HEAD + b"abc", []),  # more bytes needed
    (HEAD[:-1], []),
    (b"GET / HTTP/1.1\r\n\r\n" + HEAD + b"abcde", []),  # a repeat, but not at the start
    (HEAD.replace(b"Host: x", b"Host: y") + b"abcde", []),
    (b"", []),
])
def test_match_takes_the_complete_repeats_at_the_start(data: bytes, bodies: list[bytes]) -> None:
    assert learnt().match(data) == bodies


@given(st.lists(st.binary(min_size=5, max_size=5), max_size=6), st.binary(max_size=80))
def test_match_cuts_exactly_the_leading_repeats(bodies: list[bytes], tail: bytes) -> None:
    matcher = learnt()
    data = b"".join(HEAD + body for body in bodies) + tail
    got = matcher.match(data)
    expected = list(bodies)
    rest = tail
    while rest.startswith(HEAD) and len(rest) >= matcher.size:  # the tail may hold repeats too
        expected.append(rest[len(HEAD) : matcher.size])
        rest = rest[matcher.size :]
    assert got == expected
    assert data[len(got) * matcher.size :] == rest
