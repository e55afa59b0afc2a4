"""Every served version's statistics in shared memory, so that a front-end worker answers
statistics itself (HTTP's ``/stats`` routes, gRPC's ModelStatistics) with the bytes the
main process would answer, and exactly: a client answered through one worker that asks
through another sees its request counted.

The main process's ``StatsPublisher`` keeps a row of the ``StatsTable`` for each version
the manager serves (``sync``: after each change the manager reports, with the picture of
the models -- directory_sync.py sends the rows to the workers with it) and writes again
every row whose figures changed (``publish``: ``ModelStats.changed``, and only the batch
sizes that changed) just before it writes anything to any worker (``WorkerLink``): the
figures a batch added are in the table before its answers leave the main process, and a
worker's answer is the main process's answer at the moment of its last write to a
worker; and every ``PUBLISH_EVERY_S`` (``keep_publishing``), for figures no write
follows (a request that failed after its client left). Nothing of this runs without workers (the records only set a flag). A worker
reads what a request asks for (``StatisticsCopy.read``) under two counters: the table's
sequence (a seqlock: odd while the main process writes, a read that saw it odd or changed
is read again) and the directory's shared generation (a row changes hands only after a
change the generation counts: a read across one is left to the main process). A row holds ``ModelStats.counters()``: restarts (-1: no process
instances), their length, the head, then one slot per batch size, in the order they came.

Left to the main process (the worker forwards or relays the request): a read that does
not settle (the main process stopped mid-write), a version past the table's ``ROWS``, a
version with more batch sizes than a row holds (``BATCH_SIZES_PER_ROW``), and every
statistics request while the worker's picture is older than a change (as for metadata).

Stores are ordered as the CPU makes them: x86-64's order (total store order) is what the
seqlock relies on, as ``SharedGeneration`` does.
"""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Iterable

from nereid.frontends.directory_sync import DirectoryCopy
from nereid.models.directory import StatisticsPicture, VersionStatistics
from nereid.models.manager import ModelManager, ServingModel
from nereid.stats import COUNTERS_HEAD, COUNTERS_PER_BATCH_SIZE, ModelStats

__all__ = ["BATCH_SIZES_PER_ROW", "ROWS", "StatisticsCopy", "StatsPublisher", "StatsTable"]

#: how often the main process writes figures no answer carried (StatsPublisher.keep_publishing)
PUBLISH_EVERY_S = 0.01
#: served versions the table holds (pages are only made as rows are written)
ROWS = 1024
#: int64 cells per row: restarts (-1: no process instances), the counters' length
#: (-1: they did not fit), the counters
_ROW_CELLS = 1024
_ROW_BYTES = _ROW_CELLS * 8
#: distinct batch sizes a row holds
BATCH_SIZES_PER_ROW = (_ROW_CELLS - 2 - COUNTERS_HEAD) // COUNTERS_PER_BATCH_SIZE
_HEADER_BYTES = 64  # the sequence counter, alone on its cache line
_SIZE = _HEADER_BYTES + ROWS * _ROW_BYTES
_HEAD = struct.Struct("<2q")
_HEAD_ROW = struct.Struct(f"<{2 + COUNTERS_HEAD}q")
_BATCH_SIZE = struct.Struct(f"<{COUNTERS_PER_BATCH_SIZE}q")
#: tries of a read before the request is left to the main process
_ATTEMPTS = 100


class StatsTable:
    """The shared rows and their sequence counter. ``create()`` in the main process,
    ``attach(fd)`` in a worker handed the descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, _SIZE)
        #: one aligned 8-byte cell: ctypes reads and writes it whole
        self._sequence = ctypes.c_int64.from_buffer(self._map)

    @classmethod
    def create(cls) -> StatsTable:
        fd = os.memfd_create("nereid-frontend-statistics", 0)
        os.ftruncate(fd, _SIZE)
        return cls(fd)

    @classmethod
    def attach(cls, fd: int) -> StatsTable:
        return cls(fd)

    def sequence(self) -> int:
        return self._sequence.value

    def begin(self) -> None:
        """Rows are being written (readers wait or read again)."""
        self._sequence.value += 1

    def end(self) -> None:
        self._sequence.value += 1

    def write(self, row: int, restarts: int, counters: list[int]) -> None:
        """Row ``row`` (between ``begin`` and ``end``): ``ModelStats.counters()``, or its
        head alone (``ModelStats.head_counters()``: the batch sizes' figures are written
        apart, ``write_batch_size``). Figures that do not fit are marked so (readers leave
        them to the main process)."""
        offset = _HEADER_BYTES + row * _ROW_BYTES
        sizes = counters[COUNTERS_HEAD - 1]
        length = COUNTERS_HEAD + sizes * COUNTERS_PER_BATCH_SIZE
        if sizes > BATCH_SIZES_PER_ROW:
            _HEAD.pack_into(self._map, offset, restarts, -1)
            return
        if len(counters) == COUNTERS_HEAD:
            _HEAD_ROW.pack_into(self._map, offset, restarts, length, *counters)
        else:
            struct.pack_into(f"<{length + 2}q", self._map, offset, restarts, length, *counters)

    def write_batch_size(self, row: int, slot: int, counters: tuple[int, ...]) -> None:
        """The figures of one batch size (``ModelStats.batch_counters``) in slot ``slot``
        of row ``row`` (slots past the row's size are not kept)."""
        if slot < BATCH_SIZES_PER_ROW:
            offset = _HEADER_BYTES + row * _ROW_BYTES + (2 + COUNTERS_HEAD + slot * COUNTERS_PER_BATCH_SIZE) * 8
            _BATCH_SIZE.pack_into(self._map, offset, *counters)

    def read(self, row: int) -> tuple[int, tuple[int, ...]] | None:
        """Row ``row``'s restarts and counters (None: they did not fit); torn while the
        main process writes: read between two equal even sequence numbers."""
        offset = _HEADER_BYTES + row * _ROW_BYTES
        restarts, length = _HEAD.unpack_from(self._map, offset)
        if not 0 <= length <= _ROW_CELLS - 2:
            return None
        return restarts, struct.unpack_from(f"<{length}q", self._map, offset + _HEAD.size)

    def close(self) -> None:
        del self._sequence
        self._map.close()
        os.close(self.fd)


@dataclass(slots=True)
class _Row:
    """A served version's row: its figures, whether it has been written yet, the
    restarts it was last written with, and the slot of each batch size in it."""

    index: int
    serving: ServingModel
    stats: ModelStats
    process: bool
    written: bool = False
    restarts: int = -1
    slots: dict[int, int] = field(default_factory=dict)


class StatsPublisher:
    """The main process's side: the rows of ``manager``'s served versions in ``table``."""

    def __init__(self, manager: ModelManager, table: StatsTable) -> None:
        self.manager = manager
        self.table = table
        self._rows: dict[tuple[str, int], _Row] = {}
        self._free = list(range(ROWS - 1, -1, -1))

    def sync(self) -> dict[tuple[str, int], int]:
        """A row for each version the manager serves now (written at once when new, or
        when its version was loaded again); each (model, version)'s row, for the workers."""
        serving = {(name, number): version for name, record in self.manager.records.items()
                   for number, version in record.serving.items()}
        for key in [key for key in self._rows if key not in serving]:
            self._free.append(self._rows.pop(key).index)
        for key, version in serving.items():
            row = self._rows.get(key)
            if row is None:
                if not self._free:
                    continue  # past the table: its statistics are asked of the main process
                self._rows[key] = _Row(self._free.pop(), version, version.stats, version.has_process_instances)
            elif row.serving is not version:
                self._rows[key] = _Row(row.index, version, version.stats, version.has_process_instances)
        self.publish()
        return {key: row.index for key, row in self._rows.items()}

    def publish(self) -> None:
        """Write again every row whose figures changed since it was last written
        (``ModelStats.changed``; a version with process instances: or its restarts), in
        one write of the table. Called before anything is written to a worker."""
        table = self.table
        writing = False
        for row in self._rows.values():
            if row.stats.changed or not row.written or (row.process and row.serving.restarts != row.restarts):
                if not writing:
                    writing = True
                    table.begin()
                self._write(row)
        if writing:
            table.end()

    async def keep_publishing(self) -> None:
        """``publish`` every ``PUBLISH_EVERY_S`` as well: figures that no write to a worker
        follows (a request failed after its client left, a stream abandoned) reach the
        workers within that time; those of an answer are there before the answer leaves."""
        while True:
            await asyncio.sleep(PUBLISH_EVERY_S)
            self.publish()

    def _write(self, row: _Row) -> None:
        """Row ``row`` again: its head, and the batch sizes whose figures changed (all of
        them the first time), each in its slot (in the order the sizes first came)."""
        stats = row.stats
        stats.changed = False
        restarts = row.restarts = row.serving.restarts if row.process else -1
        slots = row.slots
        if not row.written:
            row.written = True
            slots.clear()
            sizes: Iterable[int] = stats.batch_stats
        else:
            sizes = stats.changed_batch_sizes
        for size in sizes:
            slot = slots.get(size)
            if slot is None:
                slot = slots[size] = len(slots)
            self.table.write_batch_size(row.index, slot, stats.batch_counters(size))
        stats.changed_batch_sizes.clear()
        self.table.write(row.index, restarts, stats.head_counters())


class StatisticsCopy:
    """A worker's side: the figures of the versions a request asks about, read from
    ``table`` for the picture ``directory`` holds (its rows come with it)."""

    def __init__(self, table: StatsTable, directory: DirectoryCopy) -> None:
        self.table = table
        self.directory = directory

    def read(self, name: str | None) -> StatisticsPicture | None:
        """Every served version's figures (``name`` None), or model ``name``'s; None when
        the main process must answer (see the module's docstring)."""
        directory = self.directory.current()
        if directory is None:
            return None
        rows = self.directory.stats_rows
        wanted: list[tuple[str, int, int]] = []
        for model in ([name] if name else directory.models):
            facts = directory.models.get(model)
            for number in sorted(facts.serving) if facts is not None else ():
                row = rows.get((model, number))
                if row is None:
                    return None
                wanted.append((model, number, row))
        read = self._read_rows([row for _, _, row in wanted])
        if read is None or self.directory.current() is not directory:
            return None
        models: dict[str, list[VersionStatistics]] = {}
        for (model, number, _), (restarts, counters) in zip(wanted, read):
            stats = ModelStats.from_counters(model, number, counters)
            models.setdefault(model, []).append(VersionStatistics(number, stats, restarts >= 0, max(restarts, 0)))
        return StatisticsPicture(models)

    def _read_rows(self, rows: list[int]) -> list[tuple[int, tuple[int, ...]]] | None:
        table = self.table
        for _ in range(_ATTEMPTS):
            start = table.sequence()
            if start & 1:
                continue
            read = [table.read(row) for row in rows]
            if table.sequence() == start:
                if any(entry is None for entry in read):
                    return None  # figures past a row's size
                return [entry for entry in read if entry is not None]
        return None

