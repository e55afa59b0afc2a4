"""DynamicBatcher: the asyncio side of one model's scheduling.

Forms batches from the model's queue and hands them to idle instances; each instance
slot, when free, forms its own next batch, so instances never fragment each other's
batches. The decisions live in request_queue.py (pure); array work in batch.py; the
instances behind a small protocol. Knows nothing about HTTP or JSON.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from nereid.batch import batch_signature, request_cost
from nereid.config.schema import ModelConfig
from nereid.errors import (
    InvalidInputError,
    ModelExecutionError,
    NereidError,
    RequestTimeoutError,
    UnavailableError,
)
from nereid.inference import InferRequest
from nereid.request_queue import QueuedRequest, RequestQueue
from nereid.stats import ModelStats

__all__ = ["DynamicBatcher", "Instance", "Outcome"]

_log = logging.getLogger("nereid")


class Outcome(Protocol):
    outputs: list[dict[str, np.ndarray]] | None
    error: NereidError | None
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int


class Instance(Protocol):
    """What the batcher needs of an instance (``instance.ModelInstance`` is one)."""

    name: str
    capacity: int

    @property
    def cost_function(self) -> Callable[[dict[str, np.ndarray]], int] | None: ...

    async def run_batch(self, requests: Sequence[InferRequest]) -> Outcome: ...


class DynamicBatcher:
    """Batches one model version's requests onto its instances.

    Use as ``async with DynamicBatcher(...) as batcher: await batcher.infer(request)``.
    Leaving the block stops taking requests, lets running batches finish (drain) and fails
    what is still queued with UnavailableError.
    """

    def __init__(
        self,
        *,
        model_name: str,
        config: ModelConfig,
        instances: Sequence[Instance],
        stats: ModelStats,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.model_name = model_name
        self.config = config
        self.instances = tuple(instances)
        self.stats = stats
        self._clock = clock
        self._queue = RequestQueue(
            max_batch_size=config.max_batch_size, dynamic_batching=config.dynamic_batching
        )
        self._cost_fn = self.instances[0].cost_function if self.instances else None
        self._form_lock = asyncio.Lock()
        self._arrival: asyncio.Future[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Future[Any]] = set()
        self._closed = False
        self._executing = 0

    @property
    def queue_depth(self) -> int:
        """Requests waiting in the queue now."""
        return len(self._queue)

    @property
    def executing(self) -> int:
        """Batches running now."""
        return self._executing

    async def __aenter__(self) -> DynamicBatcher:
        for instance in self.instances:
            for slot in range(instance.capacity):
                task = asyncio.create_task(
                    self._worker(instance), name=f"nereid-batcher-{instance.name}-{slot}"
                )
                self._workers.append(task)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, drain_timeout: float | None = None) -> None:
        """Stop taking requests; run what was already accepted (queued ones too, without
        waiting out the queue delay); then stop the workers. After ``drain_timeout``
        seconds whatever is still queued fails with UnavailableError."""
        if self._closed:
            return
        self._closed = True
        _wake_optional(self._arrival)
        done, pending = await asyncio.wait(self._workers, timeout=drain_timeout) if self._workers else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        while len(self._queue):
            decision = self._queue.decide(self._clock(), flush=True)
            for item in decision.batch + decision.expired:
                self._fail(item, UnavailableError(f"model '{self.model_name}' was unloaded"))
        self._workers.clear()

    async def infer(self, request: InferRequest, received_ns: int | None = None) -> dict[str, np.ndarray]:
        """Queue one request and wait for its outputs (its own rows only).

        Raises QueueFullError, RequestTimeoutError, ModelExecutionError, InvalidInputError
        (cost beyond max_batch_size) or UnavailableError (stopping). If the caller is
        cancelled while the request waits, the request leaves the queue unexecuted.
        """
        if self._closed:
            raise UnavailableError(f"model '{self.model_name}' is not accepting requests")
        now = self._clock()
        if received_ns is None:
            received_ns = now
        queue = self._queue
        cost = request.rows
        if self._cost_fn is not None:
            cost = request_cost(request, self._cost_fn)
            if queue.batching and cost > queue.max_batch_size:
                raise InvalidInputError(
                    f"model '{self.model_name}': request cost {cost} (from Model.batch_size) "
                    f"exceeds max_batch_size {queue.max_batch_size}",
                    model=self.model_name,
                )
        level = queue.level_for(request.priority)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        item = QueuedRequest(
            payload=(request, future, received_ns),
            cost=cost,
            signature=batch_signature(request, self.config),
            level=level,
            enqueued_ns=now,
            deadline_ns=queue.deadline_for(level, now, request.timeout_us),
        )
        try:
            queue.push(item)
        except NereidError:
            self.stats.record_failure(self._clock() - received_ns, "REJECTED")
            raise
        arrival = self._arrival
        if arrival is not None and not arrival.done():
            arrival.set_result(None)
        try:
            return await future
        except asyncio.CancelledError:
            if queue.discard(item):
                self.stats.record_failure(self._clock() - received_ns, "CANCELED")
            raise

    # -- workers -----------------------------------------------------------------------

    async def _worker(self, instance: Instance) -> None:
        while True:
            batch = await self._next_batch()
            if batch is None:
                return
            self._executing += 1
            try:
                await self._execute(instance, batch)
            finally:
                self._executing -= 1

    async def _next_batch(self) -> tuple[QueuedRequest, ...] | None:
        """The next batch for an idle slot; None once closed and the queue is empty."""
        loop = asyncio.get_running_loop()
        async with self._form_lock:
            while True:
                closing = self._closed
                decision = self._queue.decide(self._clock(), flush=closing)
                for item in decision.expired:
                    self._fail(item, RequestTimeoutError("Request timeout expired"), "REJECTED")
                live = tuple(item for item in decision.batch if not item.payload[1].done())
                if live:
                    return live
                if decision.batch:
                    continue
                if closing and len(self._queue) == 0:
                    _wake_optional(self._arrival)  # let the next idle slot see it too
                    return None
                arrival = self._arrival = loop.create_future()
                timer = None
                if decision.wake_at_ns is not None:
                    # loop.time() is time.monotonic(), the same clock as monotonic_ns.
                    timer = loop.call_at(decision.wake_at_ns / 1e9, _wake, arrival)
                try:
                    await arrival
                finally:
                    if timer is not None:
                        timer.cancel()

    async def _execute(self, instance: Instance, batch: tuple[QueuedRequest, ...]) -> None:
        started = self._clock()
        requests = [item.payload[0] for item in batch]
        outcome = await instance.run_batch(requests)
        if outcome.error is not None and len(batch) > 1 and isinstance(outcome.error, ModelExecutionError):
            # Find the culprit: rerun one request at a time so only it fails.
            for item in batch:
                if not item.payload[1].done():
                    await self._execute(instance, (item,))
            return
        if outcome.error is not None:
            for item in batch:
                self._fail(item, outcome.error, "BACKEND")
            return
        assert outcome.outputs is not None
        rows = sum(request.rows for request in requests)
        self.stats.record_execution(
            rows, outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns
        )
        end = self._clock()
        for item, outputs in zip(batch, outcome.outputs):
            _, future, received_ns = item.payload
            if future.done():
                continue
            future.set_result(outputs)
            self.stats.record_success(
                end - received_ns,
                started - item.enqueued_ns,
                outcome.compute_input_ns,
                outcome.compute_infer_ns,
                outcome.compute_output_ns,
            )

    def _fail(self, item: QueuedRequest, error: NereidError, reason: str = "OTHER") -> None:
        _, future, received_ns = item.payload
        if future.done():
            return
        future.set_exception(error)
        self.stats.record_failure(self._clock() - received_ns, reason)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wake_optional(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


