"""The native connection under hostile or careless clients: head limits, timers driven by
the server's clock (no sleeps), back-pressure, the body budget, the connection limit and
memory let go on close. Fake transport: no socket (native_harness)."""

from __future__ import annotations

import asyncio
import functools
import gc
import weakref
from collections.abc import Awaitable, Callable

from nereid.http.h1.connection import Connection

from tests.unit.native_harness import FakeTransport, NativeHarness, get, infer, responses


def _on_a_loop(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())  # type: ignore[arg-type]

    return run


def _error(harness: NativeHarness) -> tuple[int, str]:
    [(status, _, body)] = responses(harness.written)
    return status, body.decode()


@_on_a_loop
async def test_a_url_past_the_limit_gets_414_and_the_connection_closes() -> None:
    harness = NativeHarness(max_url_size=100)
    harness.feed(b"GET /" + b"a" * 60, b"b" * 60 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    await harness.settle()
    status, text = _error(harness)
    assert status == 414 and "--http-max-url-size" in text and "100 bytes" in text
    assert harness.transport.closed


@_on_a_loop
async def test_a_url_at_the_limit_is_served() -> None:
    harness = NativeHarness(max_url_size=100)
    harness.feed(get(b"/" + b"a" * 99))
    await harness.settle()
    [(status, _, _)] = responses(harness.written)
    assert status == 200 and not harness.transport.closed


@_on_a_loop
async def test_too_many_header_lines_get_431() -> None:
    harness = NativeHarness(max_header_count=5)
    harness.feed(b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(6)) + b"\r\n")
    await harness.settle()
    status, text = _error(harness)
    assert status == 431 and "--http-max-header-count" in text
    assert harness.transport.closed


@_on_a_loop
async def test_a_head_too_large_gets_431_before_its_line_ends() -> None:
    """The parser holds a header line until it ends: the reads of an unfinished head are
    counted, so a never-ending header is refused once it passes the limit."""
    harness = NativeHarness(max_header_size=1000)
    harness.feed(b"GET / HTTP/1.1\r\nX-Big: ")
    for _ in range(5):
        harness.feed(b"y" * 300)
    await harness.settle()
    status, text = _error(harness)
    assert status == 431 and "--http-max-header-size" in text
    assert harness.transport.closed


@_on_a_loop
async def test_a_head_that_does_not_complete_in_time_gets_408() -> None:
    harness = NativeHarness(header_timeout=30.0)
    harness.feed(b"GET /v2/health/live HTTP/1.1\r\nHo")
    harness.advance(20)
    harness.feed(b"st: x\r\n")  # progress does not restart the head's timer
    harness.advance(9)
    assert harness.written == b"" and not harness.transport.closed
    harness.advance(2)
    await harness.settle()
    status, text = _error(harness)
    assert status == 408 and "--http-header-timeout-secs" in text
    assert harness.transport.closed


@_on_a_loop
async def test_a_body_that_stops_arriving_gets_408_and_progress_keeps_it_alive() -> None:
    harness = NativeHarness(body_timeout=10.0)
    request = infer(b"x" * 100)
    harness.feed(request[:-60])
    for _ in range(3):
        harness.advance(8)
        harness.feed(b"x" * 10)  # a trickle: each read restarts the body's timer
    assert harness.written == b""
    harness.advance(11)
    await harness.settle()
    status, text = _error(harness)
    assert status == 408 and "--http-body-timeout-secs" in text
    assert harness.transport.closed


@_on_a_loop
async def test_an_idle_keep_alive_connection_closes_after_its_timeout() -> None:
    harness = NativeHarness(keepalive_timeout=5.0)
    harness.feed(get())
    await harness.settle()
    harness.advance(4)
    assert not harness.transport.closed
    harness.feed(get())  # a request restarts the idle time once answered
    await harness.settle()
    harness.advance(4)
    assert not harness.transport.closed
    harness.advance(2)
    assert harness.transport.closed
    assert [status for status, _, _ in responses(harness.written)] == [200, 200]


@_on_a_loop
async def test_a_request_in_flight_is_never_timed_out() -> None:
    harness = NativeHarness(keepalive_timeout=5.0, header_timeout=5.0, body_timeout=5.0)
    harness.feed(infer(b"later"))
    await harness.settle(release=False)
    harness.advance(60)
    assert not harness.transport.closed
    assert harness.endpoints.release()
    [(status, _, _)] = responses(harness.written)
    assert status == 200


@_on_a_loop
async def test_an_answer_the_client_does_not_read_stops_further_requests_until_it_does() -> None:
    harness = NativeHarness()
    harness.connection.pause_writing()  # the transport's buffer passed its high-water mark
    harness.feed(*(infer(b"a%d" % i) for i in range(40)))
    await harness.settle()
    assert harness.written == b""  # nothing more is answered into a full buffer
    assert not harness.transport.reading  # and reading stopped once MAX_PIPELINED waited
    harness.connection.resume_writing()
    await harness.settle()
    assert len(responses(harness.written)) == 40


@_on_a_loop
async def test_a_client_that_never_reads_is_disconnected_after_the_body_timeout() -> None:
    harness = NativeHarness(body_timeout=10.0)
    harness.connection.pause_writing()
    harness.advance(9)
    assert not harness.transport.closed
    harness.advance(2)
    assert harness.transport.aborted


@_on_a_loop
async def test_the_body_budget_refuses_a_large_request_past_it_with_503_and_is_given_back() -> None:
    harness = NativeHarness(max_body_bytes_in_flight=200_000)
    budget = harness.server.body_budget
    first = infer(b"x" * 150_000)
    harness.feed(first[:-1000])  # its whole declared length is held while it arrives
    assert budget.held == 150_000
    other = Connection(harness.server)
    other_transport = FakeTransport()
    other.connection_made(other_transport)
    other.data_received(infer(b"y" * 100_000))
    await harness.settle()
    [(status, _, body)] = responses(bytes(other_transport.written))
    assert status == 503 and b"--max-request-bytes-in-flight" in body and b"150000 bytes" in body
    assert other_transport.closed
    small = Connection(harness.server)  # small bodies always pass
    small_transport = FakeTransport()
    small.connection_made(small_transport)
    small.data_received(infer(b"z" * 1000))
    await harness.settle()
    assert [status for status, _, _ in responses(bytes(small_transport.written))] == [200]
    harness.feed(first[-1000:])
    await harness.settle()
    assert [status for status, _, _ in responses(harness.written)] == [200]
    assert budget.held == 0


@_on_a_loop
async def test_a_connection_lost_mid_body_gives_its_budget_back() -> None:
    harness = NativeHarness()
    harness.feed(infer(b"x" * 500_000)[:-10])
    assert harness.server.body_budget.held == 500_000
    harness.lose()
    assert harness.server.body_budget.held == 0


@_on_a_loop
async def test_connections_past_the_limit_get_503_and_are_counted() -> None:
    harness = NativeHarness(max_connections=1)
    transport = FakeTransport()
    Connection(harness.server).connection_made(transport)
    [(status, headers, body)] = responses(bytes(transport.written))
    assert status == 503 and headers["connection"] == "close" and b"--http-max-connections" in body
    assert transport.closed
    assert harness.server.refused_connections == 1
    assert len(harness.server.connections) == 1


@_on_a_loop
async def test_a_closed_connection_is_freed_without_the_cyclic_collector() -> None:
    harness = NativeHarness()
    connection = Connection(harness.server)
    connection.connection_made(FakeTransport())
    connection.data_received(infer(b"x" * 100_000)[:-10])  # a body half read
    alive = weakref.ref(connection)
    gc.disable()
    try:
        connection.connection_lost(None)
        del connection
        assert alive() is None
    finally:
        gc.enable()


@_on_a_loop
async def test_a_refusal_lingers_reading_what_the_client_still_sends_then_closes() -> None:
    """On a transport that can half-close, the answer is followed by our FIN and the
    client's remaining bytes are read and dropped (closing with them unread would make
    the kernel reset the connection, losing the answer); the connection closes when the
    client does, or after LINGER_S."""
    from nereid.http.h1.connection import LINGER_S

    harness = NativeHarness(max_url_size=100, eof_capable=True)
    harness.feed(b"GET /" + b"a" * 200)
    await harness.settle()
    status, _ = _error(harness)
    assert status == 414
    assert harness.transport.eof_written and not harness.transport.closed
    harness.feed(b"a" * 5000, b" HTTP/1.1\r\n\r\n")  # still arriving: read and dropped
    assert len(responses(harness.written)) == 1
    harness.advance(LINGER_S - 0.5)
    assert not harness.transport.closed
    harness.advance(1.0)
    assert harness.transport.closed

    other = NativeHarness(max_url_size=100, eof_capable=True)
    other.feed(b"GET /" + b"a" * 200)
    await other.settle()
    assert other.connection.eof_received() is False  # the client closed its side: the transport closes
