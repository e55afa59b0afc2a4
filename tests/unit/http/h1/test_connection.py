"""The native engine's Connection on a fake transport (tests/unit/native_harness.py): HTTP/1.1
framing whatever way the bytes are split into reads, and the repeat shortcut (RepeatedHead)
answering byte for byte what the parser alone answers, with ShortcutCounters showing
that the shortcut was taken."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereid.http.app import NereidApp
from nereid.http.h1.server import NativeServer, ShortcutCounters
from nereid.http.h1.connection import LINGER_S, MAX_PIPELINED
from nereid.http.h1.state import ConnectionState
from tests.unit.native_harness import NativeHarness, StubEndpoints, get, infer, responses, split_at, stub_asgi

T = TypeVar("T")


def run(test: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(test())  # type: ignore[arg-type]


def body(tag: bytes | str, size: int = 24) -> bytes:
    """A body of ``size`` bytes starting with ``tag`` (``later``: answered later; ``bad``: 400)."""
    if isinstance(tag, str):
        tag = tag.encode()
    return (tag + b"." * size)[:size]


def chunked_infer(payload: bytes) -> bytes:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (payload[:5], payload[5:]) if part)
    return b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


async def serve(
    reads: Sequence[bytes], *, match_repeats: bool = True, settle_after: Sequence[bool] = (), teach: bytes = b""
) -> tuple[bytes, bool, ShortcutCounters, NativeHarness]:
    """Feed ``teach`` as a read of its own (answered), then ``reads`` (settling after the
    ones ``settle_after`` says), then settle: (bytes written, closed, counters, harness)."""
    harness = NativeHarness(match_repeats=match_repeats)
    if teach:
        harness.feed(teach)
        await harness.settle()
    for index, read in enumerate(reads):
        harness.feed(read)
        if index < len(settle_after) and settle_after[index]:
            await harness.settle()
    await harness.settle()
    counters = harness.server.shortcuts
    return harness.written, harness.transport.closed, ShortcutCounters(counters.repeats, counters.direct_starts), harness


async def same_as_parser(reads: Sequence[bytes], **kwargs: Any) -> tuple[bytes, bool, ShortcutCounters]:
    """Serve ``reads`` with and without the repeat shortcut; both must write the same bytes."""
    written, closed, counters, _ = await serve(reads, **kwargs)
    reference, reference_closed, reference_counters, _ = await serve(reads, match_repeats=False, **kwargs)
    assert reference_counters == ShortcutCounters(0, 0)
    assert (written, closed) == (reference, reference_closed), reads
    return written, closed, counters


def answer_bodies(written: bytes) -> list[bytes]:
    return [answer for status, _, answer in responses(written) if status != 100]


# -- repeats, split anywhere ------------------------------------------------------------------


REPEAT = infer(body("teach"))
R1, R2 = infer(body("one")), infer(body("two"))


@pytest.mark.parametrize("first", ["one", "later-one"])
def test_a_pipelined_pair_of_repeats_split_at_every_byte_answers_as_the_parser_does(first: str) -> None:
    r1 = infer(body(first))
    pair = r1 + R2

    async def check() -> None:
        for cut in range(len(pair) + 1):
            written, closed, counters = await same_as_parser(split_at(pair, [cut]), teach=REPEAT)
            assert not closed
            assert answer_bodies(written)[1:] == [b"m|None|3|None|None|" + body(first), b"m|None|3|None|None|" + body("two")]
            # a repeat is taken when it is whole in a read that starts at a message boundary
            expected = 2 if cut in (0, len(r1), len(pair)) else 1 if cut > len(r1) else 0
            assert counters.repeats == expected, cut
            # started at once unless the first repeat's answer is still to come
            assert counters.direct_starts == (expected if first == "one" else min(expected, 1)), cut

    run(check)


def test_mixed_pipelined_requests_split_at_every_byte_are_answered_in_order() -> None:
    stream = [R1, get(), infer(body("bad")), infer(body("other", 30)), infer(body("later")),
              chunked_infer(b"chunky body"), get(b"/stream"), R2, infer(body("later-2")), R1]
    data = b"".join(stream)

    async def check() -> None:
        for cut in range(len(data) + 1):
            written, closed, counters = await same_as_parser(split_at(data, [cut]), teach=REPEAT)
            assert [status for status, _, _ in responses(written)] == [200, 200, 200, 400, 200, 200, 200, 200, 200, 200, 200]
            if cut in (0, len(data)):
                assert counters.repeats == 1  # the leading repeat; the parser reads the rest of the read
        answers = answer_bodies(written)
        assert answers[1:3] == [b"m|None|3|None|None|" + body("one"), b"GET /v2/health/live ? "]
        assert answers[6:8] == [b"m|None|None|None|None|chunky body", b"one,two,GET /stream ? "]
        assert answers[-1] == b"m|None|3|None|None|" + body("one")

    run(check)


# -- what is and is not a repeat ------------------------------------------------------------


def test_repeats_move_the_counters_and_other_requests_do_not() -> None:
    async def check() -> None:
        harness = NativeHarness()
        harness.feed(get(), infer(body("a", 10)), infer(body("b", 11)), chunked_infer(b"x" * 12), get())
        await harness.settle()
        assert harness.server.shortcuts == ShortcutCounters(0, 0)  # nothing repeated a head
        harness.feed(infer(body("c", 11)))
        await harness.settle()
        assert harness.server.shortcuts == ShortcutCounters(1, 1)  # the head of "b" came again
        harness.feed(infer(body("d", 11)) + infer(body("e", 11)), get())
        await harness.settle()
        assert harness.server.shortcuts == ShortcutCounters(3, 3)
        harness.feed(infer(body("later", 11)) + infer(body("f", 11)))
        await harness.settle()
        assert harness.server.shortcuts == ShortcutCounters(5, 4)  # "f" waited behind "later"
        assert len(responses(harness.written)) == 11

    run(check)


def test_a_body_that_looks_like_a_repeat_is_still_a_body() -> None:
    carrier = infer(REPEAT, url=b"/v2/models/other/infer")  # its body is a whole repeat
    head_end = carrier.index(b"\r\n\r\n") + 4

    async def check() -> None:
        for cut in range(head_end, len(carrier)):  # the body's first read starts with the head
            written, _, counters = await same_as_parser([carrier[:cut], carrier[cut:], get()], teach=REPEAT)
            assert counters == ShortcutCounters(0, 0)
            assert answer_bodies(written)[1:] == [b"other|None|3|None|None|" + REPEAT, b"GET /v2/health/live ? "]

    run(check)


def test_a_read_that_begins_inside_a_body_teaches_no_head() -> None:
    # The read "z" + a learnable request ends a request that began in the read before:
    # "the read minus the body" is not a head seen at a message boundary.
    first = infer(b"xyz", url=b"/v2/models/first/infer")
    taught = infer(body("two"))
    reads = [first[:-1], first[-1:] + taught, b"z" + taught]  # the last: not an HTTP request

    async def check() -> None:
        written, closed, counters = await same_as_parser(reads)
        assert [status for status, _, _ in responses(written)] == [200, 200, 400]
        assert closed and counters == ShortcutCounters(0, 0)

    run(check)


def test_line_breaks_after_a_body_do_not_teach_a_head_cut_in_the_body() -> None:
    # A body of line breaks, then a stray line break in the same read: a head taken as
    # "the read minus the body" would end two bytes into the body, and a pipelined pair of
    # these requests would then be cut in the wrong places.
    crlf_body = infer(b"\r\n\r\n")

    async def check() -> None:
        written, _, counters = await same_as_parser([crlf_body + crlf_body], teach=crlf_body + b"\r\n")
        assert counters == ShortcutCounters(0, 0)
        assert answer_bodies(written) == [b"m|None|3|None|None|\r\n\r\n"] * 3

    run(check)


def test_expect_100_continue_gets_continue_and_is_never_a_repeat() -> None:
    expecting = infer(body("one"), extra=b"Expect: 100-continue\r\n")
    head_end = expecting.index(b"\r\n\r\n") + 4

    async def check() -> None:
        harness = NativeHarness()
        for _ in range(3):
            harness.feed(expecting[:head_end])
            assert harness.written.endswith(b"HTTP/1.1 100 Continue\r\n\r\n")
            harness.feed(expecting[head_end:])
            await harness.settle()
        harness.feed(expecting)  # whole in one read: still not learnt
        harness.feed(expecting)
        await harness.settle()
        assert [status for status, _, _ in responses(harness.written)] == [100, 200] * 5
        assert harness.server.shortcuts == ShortcutCounters(0, 0)
        assert harness.connection._repeats is None

    run(check)


def test_a_repeat_head_asking_to_close_is_a_different_head_and_closes() -> None:
    closing = infer(body("close"), extra=b"Connection: close\r\n")

    async def check() -> None:
        written, closed, counters = await same_as_parser([R1, closing, R2], teach=REPEAT)
        assert closed
        assert counters == ShortcutCounters(1, 1)  # R1 only: R2 came after the close
        answers = responses(written)
        assert [headers.get("connection") for _, headers, _ in answers] == [None, None, "close"]
        # pipelined behind a request answered later, the repeat after the close is dropped
        written, closed, counters = await same_as_parser([infer(body("later")) + closing + R2], teach=REPEAT)
        assert closed and len(responses(written)) == 3
        assert counters.repeats == 1  # "later" was; R2 was not taken (nothing after a close is)

    run(check)


def test_a_close_request_teaches_no_head() -> None:
    async def check() -> None:
        for request in (infer(body("later"), extra=b"Connection: close\r\n"), infer(body("later"), version=b"1.0")):
            harness = NativeHarness()
            harness.feed(request)  # its answer comes later: the connection is still open
            assert harness.connection._repeats is None
            await harness.settle()
            assert harness.transport.closed

    run(check)


def test_a_repeat_while_the_server_closes_says_connection_close() -> None:
    async def check() -> None:
        harness = NativeHarness()
        harness.feed(REPEAT)
        await harness.settle()
        harness.server.closing = True
        harness.feed(R1)
        await harness.settle()
        last = responses(harness.written)[-1]
        assert last[1]["connection"] == "close" and last[2].endswith(body("one"))
        assert harness.transport.closed
        assert harness.server.shortcuts == ShortcutCounters(1, 1)

    run(check)


def test_a_repeat_started_directly_is_withdrawn_when_the_client_leaves() -> None:
    async def check() -> None:
        harness = NativeHarness()
        harness.feed(REPEAT)
        await harness.settle()
        harness.feed(infer(body("later")))
        assert harness.server.shortcuts == ShortcutCounters(1, 1)
        [(ticket, _)] = harness.endpoints.pending
        harness.lose()
        assert ticket.withdrawn
        await harness.settle()
        assert len(responses(harness.written)) == 1

    run(check)


def test_repeats_queued_past_the_pipelining_limit_pause_reading_and_keep_their_order() -> None:
    bodies = [body("later-%d" % index) for index in range(MAX_PIPELINED + 6)]
    data = b"".join(infer(payload) for payload in bodies)

    async def check() -> None:
        harness = NativeHarness()
        harness.feed(REPEAT)
        await harness.settle()
        harness.feed(data, get())
        assert not harness.transport.reading  # queued past the limit
        assert harness.server.shortcuts == ShortcutCounters(len(bodies), 1)
        await harness.settle()
        assert harness.transport.reading
        assert answer_bodies(harness.written)[1:] == [b"m|None|3|None|None|" + payload for payload in bodies] + [
            b"GET /v2/health/live ? "]
        await same_as_parser([data, get()], teach=REPEAT)

    run(check)


def test_a_repeat_with_a_versioned_url_and_headers_keeps_them() -> None:
    extra = b"Accept-Encoding: gzip\r\nContent-Encoding: identity\r\n"
    url = b"/v2/models/m/versions/7/infer"

    async def check() -> None:
        written, _, counters = await same_as_parser([infer(body("b"), url=url, extra=extra)] * 2,
                                                    teach=infer(body("a"), url=url, extra=extra))
        assert counters == ShortcutCounters(2, 2)
        assert answer_bodies(written)[1:] == [b"m|7|3|identity|gzip|" + body("b")] * 2

    run(check)


def test_a_refused_body_after_repeats_is_answered_and_the_connection_closed() -> None:
    async def check() -> None:
        harness = NativeHarness(max_request_size=200)
        harness.feed(REPEAT)
        await harness.settle()
        harness.feed(R1 + infer(bytes(300)) + R2)
        await harness.settle()
        statuses = [status for status, _, _ in responses(harness.written)]
        assert statuses == [200, 200, 400] and harness.transport.closed

    run(check)


# -- any requests, any splits -----------------------------------------------------------------


#: Requests a random stream is made of: repeats of one head (answered at once, later, or
#: with an error), the same URL with other heads, ASGI requests, chunked bodies.
KINDS = {
    "repeat": lambda n: infer(body("r%d" % n)),
    "repeat-later": lambda n: infer(body("later%d" % n)),
    "repeat-bad": lambda n: infer(body("bad%d" % n)),
    "other-length": lambda n: infer(body("o%d" % n, 30)),
    "other-header": lambda n: infer(body("h%d" % n), extra=b"X-Trace: %d\r\n" % n),
    "get": lambda n: get(b"/v2/models/m/ready"),
    "stream": lambda n: get(b"/stream"),
    "asgi-post": lambda n: b"POST /v2/x?y=%d HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc" % n,
    "chunked": lambda n: chunked_infer(b"chunk %d" % n),
    "line-breaks": lambda n: infer(b"\r\n\r\n"),
    "line-breaks-and-one-more": lambda n: infer(b"\r\n\r\n") + b"\r\n",
}


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], list[bool], bytes]:
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=12))
    data = b"".join(KINDS[kind](index) for index, kind in enumerate(kinds))
    cuts = draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=8))
    reads = split_at(data, cuts)
    settle_after = draw(st.lists(st.booleans(), min_size=len(reads), max_size=len(reads)))
    teach = draw(st.sampled_from([b"", KINDS["repeat"](99), KINDS["other-length"](99), KINDS["line-breaks-and-one-more"](99)]))
    return reads, settle_after, teach


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_any_requests_split_anywhere_are_answered_as_the_parser_alone_answers(
    stream: tuple[list[bytes], list[bool], bytes],
) -> None:
    reads, settle_after, teach = stream
    written, closed, counters = run(lambda: same_as_parser(reads, settle_after=settle_after, teach=teach))
    assert not closed
    assert counters.direct_starts <= counters.repeats
    statuses = [status for status, _, _ in responses(written)]
    assert len(statuses) == len(b"".join(reads).split(b"HTTP/1.1\r\n")) - 1 + bool(teach)


def test_the_shortcut_is_taken_on_reads_of_whole_repeats() -> None:
    # What the random streams above cannot promise: one request per read, all repeats.
    async def check() -> None:
        _, _, counters = await same_as_parser([infer(body("r%d" % n)) for n in range(10)], teach=REPEAT)
        assert counters == ShortcutCounters(10, 10)

    run(check)


def test_over_a_socket_repeats_written_one_at_a_time_take_the_shortcut() -> None:
    # A real transport: each request is written once the answer to the one before came,
    # so each is one read from a message boundary.
    async def check() -> None:
        app = NereidApp(starlette=stub_asgi, endpoints=StubEndpoints())  # type: ignore[arg-type]
        server = NativeServer(app, graceful_timeout=1.0)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # connections wait in the backlog until the server accepts
        shutdown = asyncio.Event()
        serving = asyncio.create_task(server.serve(shutdown, fd=listener.fileno()))
        try:
            reader, writer = await asyncio.open_connection(*listener.getsockname())
            for n in range(10):
                writer.write(infer(body("r%d" % n)))
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                ((status, _, answer),) = responses(head + await reader.readexactly(length))
                assert status == 200 and answer.endswith(body("r%d" % n))
            assert server.shortcuts == ShortcutCounters(9, 9)  # all but the first, which taught the head
            writer.close()
            await writer.wait_closed()
        finally:
            shutdown.set()
            await serving
            listener.close()

    run(check)


# -- the connection's life: ConnectionState and its TRANSITIONS -------------------------------


def test_a_connection_stays_open_while_it_answers_keep_alive_requests() -> None:
    async def scenario() -> None:
        harness = NativeHarness()
        assert harness.connection.state is ConnectionState.OPEN
        harness.feed(REPEAT, get())
        await harness.settle()
        assert [status for status, _, _ in responses(harness.written)] == [200, 200]
        assert harness.connection.state is ConnectionState.OPEN and not harness.transport.closed

    run(scenario)


def test_connection_close_lingers_after_the_answer_then_closes_after_linger_s() -> None:
    async def scenario() -> None:
        harness = NativeHarness(eof_capable=True)
        harness.feed(get(extra=b"Connection: close\r\n"))
        await harness.settle()
        assert harness.connection.state is ConnectionState.LINGERING
        assert harness.transport.eof_written and not harness.transport.closed
        harness.feed(b"what the client still sends is dropped")
        assert len(responses(harness.written)) == 1
        harness.advance(LINGER_S + 1)
        assert harness.connection.state is ConnectionState.CLOSED and harness.transport.closed

    run(scenario)


def test_a_transport_without_half_close_closes_at_once() -> None:
    async def scenario() -> None:
        harness = NativeHarness(eof_capable=False)
        harness.feed(get(extra=b"Connection: close\r\n"))
        await harness.settle()
        assert harness.connection.state is ConnectionState.CLOSED and harness.transport.closed

    run(scenario)


def test_a_parse_error_behind_a_waiting_request_answers_both_then_closes() -> None:
    async def scenario() -> None:
        harness = NativeHarness(eof_capable=True)
        harness.feed(infer(body("later")), b"NOT HTTP AT ALL\r\n\r\n")
        assert harness.connection.state is ConnectionState.LAST_REQUEST
        await harness.settle()
        assert [status for status, _, _ in responses(harness.written)] == [200, 400]
        assert harness.connection.state is ConnectionState.LINGERING

    run(scenario)


def test_a_refused_request_stops_reading_and_closes_after_its_answer() -> None:
    async def scenario() -> None:
        harness = NativeHarness(max_url_size=64)
        harness.feed(infer(body("later")), get(b"/" + b"x" * 100), get())
        assert harness.connection.state is ConnectionState.LAST_REQUEST
        await harness.settle()
        assert [status for status, _, _ in responses(harness.written)] == [200, 414]  # the GET after it: not read
        assert harness.connection.state is ConnectionState.CLOSED

    run(scenario)


@pytest.mark.parametrize("eof_capable", [True, False], ids=["from lingering", "from open"])
def test_the_client_going_away_closes_the_connection(eof_capable: bool) -> None:
    async def scenario() -> None:
        harness = NativeHarness(eof_capable=eof_capable)
        if eof_capable:
            harness.feed(get(extra=b"Connection: close\r\n"))
            await harness.settle()
            assert harness.connection.state is ConnectionState.LINGERING
        harness.lose()
        assert harness.connection.state is ConnectionState.CLOSED
        harness.lose()  # a second connection_lost is harmless
        assert harness.connection.state is ConnectionState.CLOSED

    run(scenario)


def test_a_connection_past_max_connections_is_refused_and_closed_at_once() -> None:
    async def scenario() -> None:
        harness = NativeHarness(max_connections=0)
        assert [status for status, _, _ in responses(harness.written)] == [503]
        assert harness.connection.state is ConnectionState.CLOSED and harness.transport.closed

    run(scenario)
