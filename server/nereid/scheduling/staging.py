"""Pipelining: a batch handed to its instance, and when the next one goes over ahead of time.

``Running`` is a batch handed to an instance. ``Stage`` decides, while a slot's batch
runs on an instance that queues batches, when the slot's next batch is formed and handed
over early, so that the instance starts it the moment the running one returns (pure:
times are passed in). ``Stager`` keeps one batcher's stages and acts on their decisions:
on each arrival, and at the times they name. How batches are formed and handed over is
the batcher's (batcher.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, NamedTuple

from nereid.scheduling.clock import Cancellable
from nereid.scheduling.execution import Instance, Outcome
from nereid.scheduling.pending import Pending
from nereid.scheduling.queue import RequestQueue

__all__ = ["Running", "Stage", "StageDecision", "Stager", "STAGE_LEAD_NS"]

#: The least time before a running batch is expected to end at which the next batch (not
#: full) is formed and handed to its instance.
STAGE_LEAD_NS = 1_000_000


@dataclass(slots=True, eq=False)
class Running:
    """A batch handed to an instance: the future of its Outcome (None: it ran past the
    execution timeout) and when it could start (now, or once the batch before it on its
    slot returned: ``started`` is moved then)."""

    batch: tuple[Pending, ...]
    future: asyncio.Future[Outcome | None]
    started: int
    #: when the batch before it on its slot ended, if it was ready then (back to back)
    after: int | None = None
    #: handed over ahead of time and not begun: its requests still count as queued
    held: bool = False
    #: handed over ahead of time (while the batch before it ran)
    ahead: bool = False
    #: the event loop's time to form it (``batch_formation``)
    formation_ns: int = 0


class StageDecision(NamedTuple):
    """``Stage.decide``'s answer: form and hand over a batch now (``only_full``: a full
    one only); if none goes, look again at ``wake_at`` (ns; None: only when a request
    arrives)."""

    now: bool
    only_full: bool
    wake_at: int | None


@dataclass(slots=True, eq=False)
class Stage:
    """One slot's chance to hand ``instance`` its next batch while ``current`` runs.

    A full batch goes as soon as it is queued. A batch that is not full goes only where
    this is the model's one slot (``typical``: how long its batches run lately; 0 where
    several slots share the queue: the batch waits for the first free slot and grows
    meanwhile, instead of splitting the load into ever smaller batches), once ``current``
    is about to end (its expected end less ``lead``: a tenth of ``typical``, 1 ms at
    least), when it is as large as ``current`` or nothing arrived for ``lead``.
    """

    instance: Instance
    current: Running
    typical: int
    #: the slot's next batch once handed over
    following: Running | None = None
    #: the timer that looks again, and when it fires
    timer: Cancellable | None = None
    timer_at: int = 0
    # from ``current`` and ``typical`` at the first look (most batches end before one)
    lead: int = 0
    due_at: int | None = None
    size: int = 0

    def decide(self, now: int, *, idle_slots: int, full: bool, queued_cost: int, last_arrival_ns: int) -> StageDecision:
        """Whether to hand a batch over at ``now``, given the queue and the other slots."""
        if not self.lead:
            self.measure()
        late = self.due_at is not None and now >= self.due_at
        quiet_at = last_arrival_ns + self.lead
        now_ = idle_slots == 0 and (full or (late and (queued_cost >= self.size or now >= quiet_at)))
        if self.due_at is None:
            wake_at = None
        elif not late:
            wake_at = self.due_at
        else:  # no look past the expected end: the batch returns first, and its slot takes the queue
            wake_at = max(quiet_at, now)
            if wake_at >= self.due_at + self.lead:
                wake_at = None
        return StageDecision(now_, not late, wake_at)

    def measure(self) -> None:
        """``lead``, ``due_at`` and ``size`` from ``current`` and ``typical`` (at the first
        look or arrival: most batches end before either)."""
        current = self.current
        self.lead = max(self.typical // 10, STAGE_LEAD_NS)
        # it began when the batch before it ended, by the instance's own clock, if it was
        # handed over ahead of time (the loop may see that end late); else when handed over
        began = current.after if current.ahead and current.after is not None else current.started
        self.due_at = began + self.typical - self.lead if self.typical else None
        self.size = sum(pending.cost for pending in current.batch)


#: ``form(only_full)``: the batch due now (empty if none) and when the queue next wants a
#: look; ``launch(instance, batch)``: hand it over (the batcher's ``_form`` and ``_launch``).
Form = Callable[[bool], tuple[tuple[Pending, ...], "int | None"]]
Launch = Callable[[Instance, tuple[Pending, ...]], Running]


class Stager:
    """One batcher's busy slots that may hand their next batch over early (``stages``:
    the batcher adds a slot's Stage while its batch runs and takes it out when it
    returns), and the looks that do it (``look``): the batcher's on each arrival, and
    this one's own at the times a Stage names. ``idle_slots()``: slots waiting for a
    batch (while one is, a batch goes to it instead); ``closed``: set once the batcher
    stops."""

    def __init__(self, queue: RequestQueue[Pending], clock: Callable[[], int], call_at: Callable[..., Cancellable],
                 form: Form, launch: Launch, idle_slots: Callable[[], int]) -> None:
        self.stages: list[Stage] = []
        self.last_arrival_ns = 0
        self.closed = False
        self._looking = False  # a look at every stage is due on the loop's next turn
        # what a look reads
        self._queue, self._clock, self._idle_slots = queue, clock, idle_slots
        # how it acts: the batcher's
        self._form, self._launch = form, launch
        #: the clock's ``call_at`` (the batcher sets the running loop's own once entered)
        self.call_at = call_at

    def arrived(self) -> None:
        """A request arrived (at ``last_arrival_ns``). Where the queue is full or a stage is
        late (its batch about to end), every stage looks again on the loop's next turn,
        once the loop has read whatever else arrived with it (one look per burst: a look at
        each arrival would hand over a batch of the first few); a stage not late yet looks
        when it is (a timer), not at each arrival."""
        if self._looking or self.closed:
            return
        now = self.last_arrival_ns
        full = self._queue.full
        for stage in self.stages:
            if not stage.lead:
                stage.measure()
            due_at = stage.due_at
            if full or (due_at is not None and now >= due_at):
                self._looking = True
                asyncio.get_running_loop().call_soon(self._look_all)
                return
            if due_at is not None and stage.timer is None and stage.following is None:
                self._look_at(stage, due_at)

    def _look_all(self) -> None:
        self._looking = False
        for stage in self.stages:
            self.look(stage)

    def look(self, stage: Stage) -> None:
        """Hand ``stage``'s slot its next batch now if ``Stage.decide`` says so; else look
        again when it says (a timer) or when a request arrives (``arrived``)."""
        if self.closed or stage.following is not None:
            return
        queue = self._queue
        now = self._clock()
        decision = stage.decide(now, idle_slots=self._idle_slots(), full=queue.full, queued_cost=queue.queued_cost,
                                last_arrival_ns=self.last_arrival_ns)
        wake_at = decision.wake_at
        if decision.now:
            batch, queue_wake_at = self._form(decision.only_full)
            if batch:
                queue.hold(batch)
                staged = stage.following = self._launch(stage.instance, batch)
                staged.held = staged.ahead = True
                if stage.timer is not None:
                    stage.timer.cancel()
                    stage.timer = None
                return
            if wake_at is not None and queue_wake_at is not None:  # the queue delay holds it back
                wake_at = max(wake_at, queue_wake_at)
        if wake_at is None or wake_at <= now or not len(queue):
            return  # nothing to look at before a request arrives
        if stage.timer is not None:
            if stage.timer_at <= wake_at:
                return  # it looks again then, and again later if need be
            stage.timer.cancel()
        self._look_at(stage, wake_at)

    def _look_at(self, stage: Stage, wake_at: int) -> None:
        stage.timer_at = wake_at
        stage.timer = self.call_at(wake_at / 1e9, self._look_again, stage)

    def _look_again(self, stage: Stage) -> None:
        stage.timer = None
        if stage in self.stages:
            self.look(stage)
