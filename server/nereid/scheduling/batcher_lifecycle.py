"""BatcherLifecycle: what a DynamicBatcher holds, and its life around the request flow.

Built (its queue, answers, stager and execution), started (one task per instance slot:
``async with``), tuned at run time (``set_max_batch_size``, ``set_max_queue_delay``),
read by the metrics (``queue_depth``, ``executing``) and drained (``aclose``). None of it
runs per request: the request flow itself (the ways in, the slots, forming batches) is
DynamicBatcher's own, in batcher.py, read in one go.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any, Callable, Self, Sequence

from nereid.config.schema import DynamicBatching
from nereid.errors import UnavailableError
from nereid.scheduling.clock import SYSTEM_CLOCK, Cancellable, Clock, SystemClock
from nereid.scheduling.execution import Execution, Instance, Outcome
from nereid.scheduling.pending import Answers, InOrder, Pending, split_bundle
from nereid.scheduling.queue import RequestQueue
from nereid.scheduling.staging import Running, Stager
from nereid.stats import ModelStats

__all__ = ["BatcherLifecycle"]


class BatcherLifecycle:
    """The state of one model version's batcher, and how it starts and stops; the base
    of DynamicBatcher (batcher.py), which supplies the request flow (``_worker``: one
    slot, ``_wake_idle``, ``_form``, ``_launch``, ``_answer``)."""

    def __init__(
        self,
        *,
        model_name: str,
        max_batch_size: int,
        dynamic_batching: DynamicBatching | None,
        instances: Sequence[Instance],
        stats: ModelStats,
        cost_of: Callable[[Any], int] = lambda payload: 1,
        signature_of: Callable[[Any], Any] = lambda payload: None,
        rows_of: Callable[[Any], int] = lambda payload: 1,
        streaming: bool = False,
        execution_timeout_ms: int = 0,
        clock: Clock = SYSTEM_CLOCK,
        bundles: bool = False,
    ) -> None:
        """``cost_of`` counts a payload against ``max_batch_size``, payloads batch only
        with equal ``signature_of``, ``rows_of`` is what statistics count;
        ``execution_timeout_ms`` (0: none) bounds a batch on an instance that does not
        enforce it; ``clock``: tests pass one they move by hand; ``bundles``: the model
        cannot tell a Bundle from the requests it stands for (it gets one batch of
        inputs, its cost is rows), so ``bundle_limit`` may allow them."""
        self.model_name = model_name
        self.instances = tuple(instances)
        self.stats = stats
        self._time = clock
        # looked up once: for SYSTEM_CLOCK, time.monotonic_ns and (from __aenter__) loop.call_at
        self._clock: Callable[[], int] = clock.monotonic_ns
        self._call_at: Callable[..., Cancellable] = clock.call_at
        self._cost_of = cost_of
        self._signature_of = signature_of
        self._queue: RequestQueue[Pending] = RequestQueue(max_batch_size=max_batch_size, dynamic_batching=dynamic_batching)
        queue = self._queue
        preserve = dynamic_batching is not None and dynamic_batching.preserve_ordering
        self._bundles = bundles and queue.batching and not streaming and not queue.bounded and not preserve
        if self._bundles:  # a bundle that would pass max_batch_size gives the batch what fits
            queue.splitter = functools.partial(split_bundle, cost_of=cost_of)
        #: decoupled models stream: their batches run through ``run_stream``.
        self.streaming = streaming
        self._form_lock = asyncio.Lock()
        self._arrival: asyncio.Future[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False
        self._executing = 0
        self._idle = 0  # slots waiting in _next_batch
        self._typical_ns = 0  # how long a batch runs, lately (a moving average; 0: none ran yet)
        self._timer = clock.precise_timer(model_name)
        self._order: InOrder | None = InOrder() if preserve else None
        self._answers = Answers(stats, rows_of, self._order, self._clock)
        self._formation_ns = 0  # how long forming the last batch took (``_form``)
        #: busy slots that may hand their next batch over early
        self._stager = Stager(self._queue, self._clock, self._call_at, self._form, self._launch, lambda: self._idle)
        self._execution = Execution(model_name, self._answers, rows_of, self._answer_rerun, execution_timeout_ms)

    @property
    def bundle_limit(self) -> int:
        """The most cost one Bundle may hold (``DynamicBatcher.submit_bundle``); 0: none.
        A Bundle is batched as one entry, so it is kept to what the model would batch
        whole anyway (the largest preferred size, or max_batch_size); there are none
        where one could be told from its requests: no dynamic batching (a batch per
        request), a max_queue_size (it counts requests), preserve_ordering (a failed
        batch's reruns answer a bundle's requests one by one, outside the order kept), a
        decoupled model, or a model that sees requests one by one or counts its own cost
        (``bundles`` False)."""
        if not self._bundles:
            return 0
        queue = self._queue
        return min(queue.max_preferred, queue.max_batch_size)

    if TYPE_CHECKING:  # the request flow: DynamicBatcher's (batcher.py)
        async def _worker(self, instance: Instance) -> None: ...
        def _wake_idle(self) -> None: ...
        def _form(self, only_full: bool = False, /) -> tuple[tuple[Pending, ...], int | None]: ...
        def _launch(self, instance: Instance, batch: tuple[Pending, ...], timed: bool = False, /) -> Running: ...
        def _answer_rerun(self, batch: tuple[Pending, ...], started: int, outcome: Outcome) -> None: ...

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Change the batch bound at run time (applies to batches formed from now on)."""
        self._queue.set_max_batch_size(max_batch_size)

    def set_max_queue_delay(self, microseconds: int) -> None:
        """Change the queue delay at run time."""
        self._queue.set_max_queue_delay(microseconds)
        self._wake_idle()

    @property
    def queue_depth(self) -> int:
        """Requests waiting now: in the queue, or in a batch handed to an instance ahead of
        time that has not begun."""
        return self._queue.waiting + self._queue.held

    @property
    def executing(self) -> int:
        """Batches running now."""
        return self._executing

    async def __aenter__(self) -> Self:
        if isinstance(self._time, SystemClock):  # real time's timers are the loop's own
            self._call_at = asyncio.get_running_loop().call_at
        self._stager.call_at = self._call_at
        for instance in self.instances:
            for slot in range(instance.capacity):
                self._workers.append(asyncio.create_task(self._worker(instance), name=f"nereid-batcher-{instance.name}-{slot}"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, drain_timeout: float | None = None) -> bool:
        """Stop taking requests; run what was already accepted (queued ones too, without
        waiting out the queue delay); then stop the workers. After ``drain_timeout`` what
        is still queued or running fails with UnavailableError, and False is returned
        (batches abandoned in the model)."""
        if self._closed:
            return True
        self._closed = self._stager.closed = True
        self._wake_idle()
        done, pending = await asyncio.wait(self._workers, timeout=drain_timeout) if self._workers else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._timer.stop()
        while len(self._queue):
            decision = self._queue.decide(self._clock(), flush=True)
            for item in decision.batch + decision.expired:
                self._answers.fail(item, UnavailableError(f"model '{self.model_name}' was unloaded"))
        self._workers.clear()
        return not pending
