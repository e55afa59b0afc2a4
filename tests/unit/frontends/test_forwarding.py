"""The worker's end of the link: what it sends for an infer request, and what it does
with the answers (a fake transport in place of the socket pair, a recording responder)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np

from nereid.config.load import parse_model_config
from nereid.frontends.arena import Arena
from nereid.frontends.directory_sync import DirectoryCopy, SharedGeneration
from nereid.frontends.forwarding import MainLink
from nereid.frontends.messages import FrameReader, Kind, frame
from nereid.http.infer import InferHeaders
from tests.unit.manual_clock import next_turn


CONFIG = parse_model_config(
    {
        "name": "acc",
        "max_batch_size": 4,
        "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [1]}],
    },
    source="config.toml",
    folder_name="acc",
)


class FakeTransport:
    def __init__(self) -> None:
        self.reader = FrameReader()
        self.sent: list[tuple[Any, ...]] = []

    def write(self, data: bytes) -> None:
        self.sent += self.reader.feed(data)


class Recorder:
    def __init__(self) -> None:
        self.replies: list[tuple[Any, ...]] = []

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.replies.append(("reply", status, headers, body))

    def reply_repeat(self, headers: tuple[tuple[bytes, bytes], ...], parts: list[Any]) -> None:
        self.replies.append(("repeat", headers, b"".join(parts)))


def run(test: Any) -> None:
    async def main() -> None:
        arena = Arena.create(1 << 16)
        generation = SharedGeneration.create()
        link = MainLink(arena, DirectoryCopy(generation))
        transport = FakeTransport()
        link.connection_made(transport)
        try:
            await test(link, transport, arena)
        finally:
            arena.close()
            generation.close()

    asyncio.run(main())


def test_a_raw_infer_body_goes_into_the_arena_and_its_answer_comes_back() -> None:
    async def test(link: MainLink, transport: FakeTransport, arena: Arena) -> None:
        responder = Recorder()
        body = b'{"inputs": []}'
        link.start_infer("m", None, InferHeaders([]), body, 123, responder)
        await next_turn()  # the outbox writes once per loop turn
        (message,) = transport.sent
        kind, id, name, version, _, received_ns, offset, length, inline = message
        assert (kind, name, version, received_ns, length, inline) == (Kind.INFER, "m", None, 123, len(body), None)
        assert bytes(arena.requests[offset:offset + length]) == body
        arena.answers[0:5] = b"hello"
        link.data_received(frame((Kind.ANSWER.value, id, 200, [(b"content-type", b"text/plain")], 0, 5, None, False)))
        assert responder.replies == [("reply", 200, [(b"content-type", b"text/plain")], b"hello")]
        assert link.ring.blocks == 0  # the body's block is free again
        await next_turn()
        assert transport.sent[-1] == (Kind.FREED, [0])  # and the main process may reuse the answer's

    run(test)


def test_a_withdrawn_request_is_not_answered_and_its_block_waits_for_done() -> None:
    async def test(link: MainLink, transport: FakeTransport, arena: Arena) -> None:
        responder = Recorder()
        ticket = link.start_infer("m", None, InferHeaders([]), b"x" * 100, 1, responder)
        assert ticket is not None
        ticket.withdraw()
        await next_turn()
        assert transport.sent[-1] == (Kind.WITHDRAW, ticket.id)
        assert link.ring.blocks == 1  # the main process may still be reading it
        link.data_received(frame((Kind.DONE.value, ticket.id)))
        assert link.ring.blocks == 0 and responder.replies == []

    run(test)


def test_when_the_main_process_goes_away_requests_in_flight_get_503() -> None:
    async def test(link: MainLink, transport: FakeTransport, arena: Arena) -> None:
        responder = Recorder()
        link.start_infer("m", None, InferHeaders([]), b"{}", 1, responder)
        link.connection_lost(None)
        assert [reply[1] for reply in responder.replies] == [503]
        assert link.stopped.is_set()
        later = Recorder()
        assert link.start_infer("m", None, InferHeaders([]), b"{}", 1, later) is None
        assert b"main process is gone" in later.replies[0][3]

    run(test)


def test_one_results_message_answers_each_decoded_request_with_its_own_rows() -> None:
    async def test(link: MainLink, transport: FakeTransport, arena: Arena) -> None:
        link.data_received(frame((Kind.MODEL.value, "acc", 1, 1, CONFIG, {})))
        responders = [Recorder(), Recorder()]
        for value, responder in zip((3, 4), responders):
            body = json.dumps({"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}]})
            link.start_infer("acc", None, InferHeaders([]), body.encode(), 1, responder)
        await next_turn()
        ids = [message[1] for message in transport.sent if message[0] == Kind.DECODED]
        assert len(ids) == 2 and link.ring.blocks == 2
        joined = np.ndarray((2, 1), np.int32, buffer=arena.answers, offset=128)
        joined[:] = [[30], [40]]
        layout = (("OUTPUT", 0, "<i4", (2, 1)),)
        link.data_received(frame((Kind.RESULTS.value, 1, 128, layout, ((ids[0], 1), (ids[1], 1)))))
        bodies = [json.loads(responder.replies[0][-1]) for responder in responders]
        assert [body["outputs"][0]["data"] for body in bodies] == [[30], [40]]
        assert link.ring.blocks == 0
        await next_turn()
        assert transport.sent[-1] == (Kind.FREED, [128])  # one block for both answers

    run(test)


def test_a_directory_message_updates_the_workers_copy_of_the_models() -> None:
    from nereid.models.directory import ModelFacts, VersionFacts

    async def test(link: MainLink, transport: FakeTransport, arena: Arena) -> None:
        assert link.directory.current() is None  # nothing yet: every lookup is forwarded
        facts = ModelFacts({1: VersionFacts(1, CONFIG, {"name": "acc"}, None, True)}, frozenset({1}), "version 1 is READY",
                           {1: "it is READY"})
        link.data_received(frame((Kind.DIRECTORY.value, 0, True, True, {"acc": facts}, True)))
        current = link.directory.current()
        assert current is not None and current.get("acc").config_json == {"name": "acc"} and current.is_ready()
        link.data_received(frame((Kind.DIRECTORY.value, 0, True, False, {"acc": None}, False)))
        current = link.directory.current()
        assert current is not None and current.models == {} and not current.is_ready()

    run(test)


def test_a_forwarded_responses_parts_are_given_back_once_the_engine_took_them() -> None:
    async def test(link: MainLink, transport: FakeTransport, arena: Arena) -> None:
        from nereid.frontends.forwarding import _relay

        call = link.forward({"type": "http", "path": "/v2/models/m/generate_stream"}, b"")
        taken: list[dict[str, Any]] = []
        engine_drained = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:  # the engine's writer: waits while the client does not read
            taken.append(message)
            if message["type"] == "http.response.body":
                await engine_drained.wait()

        relaying = asyncio.ensure_future(_relay(call, asyncio.get_running_loop().create_future(), send, link))
        link.data_received(frame((Kind.START.value, call.id, 200, []), (Kind.BODY.value, call.id, b"part", True),
                                 (Kind.BODY.value, call.id, b"more", True)))
        for _ in range(3):
            await next_turn()
        assert [message for message in transport.sent if message[0] == Kind.CREDIT] == []
        engine_drained.set()
        link.data_received(frame((Kind.BODY.value, call.id, b"end", False)))
        await relaying
        await next_turn()
        # each part given back once taken, the last one not (the response ended: nothing is owed)
        assert [message for message in transport.sent if message[0] == Kind.CREDIT] == [(Kind.CREDIT, ((call.id, 4),))] * 2
        assert [message.get("body") for message in taken] == [None, b"part", b"more", b"end"]

    run(test)
