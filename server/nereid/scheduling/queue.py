"""Per-model request queue and Triton's dynamic-batch decision, as pure code.

Owns priority levels, queue policies (max size, timeouts REJECT/DELAY) and the rule
that says whether a batch is due at time ``now`` and, if not, when to look again. The
clock is injected (every method takes ``now_ns``); no asyncio, no sleeping, no HTTP.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Generic, Hashable, Iterator, Sequence, TypeVar

from nereid.config.schema import DynamicBatching, QueuePolicy
from nereid.errors import QueueFullError

__all__ = ["QueuedRequest", "Decision", "RequestQueue"]

_seq = itertools.count()


@dataclass(slots=True, eq=False)
class QueuedRequest:
    """What the queue keeps of one waiting request (the batcher's ``pending.Pending``
    extends it with the request itself and how it is answered).

    ``cost`` counts against max_batch_size (rows, or the model's ``batch_size()``);
    requests batch together only when their ``signature`` is equal; ``deadline_ns`` 0
    means no timeout; ``count``: the requests it stands for (a bundle's: several; set
    before it is pushed). The rest is the queue's own (``push`` and ``decide`` set it).
    """

    cost: int
    signature: Hashable
    level: int
    enqueued_ns: int
    deadline_ns: int
    count: int = field(default=1, init=False)
    timeout_action: str = field(default="REJECT", init=False)
    seq: int = field(default_factory=_seq.__next__, init=False)
    removed: bool = field(default=False, init=False)
    delayed: bool = field(default=False, init=False)


#: The queue's entries: QueuedRequest or a record that extends it (the batcher's Pending).
Entry = TypeVar("Entry", bound=QueuedRequest)


@dataclass(frozen=True, slots=True)
class Decision(Generic[Entry]):
    """What the queue says at ``now``: a batch to run (``batch``), and/or the requests
    whose timeout expired under REJECT (``expired``, to be failed), and when to ask again
    if nothing new arrives (``wake_at_ns``; None: only on arrival)."""

    batch: tuple[Entry, ...] = ()
    expired: tuple[Entry, ...] = ()
    wake_at_ns: int | None = None


class RequestQueue(Generic[Entry]):
    """The queue of one model, with Triton's dynamic batcher rules.

    A batch leaves when (Triton's ``GetDynamicBatch``): the queued work reaches
    ``max_batch_size`` or a request that does not fit (size or shape) is next; or it reaches
    the largest preferred size (or would pass it); or a preferred size was reached and the
    queue delay has not expired (the largest preferred prefix leaves); or the delay, counted
    from the oldest queued request, has expired; or the delay is 0 (opportunistic: whatever
    is queued leaves at once). Requests are taken in priority order (level 1 first), FIFO
    within a level; requests whose timeout expired under DELAY go after every unexpired one
    of the same and higher priority.

    With ``batching=False`` (no ``[dynamic_batching]``) every batch holds one request.

    An entry that stands for several alike requests (``count`` > 1, each costing
    ``cost // count``) is cut where it would pass max_batch_size, given a ``splitter``:
    the batch takes as many of its requests as fit, and the rest keep its place, so the
    batches are those of the same requests queued one by one (without preferred sizes; with
    them, it is cut only where the batch reaches max_batch_size).
    """

    def __init__(
        self,
        *,
        max_batch_size: int,
        dynamic_batching: DynamicBatching | None,
    ) -> None:
        self.batching = dynamic_batching is not None and max_batch_size > 0
        db = dynamic_batching or DynamicBatching()
        self.max_batch_size = max(1, max_batch_size)
        self._configured_preferred = tuple(db.preferred_batch_size)
        self.preferred = frozenset(db.preferred_batch_size)
        self.max_preferred = max(db.preferred_batch_size) if db.preferred_batch_size else self.max_batch_size
        self.delay_ns = db.max_queue_delay_microseconds * 1000
        self.levels = tuple(range(1, db.priority_levels + 1)) if db.priority_levels > 0 else (0,)
        self.default_level = db.default_priority_level if db.priority_levels > 0 else 0
        self._policies: dict[int, QueuePolicy] = {level: db.queue_policy(level) for level in self.levels}
        #: Whether every request is at level 0 (no priority levels), and whether any can
        #: have a deadline (a default timeout, or its own where overriding is allowed):
        #: when not, the batcher skips asking ``level_for`` and ``deadline_for`` per request.
        self.single_level = self.levels == (0,)
        self.timed = any(
            policy.default_timeout_microseconds > 0 or policy.allow_timeout_override
            for policy in self._policies.values()
        )
        #: Whether any level has a max_queue_size.
        self.bounded = any(policy.max_queue_size > 0 for policy in self._policies.values())
        self._normal: dict[int, deque[Entry]] = {level: deque() for level in self.levels}
        self._delayed: dict[int, deque[Entry]] = {level: deque() for level in self.levels}
        self._sizes: dict[int, int] = {level: 0 for level in self.levels}
        #: per level: requests taken in a batch that was handed to an instance ahead of time
        #: and has not begun yet: still waiting, so they count against max_queue_size
        self._held: dict[int, int] = {level: 0 for level in self.levels}
        self._deadlines: list[tuple[int, int, Entry]] = []
        self._live = 0
        #: the requests the live entries stand for (``QueuedRequest.count``)
        self.waiting = 0
        #: the summed cost of the live requests (what ``full`` compares)
        self.queued_cost = 0
        #: ``splitter(entry, count)``: the first ``count`` requests of a queued ``entry`` as
        #: an entry of their own for the batch being taken (never queued), ``entry`` left
        #: holding the rest (its cost and count the queue's to set); None: entries are
        #: never cut
        self.splitter: Callable[[Entry, int], Entry] | None = None

    def __len__(self) -> int:
        return self._live

    @property
    def full(self) -> bool:
        """Whether enough work is queued that a batch could leave at once whatever the
        delay (the largest preferred size, or max_batch_size): a cheap, necessary
        condition for ``decide(now, only_full=True)`` to take one."""
        return self.queued_cost >= (self.max_preferred if self.batching else 1)

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Change the batch bound (preferred sizes above it are ignored)."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: expected an integer >= 1, got {max_batch_size}")
        self.max_batch_size = max_batch_size
        preferred = [size for size in self._configured_preferred if size <= max_batch_size]
        self.preferred = frozenset(preferred)
        self.max_preferred = max(preferred) if preferred else max_batch_size

    def set_max_queue_delay(self, microseconds: int) -> None:
        if microseconds < 0:
            raise ValueError(f"max_queue_delay_microseconds: expected an integer >= 0, got {microseconds}")
        self.delay_ns = microseconds * 1000

    def policy(self, level: int) -> QueuePolicy:
        return self._policies[level]

    def level_for(self, priority: int) -> int:
        """The queue level for a request's ``priority`` parameter (0 or out of range: the
        default level, as Triton does)."""
        if self.levels == (0,):
            return 0
        if 1 <= priority <= len(self.levels):
            return priority
        return self.default_level

    def deadline_for(self, level: int, now_ns: int, timeout_us: int | None) -> int:
        """The request's timeout deadline (0: none). The request's own ``timeout`` counts
        only with ``allow_timeout_override``."""
        policy = self._policies[level]
        timeout = policy.default_timeout_microseconds
        if timeout_us is not None and policy.allow_timeout_override:
            timeout = timeout_us
        return now_ns + timeout * 1000 if timeout > 0 else 0

    def push(self, item: Entry) -> None:
        """Queue a request. Raises QueueFullError when its level holds max_queue_size."""
        policy = self._policies[item.level]
        if policy.max_queue_size > 0 and self._sizes[item.level] + self._held[item.level] >= policy.max_queue_size:
            raise QueueFullError("Exceeds maximum queue size")
        item.timeout_action = policy.timeout_action
        self._normal[item.level].append(item)
        self._sizes[item.level] += 1
        self._live += 1
        self.waiting += item.count
        self.queued_cost += item.cost
        if item.deadline_ns:
            heapq.heappush(self._deadlines, (item.deadline_ns, item.seq, item))

    def push_many(self, items: Sequence[Entry]) -> int:
        """Queue ``items``, all of one level, in order: as many as its max_queue_size lets
        in (``push`` for each, with one look at the room). Returns how many were queued;
        the rest are refused, as ``push`` refuses one."""
        if not items:
            return 0
        level = items[0].level
        policy = self._policies[level]
        count = len(items)
        if policy.max_queue_size > 0:
            count = max(0, min(count, policy.max_queue_size - self._sizes[level] - self._held[level]))
            items = items[:count]
        cost = requests = 0
        action = policy.timeout_action
        for item in items:
            item.timeout_action = action
            cost += item.cost
            requests += item.count
            if item.deadline_ns:
                heapq.heappush(self._deadlines, (item.deadline_ns, item.seq, item))
        self._normal[level].extend(items)
        self._sizes[level] += count
        self._live += count
        self.waiting += requests
        self.queued_cost += cost
        return count

    @property
    def held(self) -> int:
        """Requests of batches handed over ahead of time that have not begun (``hold``)."""
        return sum(self._held.values())

    def hold(self, batch: tuple[Entry, ...]) -> None:
        """``batch`` (just taken) waits on in its instance: its requests keep counting
        against max_queue_size until ``release``."""
        for item in batch:
            self._held[item.level] += item.count

    def release(self, batch: tuple[Entry, ...]) -> None:
        """A held batch began (or was given up): its requests no longer wait."""
        for item in batch:
            self._held[item.level] -= item.count

    def recost(self, item: Entry, cost: int, count: int) -> None:
        """A queued entry costs ``cost`` and stands for ``count`` requests from now on (a
        bundle lost one)."""
        if not item.removed:
            self.queued_cost += cost - item.cost
            self.waiting += count - item.count
        item.cost = cost
        item.count = count

    def discard(self, item: Entry) -> bool:
        """Take a request out (its caller went away). True if it was still queued."""
        if item.removed:
            return False
        self._remove(item)
        return True

    def _remove(self, item: Entry) -> None:
        item.removed = True
        self._sizes[item.level] -= 1
        self._live -= 1
        self.waiting -= item.count
        self.queued_cost -= item.cost

    def expire(self, now_ns: int) -> tuple[Entry, ...]:
        """Apply timeouts due at ``now_ns`` without forming a batch: REJECT requests are
        removed and returned (to be failed), DELAY requests move behind the others."""
        return self._expire(now_ns)

    def decide(self, now_ns: int, *, flush: bool = False, only_full: bool = False) -> Decision[Entry]:
        """Expire timed-out requests, then take a batch if one is due at ``now_ns``.

        ``flush`` treats the queue delay as expired (used while draining on unload);
        ``only_full`` takes a batch only if it is full (it reaches the largest preferred
        size or max_batch_size: nothing arriving later could make it larger), as the
        batcher does to hand an instance its next batch while the current one runs."""
        expired = self._expire(now_ns)
        if not self.batching:
            for item in self._in_order():
                self._take((item,))
                return Decision((item,), expired, None)
            return Decision((), expired, self._next_deadline())

        items: list[Entry] = []
        pending = 0
        best_count = 0
        send_now = False
        signature: Hashable = None
        cut = 0  # how many requests of ``items[-1]`` the batch takes, when it takes part of it
        for item in self._in_order():
            cost = item.cost
            if pending + cost > self.max_batch_size and (not items or item.signature == signature):
                cut = self._part_that_fits(item, self.max_batch_size - pending)
                if cut:
                    cost = cost // item.count * cut  # the part that fits: the batch ends with it
            if items:
                if pending + cost > self.max_preferred and best_count == 0:
                    best_count = len(items)
                if pending + cost > self.max_batch_size or item.signature != signature:
                    send_now = True
                    break
            else:
                signature = item.signature
            items.append(item)
            pending += cost
            if pending in self.preferred:
                best_count = len(items)
            if cut or pending >= self.max_batch_size:
                send_now = True
                break
        if not items:
            return Decision((), expired, self._next_deadline())
        if only_full and pending < self.max_preferred:
            return Decision((), expired, None)

        oldest = self._oldest_enqueue_ns()
        delay_exceeded = flush or (self.delay_ns != 0 and now_ns - oldest >= self.delay_ns)
        if best_count and not delay_exceeded:
            batch = tuple(items[:best_count])
        elif send_now or pending >= self.max_preferred or delay_exceeded or self.delay_ns == 0:
            batch = tuple(items)
        else:
            wake = oldest + self.delay_ns
            deadline = self._next_deadline()
            if deadline is not None:
                wake = min(wake, deadline)
            return Decision((), expired, wake)
        if cut and len(batch) == len(items):  # its last entry's first requests; the rest wait on
            batch = batch[:-1] + (self._split(batch[-1], cut),)
            self._take(batch[:-1])
        else:
            self._take(batch)
        return Decision(batch, expired, None)

    # -- internals -------------------------------------------------------------------

    def _part_that_fits(self, item: Entry, room: int) -> int:
        """How many of the alike requests ``item`` stands for fit in ``room`` (0: it is
        not to be cut)."""
        count = item.count
        if self.splitter is None or count <= 1 or item.cost % count:
            return 0
        each = item.cost // count
        return min(room // each, count - 1) if each > 0 else 0

    def _split(self, item: Entry, count: int) -> Entry:
        """The first ``count`` requests of queued ``item``, taken as an entry of their own;
        ``item`` keeps its place with the rest."""
        assert self.splitter is not None
        part = self.splitter(item, count)
        part.removed = True  # taken: it never was in the queue
        self.recost(item, item.cost - part.cost, item.count - part.count)
        return part

    def _in_order(self) -> Iterator[Entry]:
        for level in self.levels:
            normal = self._normal[level]
            while normal and (normal[0].removed or normal[0].delayed):
                normal.popleft()
            for item in normal:
                if not (item.removed or item.delayed):
                    yield item
            delayed = self._delayed[level]
            while delayed and delayed[0].removed:
                delayed.popleft()
            for item in delayed:
                if not item.removed:
                    yield item

    def _take(self, batch: tuple[Entry, ...]) -> None:
        for item in batch:
            self._remove(item)
        # Taken items are a prefix of the live order: drop them from the deque heads.
        for level in self.levels:
            normal = self._normal[level]
            while normal and (normal[0].removed or normal[0].delayed):
                normal.popleft()
            delayed = self._delayed[level]
            while delayed and delayed[0].removed:
                delayed.popleft()

    def _expire(self, now_ns: int) -> tuple[Entry, ...]:
        heap = self._deadlines
        if not heap or heap[0][0] > now_ns:
            return ()
        expired: list[Entry] = []
        while heap and heap[0][0] <= now_ns:
            _, _, item = heapq.heappop(heap)
            if item.removed or item.delayed:
                continue
            if item.timeout_action == "DELAY":
                # Stays live, but moves behind every unexpired request of its level.
                item.delayed = True
                self._delayed[item.level].append(item)
            else:
                self._remove(item)
                expired.append(item)
        return tuple(expired)

    def _next_deadline(self) -> int | None:
        heap = self._deadlines
        while heap and (heap[0][2].removed or heap[0][2].delayed):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _oldest_enqueue_ns(self) -> int:
        oldest: int | None = None
        for item in self._heads():
            if oldest is None or item.enqueued_ns < oldest:
                oldest = item.enqueued_ns
        return oldest if oldest is not None else 0

    def _heads(self) -> Iterator[Entry]:
        """The first live request of each level's normal and delayed queue."""
        for level in self.levels:
            for item in self._normal[level]:
                if not (item.removed or item.delayed):
                    yield item
                    break
            for item in self._delayed[level]:
                if not item.removed:
                    yield item
                    break
