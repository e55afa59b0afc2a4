"""h1/request_reader.py: the RequestReader (one connection's requests read from its bytes
within the limits, handed to a fake Reading; the server's clock moved by hand) and
RepeatedHead, the pure byte matcher of repeated request heads (which reads teach a head,
and what a read that starts with repeats is cut into)."""

from __future__ import annotations

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st

from types import SimpleNamespace
from typing import Any

from nereid.http.h1.heads import CONTINUE
from nereid.http.h1.limits import ConnectionLimits
from nereid.http.h1.request_reader import MAX_REPEAT_BODY, RepeatedHead, Request, RequestReader
from nereid.network.request_budget import SMALL_REQUEST, RequestBudget

HEAD = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
HEADERS = [(b"host", b"x"), (b"content-length", b"5")]


def learnt() -> RepeatedHead:
    matcher = RepeatedHead.learn(HEAD + b"hello", b"POST", HEADERS, b"hello")
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
    assert RepeatedHead.learn(read, method, headers, body) is None


def test_line_breaks_after_a_body_do_not_teach_a_head_cut_in_the_body() -> None:
    # body "\r\n\r\n" and a stray line break after it: "the read minus the body" would be
    # the head plus two bytes of the body.
    head = HEAD.replace(b"5", b"4")
    assert RepeatedHead.learn(head + b"\r\n\r\n\r\n", b"POST", [(b"content-length", b"4")], b"\r\n\r\n") is None


def test_a_large_body_teaches_nothing() -> None:
    body = bytes(MAX_REPEAT_BODY + 1)
    head = b"POST /i HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
    assert RepeatedHead.learn(head + body, b"POST", [(b"content-length", b"%d" % len(body))], body) is None
    fits = body[:-1]
    head = b"POST /i HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(fits)
    assert RepeatedHead.learn(head + fits, b"POST", [(b"content-length", b"%d" % len(fits))], fits) is not None


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



# -- RequestReader ---------------------------------------------------------------------------


class Taken:
    """The Reading a RequestReader hands its requests to; ``may_continue`` as told."""

    def __init__(self, may_continue: bool = True) -> None:
        self.requests: list[Request] = []
        self.refused: list[Request] = []
        self._may_continue = may_continue

    def take(self, request: Request) -> None:
        self.requests.append(request)

    def take_refusal(self, request: Request) -> None:
        self.refused.append(request)

    def may_continue(self) -> bool:
        return self._may_continue


class Written:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


def reader(*, may_continue: bool = True, budget: int = 1 << 30, **limits: Any) -> tuple[
    RequestReader, Taken, Written, SimpleNamespace
]:
    """A RequestReader on a stand-in server (its limits, body budget and coarse clock ``now``)."""
    server = SimpleNamespace(limits=ConnectionLimits(**limits), body_budget=RequestBudget(budget), now=100.0)
    taken, written = Taken(may_continue), Written()
    return RequestReader(taken, server, written), taken, written, server  # type: ignore[arg-type]


POST = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"


def test_a_request_split_across_reads_is_handed_over_once_whole() -> None:
    read, taken, _, _ = reader()
    for cut in (POST[:7], POST[7:40], POST[40:-2], POST[-2:]):
        assert read.feed(cut) is None  # not one whole request in one read
    [request] = taken.requests
    assert (request.method, request.url, request.body, request.keep_alive, request.http_version) == (
        b"POST", b"/v2/models/m/infer", b"hello", True, "1.1")
    assert request.headers == [(b"host", b"x"), (b"content-length", b"5")]  # names lowercase
    assert not read.in_message


def test_feed_returns_the_request_of_a_read_that_was_exactly_that_request() -> None:
    read, taken, _, _ = reader()
    whole = read.feed(POST)
    assert whole is not None and whole is taken.requests[0]
    assert read.feed(POST + POST) is None  # two requests: nothing to learn a head from
    assert [request.body for request in taken.requests] == [b"hello"] * 3


def test_a_chunked_body_is_joined() -> None:
    read, taken, _, _ = reader()
    read.feed(b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert [request.body for request in taken.requests] == [b"abcde"]


def test_a_body_past_max_request_size_is_refused_with_the_flag_named() -> None:
    read, taken, _, _ = reader(max_request_size=4)
    read.feed(POST)
    assert not taken.requests
    [refused] = taken.refused
    assert refused.refusal is not None and refused.refusal[0] == 400
    assert b"--max-request-size" in refused.refusal[2] and not refused.keep_alive


def test_expect_100_continue_is_answered_only_when_the_connection_may_continue() -> None:
    head = b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    for may_continue, expected in ((True, CONTINUE), (False, b"")):
        read, taken, written, _ = reader(may_continue=may_continue)
        read.feed(head)
        assert written.data == expected
        read.feed(b"hello")
        assert [request.body for request in taken.requests] == [b"hello"]


@pytest.mark.parametrize("sent, timeout, flag", [
    (b"GET / HTTP/1.1\r\nHost:", "header_timeout", b"--http-header-timeout-secs"),
    (POST[:-2], "body_timeout", b"--http-body-timeout-secs"),
])
def test_a_stalled_head_or_body_is_refused_with_408_after_its_timeout(sent: bytes, timeout: str, flag: bytes) -> None:
    read, taken, _, server = reader(**{timeout: 5.0})
    read.feed(sent)
    server.now += 5.0
    assert not read.timed_out(server.now)  # at the limit: still waiting
    server.now += 0.5
    assert read.timed_out(server.now)
    [refused] = taken.refused
    assert refused.refusal is not None and refused.refusal[0] == 408 and flag in refused.refusal[2]


def test_a_large_body_holds_the_budget_until_answered_and_close_gives_back_the_rest() -> None:
    size = SMALL_REQUEST + 1
    head = b"POST /x HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % size
    read, taken, _, server = reader(budget=2 * size)
    read.feed(head + bytes(size))
    read.feed(head + bytes(size))
    assert server.body_budget.held == 2 * size
    read.feed(head)  # a third does not fit: refused at its head
    [refused] = taken.refused
    assert refused.refusal is not None and refused.refusal[0] == 503
    first, second = taken.requests
    read.release(first)
    assert server.body_budget.held == size
    read.close()
    assert server.body_budget.held == 0


def test_a_parse_error_is_raised_to_the_connection() -> None:
    read, _, _, _ = reader()
    with pytest.raises(httptools.HttpParserError):
        read.feed(b"NOT HTTP\r\n\r\n")
