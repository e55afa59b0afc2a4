"""Which sequence holds which instance slot: Triton's sequence batcher bookkeeping, pure.

A sequence (one correlation id, from its START to its END) is bound to one slot of one
instance ("lane") for its whole life, so its requests reach the same slot in order, one
at a time; a sequence that starts while every slot is taken waits in the backlog. This
module decides (admission and its errors, the batch due on a lane at ``now`` and which
of its rows are empty, idle release, backlog timeouts); the asyncio side is
sequence_batcher.py. Knows nothing about tensors or HTTP.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Any, Iterator

from nereid.config.schema import SequenceStrategy
from nereid.errors import InvalidInputError
from nereid.inference import SequenceFlags
from nereid.scheduling.pending import Pending

__all__ = ["Lane", "Occupant", "Sequences"]

_log = logging.getLogger("nereid")


@dataclass(eq=False, slots=True)
class Occupant:
    """One sequence in a slot or in the backlog: its requests not yet run (in order), its
    implicit state, and when it was last heard of."""

    id: int | str
    started_ns: int
    last_ns: int
    queue: collections.deque[Pending] = field(default_factory=collections.deque)
    #: its END arrived: it takes no more requests, and leaves once they ran.
    ended: bool = False
    #: one of its requests is in a batch now.
    running: bool = False
    #: the implicit state the model returned last (input name -> array); None: none yet.
    state: dict[str, Any] | None = None
    lane: int = -1
    slot: int = -1
    #: in the backlog: when it is rejected if it has no slot by then (None: never), the
    #: earliest of its requests' ``timeout`` parameters (Triton's backlog timeout).
    expires_ns: int | None = None


@dataclass(eq=False, slots=True)
class Lane:
    """One instance's slots (None: free)."""

    slots: list[Occupant | None]
    #: a batch of this lane runs now (a lane runs one at a time: a slot's order).
    busy: bool = False

    def ready(self) -> list[Occupant]:
        """Occupants with a request to run, none running."""
        return [o for o in self.slots if o is not None and o.queue and not o.running]


#: A batch's rows in slot order: the occupant whose next request fills the row, or None
#: for a direct batch's empty slot (Triton's null request: READY false, output dropped).
Rows = list[Occupant | None]


class Sequences:
    """Every slot of one model's instances, the backlog, and the correlation ids in flight.

    ``admit`` queues a request in its sequence (or refuses it, as Triton does);
    ``take`` forms the batch due on a lane at ``now``; ``done`` records a batch that ran
    (freeing the slots of sequences that ended); ``release_idle`` frees the slots of
    sequences idle past ``max_sequence_idle_microseconds``; ``expire_backlog`` rejects
    backlogged sequences past their requests' timeout."""

    def __init__(self, model_name: str, lanes: int, slots_per_lane: int, max_batch_size: int,
                 strategy: SequenceStrategy | None, idle_us: int) -> None:
        self.model_name = model_name
        self.lanes = [Lane([None] * slots_per_lane) for _ in range(lanes)]
        self._by_id: dict[int | str, Occupant] = {}
        self.backlog: collections.deque[Occupant] = collections.deque()
        self._strategy = strategy or SequenceStrategy("direct")
        self._cap = max(1, max_batch_size)
        self._delay_ns = self._strategy.max_queue_delay_microseconds * 1000
        self.idle_ns = idle_us * 1000
        preferred = [size for size in self._strategy.preferred_batch_size if size <= self._cap]
        self._full = max(preferred) if preferred else self._cap

    # -- admission ------------------------------------------------------------------------

    def admit(self, pending: Pending, flags: SequenceFlags | None, rows: int, now: int,
              timeout_us: int | None = None) -> Occupant:
        """Queue ``pending`` in its sequence; the occupant it joined. Raises Triton's
        InvalidInputError for a request with several rows, without a correlation id, or
        for an unknown sequence without START. A request that lands in the backlog with a
        ``timeout_us`` (not 0) bounds how long its sequence may wait there for a slot
        (SequenceBatchScheduler::Enqueue); one that lands in a slot never times out."""
        model = self.model_name
        if rows > 1:
            raise InvalidInputError(f"inference request to model '{model}' must specify batch-size 1 due to "
                                    "requirements of sequence batcher", model=model)
        if flags is None or flags.id == 0 or flags.id == "":
            raise InvalidInputError(f"inference request to model '{model}' must specify a non-zero or non-empty "
                                    "correlation ID", model=model)
        occupant = self._by_id.get(flags.id)
        if occupant is None and not flags.start:
            raise InvalidInputError(f"inference request for sequence {flags.id} to model '{model}' must specify the "
                                    "START flag on the first request of the sequence", model=model)
        if occupant is not None and flags.start:
            _log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                         "sequence start. Previous sequence will be terminated early.", flags.id, model)
        if occupant is None:
            occupant = Occupant(flags.id, now, now)
            self._place(occupant)
        occupant.last_ns = now
        occupant.queue.append(pending)
        if occupant.lane < 0 and timeout_us:
            expires = now + timeout_us * 1000
            occupant.expires_ns = expires if occupant.expires_ns is None else min(occupant.expires_ns, expires)
        if flags.end:
            occupant.ended = True
            self._by_id.pop(flags.id, None)  # a later request of this id starts a new sequence
        else:
            self._by_id[flags.id] = occupant
        return occupant

    def _place(self, occupant: Occupant) -> None:
        """Into the lowest free slot of any lane, as Triton's ready-slot heap orders them
        (ties: the lane with the most free slots), else the backlog. A direct batch runs
        its lane's slots up to the highest ready one, so low slots keep batches short."""
        best: tuple[int, int, int] | None = None  # (slot, -free slots, lane)
        for index, lane in enumerate(self.lanes):
            free = [slot for slot, o in enumerate(lane.slots) if o is None]
            if free and (best is None or (free[0], -len(free), index) < best):
                best = (free[0], -len(free), index)
        if best is None:
            self.backlog.append(occupant)
            return
        occupant.lane, occupant.slot = best[2], best[0]
        self.lanes[best[2]].slots[best[0]] = occupant

    def withdraw(self, pending: Pending) -> list[Pending] | None:
        """Its caller cancelled a queued request: its sequence ends there, as Triton ends a
        sequence with a cancelled request (DirectSequenceBatch::BatcherThread,
        OldestSequenceBatch::CompleteAndNext, ReleaseSequenceSlot). The requests that leave
        are returned, ``pending`` first: in a slot, it and those queued behind it (those
        ahead still run, then the slot frees); in the backlog, all of the sequence's. Its
        correlation id is forgotten: a next request needs START. None: it was not queued
        (running, or gone already)."""
        for occupant in self._occupants():
            if pending in occupant.queue and not (occupant.running and occupant.queue[0] is pending):
                queued = list(occupant.queue)
                keep = queued.index(pending) if occupant.lane >= 0 else 0
                occupant.queue = collections.deque(queued[:keep])
                occupant.ended = True
                if self._by_id.get(occupant.id) is occupant:
                    del self._by_id[occupant.id]
                if occupant.lane < 0:
                    self.backlog.remove(occupant)
                elif not occupant.queue and not occupant.running:
                    self._free(occupant)
                return [pending, *(other for other in queued[keep:] if other is not pending)]
        return None

    def _occupants(self) -> Iterator[Occupant]:
        for lane in self.lanes:
            yield from (o for o in lane.slots if o is not None)
        yield from self.backlog

    @property
    def queued(self) -> int:
        """Requests waiting (in slots and in the backlog), not those running."""
        return sum(len(o.queue) - o.running for o in self._occupants())

    # -- batches ---------------------------------------------------------------------------

    def take(self, lane_index: int, now: int, flush: bool = False) -> tuple[Rows, int | None]:
        """The rows of the batch due now on a lane (empty if none), and, when none is due,
        when one will be (None: on an arrival). Marks their occupants running.

        direct (DirectSequenceBatch::BatcherThread): one row per slot from slot 0 to the
        highest ready one, each the next request of its slot's sequence, or None where the
        slot has no request (free, or its sequence sent nothing yet) or one whose input
        shapes differ from the first ready slot's (it waits for a later batch). A queue
        delay holds the batch back until ``minimum_slot_utilization`` of ``max_batch_size``
        is ready or its oldest request waited the delay (no delay, or a utilization of 0:
        at once). oldest: the sequences' next requests that waited longest, of one shape,
        up to max_batch_size, no empty rows; a delay waits for the largest preferred size."""
        lane = self.lanes[lane_index]
        if lane.busy:
            return [], None
        ready = lane.ready()
        if not ready:
            return [], None
        oldest = self._strategy.kind == "oldest"
        if oldest:
            # Triton hands each slot's next request to a dynamic batcher, first come first
            # served (OldestSequenceBatch): the requests that waited longest go first.
            ready.sort(key=lambda o: o.queue[0].enqueued_ns)
            shape = ready[0].queue[0].signature
            ready = [o for o in ready if o.queue[0].signature == shape][: self._cap]
        if self._delay_ns and not flush and not self._full_enough(len(ready), oldest):
            due = min(o.queue[0].enqueued_ns for o in ready) + self._delay_ns
            if now < due:
                return [], due
        rows: Rows = list(ready) if oldest else self._direct_rows(lane, ready)
        for occupant in rows:
            if occupant is not None:
                occupant.running = True
        lane.busy = True
        return rows, None

    @staticmethod
    def _direct_rows(lane: Lane, ready: list[Occupant]) -> Rows:
        shape = ready[0].queue[0].signature  # Triton's representative: the lowest ready slot
        rows: Rows = [None] * (ready[-1].slot + 1)
        for occupant in ready:
            if occupant.queue[0].signature == shape:
                rows[occupant.slot] = occupant
        return rows

    def _full_enough(self, count: int, oldest: bool) -> bool:
        if oldest:
            return count >= self._full
        utilization = self._strategy.minimum_slot_utilization
        return utilization == 0 or count / self._cap >= utilization

    def done(self, lane_index: int, batch: Rows) -> None:
        """A lane's batch ran (or failed): each occupant's request leaves its queue; a
        sequence that ended and has nothing left frees its slot for the backlog's oldest."""
        self.lanes[lane_index].busy = False
        for occupant in batch:
            if occupant is None:
                continue
            occupant.running = False
            if occupant.queue:
                occupant.queue.popleft()
            if occupant.ended and not occupant.queue:
                self._free(occupant)

    def _free(self, occupant: Occupant) -> None:
        """``occupant``'s slot goes to the oldest sequence of the backlog."""
        if occupant.lane < 0:
            return
        lane, slot = occupant.lane, occupant.slot
        occupant.lane = occupant.slot = -1
        successor = self.backlog.popleft() if self.backlog else None
        self.lanes[lane].slots[slot] = successor
        if successor is not None:
            successor.lane, successor.slot = lane, slot
            successor.expires_ns = None  # in a slot: no backlog timeout any more

    # -- idle sequences ---------------------------------------------------------------------

    def release_idle(self, now: int) -> list[Occupant]:
        """Free the slots of sequences nobody sent a request to for longer than the idle
        time (nothing queued or running): their correlation ids are forgotten, so a next
        request needs START again. The occupants released."""
        released = []
        for lane in self.lanes:
            for occupant in lane.slots:
                if (occupant is not None and not occupant.queue and not occupant.running
                        and now - occupant.last_ns >= self.idle_ns):
                    released.append(occupant)
        for occupant in released:
            if self._by_id.get(occupant.id) is occupant:
                del self._by_id[occupant.id]
            self._free(occupant)
        return released

    def next_idle_ns(self) -> int | None:
        """When the next sequence in a slot turns idle (None: none can)."""
        times = [o.last_ns + self.idle_ns for lane in self.lanes for o in lane.slots
                 if o is not None and not o.queue and not o.running]
        return min(times) if times else None

    # -- backlog timeouts ----------------------------------------------------------------

    def expire_backlog(self, now: int) -> list[Occupant]:
        """Take out of the backlog the sequences whose timeout passed before they got a
        slot (their correlation ids are forgotten); the batcher rejects their requests."""
        expired = [o for o in self.backlog if o.expires_ns is not None and o.expires_ns <= now]
        for occupant in expired:
            self.backlog.remove(occupant)
            if self._by_id.get(occupant.id) is occupant:
                del self._by_id[occupant.id]
        return expired

    def next_expiry_ns(self) -> int | None:
        """When the next backlogged sequence times out (None: none can)."""
        times = [o.expires_ns for o in self.backlog if o.expires_ns is not None]
        return min(times) if times else None

    def abandon(self) -> list[Pending]:
        """Everything still queued (the model is going away): taken out, to be failed."""
        left = [pending for occupant in self._occupants() for pending in occupant.queue]
        for occupant in self._occupants():
            occupant.queue.clear()
        return left
