"""Control messages: framing survives any split of the byte stream; an outbox writes once per turn."""

from __future__ import annotations

from hypothesis import given, strategies as st

from nereid.frontends.messages import FrameReader, Kind, Outbox, frame

MESSAGES = [
    (Kind.INFER.value, 1, "add_one", None, ("12", None, None), 123, 0, 40, None),
    (Kind.ANSWER.value, 1, 200, ((b"content-length", b"3"),), -1, 3, b"abc", True),
    (Kind.STOP.value,),
]


@given(st.lists(st.integers(1, 40), max_size=30))
def test_messages_come_out_whole_whatever_the_pieces(cuts: list[int]) -> None:
    stream = frame(*MESSAGES[:2]) + frame(MESSAGES[2])
    reader = FrameReader()
    received = []
    at = 0
    for cut in cuts:
        received += reader.feed(stream[at:at + cut])
        at += cut
    received += reader.feed(stream[at:])
    assert received == MESSAGES


def test_an_outbox_writes_the_messages_of_one_turn_at_once() -> None:
    writes: list[bytes] = []
    scheduled: list[object] = []
    outbox = Outbox(writes.append, scheduled.append)
    for message in MESSAGES:
        outbox.send(message)
    assert len(scheduled) == 1 and writes == []
    outbox.flush()
    assert writes == [frame(*MESSAGES)]
    assert FrameReader().feed(writes[0]) == MESSAGES


def test_what_runs_before_a_flush_joins_its_frame() -> None:
    writes: list[bytes] = []
    scheduled: list[object] = []
    outbox = Outbox(writes.append, scheduled.append)
    outbox.before_flush(lambda: outbox.send(MESSAGES[1]))
    outbox.send(MESSAGES[0])
    assert len(scheduled) == 1
    outbox.flush()
    assert FrameReader().feed(writes[0]) == MESSAGES[:2]
    outbox.flush()
    assert len(writes) == 1
