"""WorkerLink: the main process's end of one front-end worker's link.

Takes the requests the worker decoded (DECODED) into their model's queue, the run of
them one frame brings in one call, their inputs views on the arena: as bundles where the
model takes them (``ServingModel.submit_bundle``: the requests of one template queued as
one entry of all their rows, up to its largest batch, answered at once and counted one
by one), else each its own entry (``ServingModel.submit_many``: one wake-up of the
batcher); their outputs go back joined, one arena block and one RESULTS message per loop
turn, model version and kind of outputs. The worker's INFER messages (raw bodies) go into the main
app's infer flow (``Endpoints.start_infer``, the same call the native engine makes, so
the request joins the same queue and batches as every other) and its ASGI messages into
the main app (``AsgiExchange``, as the native engine runs any other request); those
answers go back as ANSWER messages, their bodies written into the arena's answer half.
Each request is answered through its own answer object (link_answers.py). Counts the
requests that came through the worker.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, TypeVar

from nereid.errors import InternalError, NereidError
from nereid.frontends.arena import Arena, Ring
from nereid.frontends.layout import read_arrays, read_blocks, read_rows
from nereid.frontends.link_results import TurnResults
from nereid.frontends.link_answers import BundleAnswer, DecodedAnswer, ForwardedExchange, InferAnswer
from nereid.frontends.messages import FrameReader, Kind, Outbox
from nereid.frontends.send_windows import SendWindows
from nereid.http._asgi import error_parts
from nereid.http.app import NereidApp
from nereid.http.h1.asgi_bridge import AsgiExchange
from nereid.http.infer import InferHeaders
from nereid.inference import InferRequest
from nereid.models.serving import ServingModel

__all__ = ["WorkerLink"]

_log = logging.getLogger("nereid")

_Submitted = TypeVar("_Submitted")

_INFER, _ASGI, _WITHDRAW, _FREED = Kind.INFER.value, Kind.ASGI.value, Kind.WITHDRAW.value, Kind.FREED.value
_CREDIT, _ARMED = Kind.CREDIT.value, Kind.ARMED.value
_ANSWER, _DONE = Kind.ANSWER.value, Kind.DONE.value
_DECODED, _MODEL, _FORGET, _RETRY = Kind.DECODED.value, Kind.MODEL.value, Kind.FORGET.value, Kind.RETRY.value


class WorkerLink(asyncio.Protocol):
    """One worker's link, in the main process: ``app`` answers what the worker hands
    over, ``state`` is the app's lifespan state, ``arena`` the region they share.
    ``closed`` resolves when the worker's end goes away (it stopped or died); what it
    held is then withdrawn."""

    def __init__(self, app: NereidApp, arena: Arena, state: dict[str, Any], index: int) -> None:
        self.app = app
        self.arena = arena
        self.index = index
        #: requests that came through this worker (infer and any other), and of them the
        #: infer requests it decoded itself
        self.requests = 0
        self.decoded = 0
        self.ring = Ring(len(arena.answers))
        self._state = state
        self._reader = FrameReader()
        self._outbox: Outbox | None = None
        self._transport: Any = None
        self.tickets: dict[int, Any] = {}
        self._manager = app.endpoints.infer_endpoint.manager
        #: model versions announced to the worker: by token, and each name's token
        self._announced: dict[int, ServingModel] = {}
        self._token_of: dict[str, int] = {}
        self._tokens = 0
        #: request templates the worker numbered (decoding.py)
        self._templates: dict[int, tuple[Any, ...]] = {}
        self._exchanges: dict[int, ForwardedExchange] = {}
        #: streamed responses' bytes out in the worker (forwarded bodies, relayed gRPC
        #: streams), their writers held while the clients do not read
        self.windows = SendWindows()
        self._tasks: set[asyncio.Task[None]] = set()
        self._headers: dict[tuple[Any, ...], InferHeaders] = {}
        #: decoded requests' outputs answered over this loop turn, sent together at the
        #: flush (RESULTS)
        self.results = TurnResults(arena, self.ring, self.send, self.send_error, index)
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        #: called before anything is written to the worker (``StatsPublisher.publish``:
        #: what an answer counted is in the shared statistics before it leaves)
        self.before_write: Callable[[], None] | None = None
        #: the worker handles its signals (ARMED); ``on_armed`` is called when it says so
        self.armed = False
        self.on_armed: Callable[[], None] | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._outbox = Outbox(self._write if self.before_write is not None else transport.write, self._loop.call_soon)

    def _write(self, data: bytes) -> None:
        assert self.before_write is not None
        self.before_write()
        self._transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        """The worker is gone: its requests are withdrawn (their clients' connections went
        with it); answers still to come are dropped."""
        self._outbox = None
        self.results.clear()
        self.windows.close()
        tickets, self.tickets = self.tickets, {}
        for ticket in tickets.values():
            ticket.withdraw()
        exchanges, self._exchanges = self._exchanges, {}
        for exchange in exchanges.values():
            exchange.gone = True
            if exchange.exchange is not None:
                exchange.exchange.disconnect()
        self.ring.reset()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        decoded: list[tuple[Any, ...]] = []  # a run of DECODED messages, taken together
        for message in self._reader.feed(data):
            if message[0] == _DECODED:
                decoded.append(message)
                continue
            if decoded:
                self._decoded(decoded)
                decoded = []
            self._take(message)
        if decoded:
            self._decoded(decoded)

    def _take(self, message: tuple[Any, ...]) -> None:
        """One message from the worker but DECODED (taken in runs by ``data_received``)."""
        kind = message[0]
        if kind == _INFER:
            self._infer(*message[1:])
        elif kind == _ASGI:
            self._forwarded(*message[1:])
        elif kind == _WITHDRAW:
            self._withdraw(message[1])
        elif kind == _FREED:
            for offset in message[1]:
                self.ring.free(offset)
        elif kind == _CREDIT:
            returned = self.windows.returned
            for id, size in message[1]:
                returned(id, size)
        elif kind == _ARMED:
            self.armed = True
            if self.on_armed is not None:
                self.on_armed()
        else:
            _log.error("front-end worker %d: unexpected message %r", self.index, message[:2])

    def send(self, message: tuple[Any, ...]) -> None:
        if self._outbox is not None:
            self._outbox.send(message)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- requests --------------------------------------------------------------------------

    def _infer(
        self, id: int, name: str, version_text: str | None, fields: tuple[Any, ...], received_ns: int,
        offset: int, length: int, inline: bytes | None,
    ) -> None:
        self.requests += 1
        # a copy out of the arena: the parsed request's arrays are views on it, and the
        # worker reuses the block once it has the answer
        body = inline if inline is not None else bytes(self.arena.requests[offset:offset + length])
        headers = self._headers.get(fields)
        if headers is None:
            headers = InferHeaders(())
            headers.header_length, headers.content_encoding, headers.accept_encoding = fields
            if len(self._headers) >= 256:
                self._headers.clear()
            self._headers[fields] = headers
        answer = InferAnswer(self, id)
        ticket = self.app.endpoints.start_infer(name, version_text, headers, body, received_ns, answer)
        if ticket is not None and self._outbox is not None:
            self.tickets[id] = ticket
        if version_text is None:
            self._announce(name)

    def _announce(self, name: str) -> None:
        """Let the worker decode requests for ``name``'s serving version from now on (or
        stop, when none serves): called after it sent one raw."""
        serving = self._manager.latest.get(name)
        token = self._token_of.get(name)
        if token is not None and self._announced.get(token) is serving:
            return
        if token is not None:
            del self._announced[token], self._token_of[name]
            self.send((_FORGET, name, token))
        if serving is None or serving.config.decoupled:
            return
        self._tokens += 1
        self._announced[self._tokens] = serving
        self._token_of[name] = self._tokens
        self.send((_MODEL, name, self._tokens, serving.version, serving.config, dict(serving.labels)))

    def _decoded(self, messages: list[tuple[Any, ...]]) -> None:
        """Requests the worker decoded (DECODED messages, in order): their tensors are
        views on their arena blocks (no copy); the requests of one template that follow
        each other are queued together (``_submit``). A block is the worker's until it
        has the answer."""
        count = len(messages)
        self.requests += count
        self.decoded += count
        templates = self._templates
        run: list[tuple[Any, ...]] = []
        run_key: tuple[int, int] = (0, -1)
        run_template: tuple[Any, ...] = ()
        for message in messages:
            token, number, template = message[2], message[3], message[4]
            if template is None:
                template = templates[number]
            elif number >= 0:
                templates[number] = template
            if run and (number < 0 or (token, number) != run_key):
                self._submit(run_key[0], run_template, run)
                run = []
            run.append(message)
            run_key, run_template = (token, number), template
        self._submit(run_key[0], run_template, run)

    def _submit(self, token: int, template: tuple[Any, ...], messages: list[tuple[Any, ...]]) -> None:
        """Queue decoded requests of one template (``ServingModel.submit_many``): each its
        own queue entry, answered through its own ``DecodedAnswer``. Their inputs are
        read as one strided view per name when their blocks are evenly spaced (they
        are, unless the ring wrapped)."""
        serving = self._announced.get(token)
        if serving is None or self._manager.latest.get(serving.name) is not serving:
            if serving is not None:
                self._announce(serving.name)
            _log.debug("HTTP worker %d: a request decoded for a version no longer served goes again raw", self.index)
            for message in messages:
                self.send((_RETRY, message[1]))  # decoded for a version no longer served: raw again
            return
        rows, outputs, parameters, priority, timeout_us, binary, layout = template
        buffer = self.arena.requests
        count = len(messages)
        offsets = [message[5] for message in messages]
        first = offsets[0]
        step = offsets[1] - first if count > 1 else 0
        evenly = step > 0 and offsets == list(range(first, first + count * step, step))
        if evenly and serving.bundle_limit >= 2 * rows:
            self._submit_bundles(serving, template, messages, step)
            return
        if evenly:
            inputs = read_blocks(buffer, first, step, count, layout)
        else:
            inputs = [read_arrays(buffer, offset, layout) for offset in offsets]
        name, version = serving.name, serving.version
        requests = [InferRequest(name, arrays, rows, message[6], version, outputs, dict(parameters), priority,
                                 timeout_us, binary) for message, arrays in zip(messages, inputs)]
        answers = [DecodedAnswer(self, message[1], serving) for message in messages]
        submitted = _guarded(name, lambda: serving.submit_many(
            requests, [message[7] for message in messages], answers, priority=priority, timeout_us=timeout_us))
        tickets = [submitted] * count if isinstance(submitted, NereidError) else submitted
        held = self.tickets if self._outbox is not None else None
        for answer, ticket in zip(answers, tickets):
            if isinstance(ticket, NereidError):
                answer.set_exception(ticket)
            elif held is not None and not answer.answered:
                held[answer.id] = ticket

    def _submit_bundles(self, serving: ServingModel, template: tuple[Any, ...], messages: list[tuple[Any, ...]],
                        step: int) -> None:
        """Queue decoded requests of one template, their blocks ``step`` bytes apart, as
        bundles of at most ``bundle_limit`` rows (``ServingModel.submit_bundle``): each
        one queue entry whose inputs are all its requests' rows (views on the arena where
        they lie back to back), answered through one ``BundleAnswer``."""
        rows, outputs, parameters, priority, timeout_us, binary, layout = template
        buffer = self.arena.requests
        size = serving.bundle_limit // rows
        held = self.tickets if self._outbox is not None else None
        name, version = serving.name, serving.version
        for start in range(0, len(messages), size):
            run = messages[start:start + size]
            count = len(run)
            ids = [message[1] for message in run]
            received = [message[7] for message in run]
            request = InferRequest(name, read_rows(buffer, run[0][5], step, count, layout), rows * count, "", version,
                                   outputs, dict(parameters), priority, timeout_us, binary)
            answer = BundleAnswer(self, ids, received, rows, serving)
            bundle = _guarded(name, lambda: serving.submit_bundle(request, count, sum(received) // count, answer))
            if isinstance(bundle, NereidError):
                answer.set_exception(bundle)
                continue
            answer.bundle = bundle
            if held is not None and not answer.answered:
                for id in ids:
                    held[id] = answer

    def answered(self, id: int, version: int, outputs: dict[str, Any]) -> None:
        """A decoded request's outputs: sent at this loop turn's end with the others
        answered in it (``TurnResults``), as the batcher already has the instance run
        its next batch while this one's answers go out (a model's outputs are never
        written again once returned)."""
        self.tickets.pop(id, None)
        outbox = self._outbox
        if outbox is not None and self.results.add(id, version, outputs):
            outbox.before_flush(self._send_results)

    def answered_rows(self, ids: list[int], rows: int, version: int, outputs: dict[str, Any]) -> None:
        """A bundle's outputs, each of ``ids``' ``rows`` one after the other: sent with
        the others answered in this turn, as ``answered``'s (a request withdrawn
        meanwhile is named too: the worker, which had DONE for it, skips it)."""
        tickets = self.tickets
        for id in ids:
            tickets.pop(id, None)
        outbox = self._outbox
        if outbox is not None and self.results.add(tuple((id, rows) for id in ids), version, outputs):
            outbox.before_flush(self._send_results)

    def _send_results(self) -> None:
        if self._outbox is not None:
            self.results.send()

    def send_error(self, id: int, error: NereidError) -> None:
        status, headers, body = error_parts(error)
        self.send((_ANSWER, id, status, headers, -1, len(body), body, False))

    def answer(self, id: int, status: int, headers: Any, parts: list[Any], repeat: bool) -> None:
        """Send an infer answer: its body into the arena (inline when it has no room)."""
        self.tickets.pop(id, None)
        if self._outbox is None:
            return  # the worker is gone
        views = [memoryview(part).cast("B") for part in parts]
        length = sum(view.nbytes for view in views)
        offset = self.ring.allocate(length)
        if offset is None:
            self.send((_ANSWER, id, status, headers, -1, length, b"".join(views), repeat))
            return
        answers = self.arena.answers
        at = offset
        for view in views:
            answers[at:at + view.nbytes] = view
            at += view.nbytes
        self.send((_ANSWER, id, status, headers, offset, length, None, repeat))

    def _forwarded(self, id: int, scope: dict[str, Any], body: bytes) -> None:
        self.requests += 1
        scope["state"] = dict(self._state)
        responder = ForwardedExchange(self, id)
        exchange = responder.exchange = AsgiExchange(responder, self.app, scope)
        self._exchanges[id] = responder
        task = self._loop.create_task(exchange.run(body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def finished(self, id: int) -> None:
        self._exchanges.pop(id, None)
        self.windows.forget(id)

    def _withdraw(self, id: int) -> None:
        ticket = self.tickets.pop(id, None)
        if isinstance(ticket, BundleAnswer):
            ticket.withdraw_member(id)
        elif ticket is not None:
            ticket.withdraw()
        exchange = self._exchanges.pop(id, None)
        if exchange is not None:
            exchange.gone = True
            self.windows.forget(id)
            if exchange.exchange is not None:
                exchange.exchange.disconnect()
        self.send((_DONE, id))

    async def aclose(self) -> None:
        """Close the link and end the forwarded requests still running."""
        self.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _guarded(name: str, submit: Callable[[], _Submitted]) -> _Submitted | NereidError:
    """What ``submit`` (queueing requests of model ``name``) returned, or the error that
    refused them: a NereidError as raised, any other exception (a bug, logged) as an
    InternalError, so that it costs these requests only."""
    try:
        return submit()
    except NereidError as exc:
        return exc
    except Exception as exc:
        _log.exception("infer on model %r failed unexpectedly", name)
        return InternalError(f"internal error in infer on model '{name}': {exc}")
