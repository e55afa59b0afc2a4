"""Calls a process instance's model code makes to its server: custom metrics and BLS.

Each worker process has one more channel than its batch slots, the calls channel, on
which the *process* asks and the server answers (the slots go the other way). In the
process, ``ServerCalls`` sends from any model thread and a reader thread hands each reply
to its caller by call id; ``MetricsProxy`` (a ``MetricsSink``) and ``ProcessBls`` (a
``BlsTarget``) are what model code's ``pb_utils`` / ``context`` objects talk to. In the
server, ``CallServer`` reads the channel on the event loop: metric operations go straight
to the instance's view of the registry (values live there, as in Triton, so ``value()``
in the process is the server's), BLS requests run as tasks through the server's BLS
target and their responses go back; when the process ends its tasks are cancelled and
its metric handles closed.

Metric updates (increment, set, observe, close) expect no reply: the process checks
them against the kind it was told when it opened the series (so misuse still raises in
model code), queues them, and sends the queue in one message when it is long, before any
call that waits for a reply, and before each batch's reply (``flush``), so a scrape after
a response sees its updates. Tensors of BLS requests and responses ride in the message
when small, in a shared-memory arena of their own (a ``memfd``, its descriptor sent with
the message) when large.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import select
import threading
from typing import Any, AsyncIterator, Iterator, Mapping, Protocol, Sequence, cast

import numpy as np

from nereid.custom_metrics import CLEARED, MetricError, MetricKind, MetricsSink, misuse
from nereid.instances.channel import Arena, Channel, ChannelClosed, read_arrays, write_arrays
from nereid.triton_python import pb_utils
from nereid.triton_python.bls import BlsTarget

__all__ = ["CallServer", "MetricsProxy", "ProcessBls", "ServerCalls", "pack_arrays", "unpack_arrays"]

_log = logging.getLogger("nereid")

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
                with self._send_lock:
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
        self._check("value", handle, 0.0)
        return float(self._ask("value", handle))

    def _update(self, op: str, handle: int, value: float) -> None:
        self._check(op, handle, value)
        self._calls.tell((op, handle, value))

    def _check_live(self, handle: int) -> None:
        if handle in self._cleared:
            raise MetricError(CLEARED)

    def _check(self, op: str, handle: int, value: float) -> None:
        self._check_live(handle)
        problem = misuse(self._kinds[handle], op, value)
        if problem is not None:  # worded by the server, which names the series
            self._ask(op, handle, value)

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


# -- the server's side --------------------------------------------------------------------


def _readable(channel: Channel) -> bool:
    """Whether a message waits (recv_fds waits despite MSG_DONTWAIT on a blocking socket)."""
    return bool(select.select((channel.sock,), (), (), 0)[0])


class AsyncBls(BlsTarget, Protocol):
    """The server's BLS target, awaited on its loop (``nereid.local.ServerBls``)."""

    async def ainfer(self, request: pb_utils.InferenceRequest, /) -> pb_utils.InferenceResponse:
        """Run ``request`` on the named model; its response (an error response on failure)."""

    def astream(self, request: pb_utils.InferenceRequest, /) -> AsyncIterator[pb_utils.InferenceResponse]:
        """Run ``request`` on the named (decoupled) model; its responses as they come."""


class CallServer:
    """The server's end of one process's calls channel, read on the event loop
    (``start`` / ``drain`` / ``stop``). ``metrics``: the instance's view of the registry;
    ``bls``: the server's BLS target (None: BLS not available); ``alone``: the model has
    no other instance, so a BLS request to it from its own instance is refused (it would
    wait for itself)."""

    def __init__(self, channel: Channel, model: str, instance: str, metrics: MetricsSink | None,
                 bls: AsyncBls | None, alone: bool) -> None:
        self.channel = channel
        self.model = model
        self.instance = instance
        self.metrics = metrics
        self.bls = bls
        self.alone = alone
        self._handles: set[int] = set()  # opened by this process and not closed: closed at stop
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self.channel.sock.fileno(), self.drain)

    def drain(self) -> None:
        """Handle every message waiting (a batch's reply calls this first: the updates
        its model code made before answering are applied before the answer is seen)."""
        while not self._stopped and _readable(self.channel):
            try:
                (call_id, kind, payload), fds = self.channel.recv_ready()
            except BlockingIOError:
                return
            except (ChannelClosed, OSError):
                self.stop()
                return
            if kind == "updates":
                self._updates(payload)
            elif kind == "metric":
                self._send(call_id, self._metric(*payload))
            elif kind == "cancel":
                task = self._tasks.pop(call_id, None)
                if task is not None:
                    task.cancel()
            elif kind in ("infer", "stream"):
                self._start_call(call_id, kind, payload, fds)

    def stop(self) -> None:
        """The process ended (or the instance closes): cancel its BLS calls, close the
        metric handles it held."""
        if self._stopped:
            return
        self._stopped = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.channel.sock.fileno())
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        if self.metrics is not None:
            for handle in sorted(self._handles, reverse=True):  # series (made later) before their families
                self.metrics.close(handle)
        self._handles.clear()

    # -- metrics -----------------------------------------------------------------------

    def _metric(self, op: str, args: Sequence[Any]) -> tuple[Any, ...]:
        metrics = self.metrics
        if metrics is None:
            return ("error", f'model "{self.model}": custom metrics are not available here')
        try:
            if op == "open_family":
                name, description, kind = args
                handle = metrics.open_family(name, description, MetricKind(kind))
            elif op == "open_metric":
                handle = metrics.open_metric(*args)
            elif op == "value":
                return ("ok", metrics.value(args[0]))
            else:  # increment, set, observe the process found wrong: the registry words why
                getattr(metrics, op)(*args)
                return ("ok", None)
        except MetricError as exc:
            return ("error", exc.message)
        self._handles.add(handle)
        return ("ok", handle)

    def _updates(self, updates: list[tuple[Any, ...]]) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        for op, handle, *value in updates:
            try:
                if op == "close":
                    self._handles.discard(handle)
                    metrics.close(handle)
                else:
                    getattr(metrics, op)(handle, *value)
            except MetricError as exc:  # checked in the process: only a race with a close gets here
                _log.warning("model '%s' instance %s: metric %s: %s", self.model, self.instance, op, exc.message)

    # -- BLS ---------------------------------------------------------------------------

    def _start_call(self, call_id: int, kind: str, payload: Any, fds: list[int]) -> None:
        try:
            request = self._request(payload, fds)
        except (OSError, ValueError, TypeError) as exc:
            self._send(call_id, ("error", f"BLS request could not be read: {exc}", pb_utils.TritonError.INTERNAL))
            self._send(call_id, ("end",)) if kind == "stream" else None
            return
        assert self._loop is not None
        run = self._infer if kind == "infer" else self._stream
        task = self._loop.create_task(run(call_id, request))
        self._tasks[call_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(call_id, None))

    def _request(self, payload: Any, fds: list[int]) -> pb_utils.InferenceRequest:
        model, version, tensors, wanted, parameters, timeout, request_id = payload
        inputs = unpack_arrays(tensors, fds)
        return pb_utils.InferenceRequest(
            model_name=model, inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
            requested_output_names=wanted, request_id=request_id, timeout=timeout, model_version=version,
            parameters=parameters,
        )

    def _refusal(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse | None:
        if self.bls is None:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("BLS is not available here (no server)"))
        if self.alone and request.model_name() == self.model:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f'BLS request from model "{self.model}" instance {self.instance} to its own model: "{self.model}" '
                "has no other instance to run it (it would wait for itself); give it a second instance",
                pb_utils.TritonError.UNAVAILABLE,
            ))
        return None

    async def _infer(self, call_id: int, request: pb_utils.InferenceRequest) -> None:
        response = self._refusal(request)
        if response is None:
            assert self.bls is not None
            response = await self.bls.ainfer(request)
        self._send_response(call_id, response)

    async def _stream(self, call_id: int, request: pb_utils.InferenceRequest) -> None:
        refused = self._refusal(request)
        if refused is not None:
            self._send_response(call_id, refused)
        else:
            assert self.bls is not None
            async for response in self.bls.astream(request):
                self._send_response(call_id, response)
        self._send(call_id, ("end",))

    def _send_response(self, call_id: int, response: pb_utils.InferenceResponse) -> None:
        error = response.error()
        if error is not None:
            self._send(call_id, ("error", error.message(), error.code()))
            return
        payload, fds = pack_arrays({t.name(): t.as_numpy() for t in response.output_tensors()})
        self._send(call_id, ("response", payload), fds)
        for fd in fds:
            os.close(fd)

    def _send(self, call_id: int, message: tuple[Any, ...], fds: tuple[int, ...] = ()) -> None:
        if self._stopped:
            return
        try:
            self.channel.send((call_id, *message), fds)
        except (ChannelClosed, OSError):  # the process is gone: stop() follows from the reader
            pass
