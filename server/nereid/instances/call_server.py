"""Calls a process instance's model code makes to its server (custom metrics and BLS):
the server's side. The process's side, and the messages, are ``calls.py``'s.

``CallServer`` reads one process's calls channel on the event loop: metric operations go
straight to the instance's view of the registry, queued updates too (``drain`` before a
batch's reply applies those sent before it), BLS requests run as tasks through the
server's BLS target (``nereid.local.ServerBls``) and their responses go back, tensors
packed as ``calls.pack_arrays`` packs them. When the process ends its BLS tasks are
cancelled and the metric handles it held closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
from typing import Any, AsyncIterator, Protocol, Sequence, cast

from nereid.context import ModelContext
from nereid.custom_metrics import MetricError, MetricKind, MetricsSink
from nereid.instances.calls import pack_arrays, unpack_arrays
from nereid.instances.channel import Channel, ChannelClosed
from nereid.triton_python import pb_utils
from nereid.triton_python.bls import BlsTarget

__all__ = ["AsyncBls", "CallServer"]

_log = logging.getLogger("nereid")


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
    ``bls``: the server's BLS target (None: BLS not available). (A request to the
    calling model itself when it has one instance is refused in the process, by the
    model's adapter: ``bls.NotToItself``.)"""

    def __init__(self, channel: Channel, model: str, instance: str, metrics: MetricsSink | None,
                 bls: AsyncBls | None) -> None:
        self.channel = channel
        self.model = model
        self.instance = instance
        self.metrics = metrics
        self.bls = bls
        self._handles: set[int] = set()  # opened by this process and not closed: closed at stop
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False

    @classmethod
    def of_instance(cls, channel: Channel, context: ModelContext, bls: BlsTarget | None,
                    loop: asyncio.AbstractEventLoop) -> CallServer:
        """Serving, on ``loop``, the calls of one process of the instance ``context`` names:
        its metrics to ``context.metrics``, its BLS requests to ``bls`` (when it can be
        awaited: ``nereid.local.ServerBls``)."""
        async_bls = cast(AsyncBls, bls) if hasattr(bls, "ainfer") else None
        server = cls(channel, context.model_name, context.instance_name, context.metrics, async_bls)
        server.start(loop)
        return server

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self.channel.sock.fileno(), self.drain)

    @property
    def holds_metrics(self) -> bool:
        """Whether the process holds metric handles (only then can updates be waiting)."""
        return bool(self._handles)

    def drain(self) -> None:
        """Handle every message waiting (a batch's reply calls this first, when the
        process holds metrics: the updates its model code made before answering are
        applied before the answer is seen)."""
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
            if kind == "stream":
                self._send(call_id, ("end",))
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

    def _refusal(self) -> pb_utils.InferenceResponse | None:
        if self.bls is None:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("BLS is not available here (no server)"))
        return None

    async def _infer(self, call_id: int, request: pb_utils.InferenceRequest) -> None:
        response = self._refusal()
        if response is None:
            assert self.bls is not None
            try:
                response = await self.bls.ainfer(request)
            except Exception as exc:  # e.g. the server is closing: the caller gets an error, never silence
                response = _failed(exc)
        self._send_response(call_id, response)

    async def _stream(self, call_id: int, request: pb_utils.InferenceRequest) -> None:
        refused = self._refusal()
        try:
            if refused is not None:
                self._send_response(call_id, refused)
            else:
                assert self.bls is not None
                async for response in self.bls.astream(request):
                    self._send_response(call_id, response)
        except Exception as exc:
            self._send_response(call_id, _failed(exc))
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


def _failed(exc: Exception) -> pb_utils.InferenceResponse:
    message = exc.message() if isinstance(exc, pb_utils.TritonModelException) else f"{type(exc).__name__}: {exc}"
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"BLS request failed: {message}"))
