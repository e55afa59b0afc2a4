"""The answer objects of the requests a worker hands over (link_answers.py), each on a
link that records what it is asked to send: what goes back, as which message, and that
the first answer counts."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np

from nereid.errors import InternalError, NereidError, QueueFullError
from nereid.frontends.link_answers import DecodedAnswer, ForwardedExchange, InferAnswer
from nereid.frontends.messages import Kind
from nereid.frontends.send_windows import SendWindows
from tests.unit.manual_clock import next_turn


class RecordingLink:
    """What a WorkerLink offers its answer objects, recorded."""

    def __init__(self) -> None:
        self.tickets: dict[int, Any] = {}
        self.sent: list[tuple[Any, ...]] = []
        self.errors: list[tuple[int, NereidError]] = []
        self.answers: list[tuple[Any, ...]] = []
        self.outputs: list[tuple[int, int, dict[str, Any]]] = []
        self.finished_ids: list[int] = []
        self.windows = SendWindows(per_stream=4, whole=100)

    def send(self, message: tuple[Any, ...]) -> None:
        self.sent.append(message)

    def send_error(self, id: int, error: NereidError) -> None:
        self.errors.append((id, error))

    def answer(self, id: int, status: int, headers: Any, parts: list[Any], repeat: bool) -> None:
        self.answers.append((id, status, headers, parts, repeat))

    def answered(self, id: int, version: int, outputs: dict[str, Any]) -> None:
        self.outputs.append((id, version, outputs))

    def finished(self, id: int) -> None:
        self.finished_ids.append(id)
        self.windows.forget(id)


SERVING: Any = SimpleNamespace(name="double", version=3)


def test_a_decoded_request_goes_back_with_its_model_version_and_only_its_first_answer_counts() -> None:
    link = RecordingLink()
    answer = DecodedAnswer(link, 7, SERVING)  # type: ignore[arg-type]
    outputs = {"Y": np.ones((1, 2), np.float32)}
    assert not answer.done()
    answer.set_result(outputs)
    answer.set_exception(QueueFullError("Exceeds maximum queue size"))
    answer.cancel()
    assert answer.done()
    assert link.outputs == [(7, 3, outputs)]
    assert (link.sent, link.errors) == ([], [])


def test_a_decoded_requests_error_goes_back_whole_and_a_withdrawn_one_as_done() -> None:
    link = RecordingLink()
    link.tickets = {1: "ticket", 2: "ticket", 3: "ticket"}
    refused = QueueFullError("Exceeds maximum queue size")
    DecodedAnswer(link, 1, SERVING).set_exception(refused)  # type: ignore[arg-type]
    DecodedAnswer(link, 2, SERVING).cancel()  # type: ignore[arg-type]
    DecodedAnswer(link, 3, SERVING).set_exception(ValueError("boom"))  # type: ignore[arg-type]
    assert link.tickets == {}
    assert link.sent == [(Kind.DONE.value, 2)]
    assert [id for id, _ in link.errors] == [1, 3]
    assert link.errors[0][1] is refused
    internal = link.errors[1][1]
    assert isinstance(internal, InternalError)
    assert "model 'double'" in str(internal) and "boom" in str(internal)


def test_a_raw_infer_requests_answer_hands_its_body_to_the_link() -> None:
    link = RecordingLink()
    answer = InferAnswer(link, 4)  # type: ignore[arg-type]
    answer.reply(400, [(b"content-type", b"application/json")], b'{"error":"x"}')
    answer.reply_repeat(((b"content-length", b"2"),), [b"o", b"k"])
    assert link.answers == [
        (4, 400, [(b"content-type", b"application/json")], [b'{"error":"x"}'], False),
        (4, 200, ((b"content-length", b"2"),), [b"o", b"k"], True),
    ]


def test_a_forwarded_request_streams_its_parts_back_and_is_finished_by_its_last() -> None:
    link = RecordingLink()
    streamed = ForwardedExchange(link, 5)  # type: ignore[arg-type]
    streamed.start_response(200, [(b"content-type", b"text/plain")])
    streamed.send_body(b"a", True)
    assert link.finished_ids == []
    streamed.send_body(memoryview(b"b"), False)  # type: ignore[arg-type]
    assert link.finished_ids == [5]
    assert link.sent == [
        (Kind.START.value, 5, 200, [(b"content-type", b"text/plain")]),
        (Kind.BODY.value, 5, b"a", True),
        (Kind.BODY.value, 5, b"b", False),
    ]
    assert all(type(message[2]) is bytes for message in link.sent[1:])  # copies: pickled at the flush
    assert asyncio.run(streamed.drain()) is None

    link = RecordingLink()
    streamed = ForwardedExchange(link, 5)  # type: ignore[arg-type]
    streamed.start_response(200, [])
    streamed.send_body(b"abcde", True)  # past the stream's window (4 bytes here)

    async def held_until_given_back() -> None:
        drained = asyncio.ensure_future(streamed.drain())
        await next_turn()
        assert not drained.done()
        link.windows.returned(5, 5)  # the worker's CREDIT
        await drained

    asyncio.run(held_until_given_back())
    assert link.windows.total == 0

    link = RecordingLink()
    ForwardedExchange(link, 6).reply(404, [], b"gone")  # type: ignore[arg-type]
    ForwardedExchange(link, 8).close()  # type: ignore[arg-type]
    assert link.finished_ids == [6, 8]
    assert link.sent == [(Kind.ANSWER.value, 6, 404, [], -1, 4, b"gone", False), (Kind.CLOSE.value, 8)]
