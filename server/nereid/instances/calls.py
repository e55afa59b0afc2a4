"""Calls a process instance's model code makes to its server (custom metrics and BLS):
the process's side. The server's side is ``call_server.py``.

Each worker process has one more channel than its batch slots, the calls channel, on
which the *process* asks and the server answers (the slots go the other way). In the
process, ``ServerCalls`` sends from any model thread and a reader thread hands each reply
to its caller by call id; ``MetricsProxy`` (a ``MetricsSink``) and ``ProcessBls`` (a
``BlsTarget``) are what model code's ``pb_utils`` / ``context`` objects talk to. Values
live in the server's registry, as in Triton: ``value()`` in the process is the server's.

Metric updates (increment, set, observe, close) expect no reply: the process checks
them against the kind it was told when it opened the series (so misuse still raises in
model code), queues them, and sends the queue in one message when it is long, before any
call that waits for a reply, and before each batch's reply (``flush``), so a scrape after
a response sees its updates. Tensors of BLS requests and responses ride in the message
when small, in a shared-memory arena of their own (a ``memfd``, its descriptor sent with
the message) when large.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
from typing import Any, Iterator, Mapping, Sequence, cast

import numpy as np

from nereid.custom_metrics import CLEARED, MetricError, MetricKind, misuse
from nereid.instances.channel import Arena, Channel, ChannelClosed, read_arrays, write_arrays
from nereid.triton_python import pb_utils

__all__ = ["MetricsProxy", "ProcessBls", "ServerCalls", "pack_arrays", "unpack_arrays"]

#: arrays larger than this in all go through an arena of their own, not the message
_INLINE_BYTES = 1 << 20
_QUEUE_LIMIT = 256  # queued metric updates sent at once when the queue reaches this


def pack_arrays(arrays: Mapping[str, np.ndarray]) -> tuple[Any, tuple[int, ...]]:
    """What a message carries of ``arrays``, and the descriptor to send with it."""
    if sum(np.asarray(a).nbytes for a in arrays.values()) <= _INLINE_BYTES:
        return ("inline", dict(arrays)), ()
    arena = Arena(size=1)
    specs = write_arrays(arena, arrays)
    fd = arena.take_fd_to_send()
    arena.buffer.close()
    return ("arena", specs), fd


def unpack_arrays(payload: Any, fds: list[int]) -> dict[str, np.ndarray]:
    """The arrays ``pack_arrays`` packed (copied out of their arena, which is closed)."""
    kind, data = payload
    if kind == "inline":
        return dict(data)
    arena = Arena(fd=fds[0])
    try:
        return read_arrays(arena, data, copy=True)
    finally:
        arena.close()


# -- the process's side -------------------------------------------------------------------


class ServerCalls:
    """The process's end of the calls channel: ``ask`` (one reply), ``ask_stream``
    (replies until ``end``), ``tell`` (none). Thread safe."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, queue.SimpleQueue[tuple[Any, list[int]] | None]] = {}
        self._updates: list[tuple[Any, ...]] = []
        self._closed = False
        threading.Thread(target=self._read, name="server-calls", daemon=True).start()

    def tell(self, update: tuple[Any, ...]) -> None:
        """Queue one update (sent with the next flush)."""
        with self._send_lock:
            self._updates.append(update)
            if len(self._updates) >= _QUEUE_LIMIT:
                self._flush_locked()

    def flush(self) -> None:
        if self._updates:
            with self._send_lock:
                self._flush_locked()

    def _flush_locked(self) -> None:
        if self._updates:
            updates, self._updates = self._updates, []
            self.channel.send((0, "updates", updates))

    def ask(self, kind: str, payload: Any, fds: tuple[int, ...] = ()) -> tuple[Any, list[int]]:
        call_id, replies = self._open(kind, payload, fds)
        reply = replies.get()
        self._waiting.pop(call_id, None)
        if reply is None:
            raise ChannelClosed("the server closed the calls channel")
        return cast(tuple[Any, list[int]], reply)

    def ask_stream(self, kind: str, payload: Any, fds: tuple[int, ...] = ()) -> Iterator[tuple[Any, list[int]]]:
        """The replies of one call until its ``end``; closing the iterator early tells
        the server to cancel the call."""
        call_id, replies = self._open(kind, payload, fds)
        finished = False
        try:
            while (reply := replies.get()) is not None:
                if reply[0][0] == "end":
                    finished = True
                    return
                yield reply
            finished = True
        finally:
            self._waiting.pop(call_id, None)
            if not finished and not self._closed:
                with self._send_lock, contextlib.suppress(ChannelClosed):
                    self.channel.send((call_id, "cancel", None))

    def _open(self, kind: str, payload: Any, fds: tuple[int, ...]) -> tuple[int, queue.SimpleQueue[Any]]:
        call_id = next(self._ids)
        replies: queue.SimpleQueue[tuple[Any, list[int]] | None] = queue.SimpleQueue()
        self._waiting[call_id] = replies
        with self._send_lock:
            self._flush_locked()  # the server applies updates before the call
            try:
                if self._closed:
                    replies.put(None)
                else:
                    self.channel.send((call_id, kind, payload), fds)
            finally:
                for fd in fds:  # sent (the server has its own copy) or not: ours is done
                    os.close(fd)
        return call_id, replies

    def _read(self) -> None:
        while True:
            try:
                (call_id, *message), fds = self.channel.recv()
            except (ChannelClosed, OSError):
                break
            replies = self._waiting.get(call_id)
            if replies is not None:
                replies.put((message, fds))
            else:  # a cancelled stream's late response: its arena is nobody's
                for fd in fds:
                    os.close(fd)
        self._closed = True
        for replies in list(self._waiting.values()):
            replies.put(None)


class MetricsProxy:
    """A MetricsSink in the process: opens and reads ask the server, updates are queued
    (checked here first, so misuse raises in model code as with a thread instance)."""

    def __init__(self, calls: ServerCalls) -> None:
        self._calls = calls
        self._kinds: dict[int, MetricKind] = {}
        self._parents: dict[int, int] = {}  # series handle -> family handle
        self._cleared: set[int] = set()

    def open_family(self, name: str, description: str, kind: MetricKind) -> int:
        handle = int(self._ask("open_family", name, description, kind.value))
        self._kinds[handle] = kind
        return handle

    def open_metric(self, family: int, labels: Mapping[str, str] | None, buckets: Sequence[float] | None) -> int:
        self._check_live(family)
        handle = int(self._ask("open_metric", family, dict(labels) if labels is not None else None,
                               list(buckets) if buckets is not None else None))
        self._kinds[handle] = self._kinds[family]
        self._parents[handle] = family
        return handle

    def close(self, handle: int) -> None:
        self._kinds.pop(handle, None)
        self._parents.pop(handle, None)
        self._cleared.discard(handle)
        for child, parent in list(self._parents.items()):
            if parent == handle:
                self._cleared.add(child)
        self._calls.tell(("close", handle))

    def increment(self, handle: int, value: float) -> None:
        self._update("increment", handle, value)

    def set(self, handle: int, value: float) -> None:
        self._update("set", handle, value)

    def observe(self, handle: int, value: float) -> None:
        self._update("observe", handle, value)

    def value(self, handle: int) -> float:
        self._check_live(handle)
        return float(self._ask("value", handle))

    def _update(self, op: str, handle: int, value: float) -> None:
        if self._allowed(op, handle, value):
            self._calls.tell((op, handle, value))

    def _check_live(self, handle: int) -> None:
        if handle in self._cleared:
            raise MetricError(CLEARED)

    def _allowed(self, op: str, handle: int, value: float) -> bool:
        """True if ``op`` is allowed on the series; else the server is asked to do it,
        and raises the error it words (naming the series)."""
        self._check_live(handle)
        if misuse(self._kinds[handle], op, value) is None:
            return True
        self._ask(op, handle, value)
        return False

    def _ask(self, op: str, *args: Any) -> Any:
        (kind, *rest), _ = self._calls.ask("metric", (op, args))
        if kind == "error":
            raise MetricError(rest[0])
        return rest[0]


class ProcessBls:
    """A BlsTarget in the process: each request goes to the server, which runs it as a
    thread instance's would be run, and its response(s) come back."""

    def __init__(self, calls: ServerCalls) -> None:
        self._calls = calls

    def infer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        payload, fds = _request_payload(request)
        try:
            message, reply_fds = self._calls.ask("infer", payload, fds)
        except ChannelClosed:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("BLS: the server closed the connection"))
        return _response(message, reply_fds)

    def stream(self, request: pb_utils.InferenceRequest) -> Iterator[pb_utils.InferenceResponse]:
        payload, fds = _request_payload(request)
        for message, reply_fds in self._calls.ask_stream("stream", payload, fds):
            yield _response(message, reply_fds)


def _request_payload(request: pb_utils.InferenceRequest) -> tuple[Any, tuple[int, ...]]:
    tensors, fds = pack_arrays({t.name(): t.as_numpy() for t in request.inputs()})
    return (request.model_name(), request.model_version(), tensors, request.requested_output_names(),
            request.parameters(), request.timeout(), request.request_id()), fds


def _response(message: Any, fds: list[int]) -> pb_utils.InferenceResponse:
    if message[0] == "error":
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message[1], message[2]))
    outputs = unpack_arrays(message[1], fds)
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in outputs.items()])
