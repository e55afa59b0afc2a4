"""Pipelining: a batch handed to its instance, and when the next one goes over ahead of time.

``Running`` is a batch handed to an instance. ``Stage`` decides, while a slot's batch
runs on an instance that queues batches, when the slot's next batch is formed and handed
over early, so that the instance starts it the moment the running one returns. Pure:
times are passed in; the batcher acts on the answer (batcher.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import NamedTuple

from nereid.scheduling.clock import Cancellable
from nereid.scheduling.execution import Instance, Outcome
from nereid.scheduling.pending import Pending

__all__ = ["Running", "Stage", "StageDecision", "STAGE_LEAD_NS"]

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
    #: the instance has it already (its own future); else a task that starts on the
    #: loop's next turn, so answers scheduled after it go out after it starts
    handed: bool
    #: when the batch before it on its slot ended, if it was ready then (back to back)
    after: int | None = None
    #: handed over ahead of time and not begun: its requests still count as queued
    held: bool = False
    #: handed over ahead of time (while the batch before it ran)
    ahead: bool = False


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
    lead: int = field(init=False)
    due_at: int | None = field(init=False)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        current = self.current
        self.lead = max(self.typical // 10, STAGE_LEAD_NS)
        # it began when the batch before it ended, by the instance's own clock, if it was
        # handed over ahead of time (the loop may see that end late); else when handed over
        began = current.after if current.ahead and current.after is not None else current.started
        self.due_at = began + self.typical - self.lead if self.typical else None
        self.size = sum(pending.cost for pending in current.batch)

    def decide(self, now: int, *, idle_slots: int, full: bool, queued_cost: int, last_arrival_ns: int) -> StageDecision:
        """Whether to hand a batch over at ``now``, given the queue and the other slots."""
        late = self.due_at is not None and now >= self.due_at
        quiet_at = last_arrival_ns + self.lead
        now_ = idle_slots == 0 and (full or (late and (queued_cost >= self.size or now >= quiet_at)))
        wake_at = None if self.due_at is None else max(quiet_at, now) if late else self.due_at
        return StageDecision(now_, not late, wake_at)
