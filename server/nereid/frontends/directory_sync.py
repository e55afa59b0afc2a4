"""The model manager's Directory (models/directory.py) kept in every front-end worker, so
that a worker answers health, metadata and config itself, and never with a picture
older than what the main process has confirmed.

The main process's ``DirectoryPublisher`` takes a new picture after each change the
manager reports (``ModelManager.on_change``: loads, unloads, states, start-up, shutdown)
and sends each worker what changed (a DIRECTORY message: the models whose facts changed,
by name). A worker that joins gets the whole picture. A READY version's ``problem`` (a
process instance restarting, a batch stuck past its timeout) changes on its own, unseen:
readiness that reads one that can is left to the main process (``Directory.settled``).

Ordering: a message can be read by a worker after a request that a client sent once the
main process confirmed a change (a load answered through another worker, or over gRPC).
So each change also bumps a ``SharedGeneration`` (a counter in shared memory, written
before anything is confirmed), and each picture carries the generation it was taken at:
a worker answers from its picture only while that is the shared generation, and forwards
the request to the main process otherwise (``DirectoryCopy.current``).

When the workers answer statistics too (shared_stats.py), each message also carries the
row of the statistics table that holds each served version's figures (``stats_rows``),
taken with the picture.
"""

from __future__ import annotations

import asyncio
import mmap
import os
from typing import Any, Callable, Mapping

import numpy as np

from nereid.frontends.messages import Kind
from nereid.models.directory import Directory, ModelFacts
from nereid.models.manager import ModelManager

__all__ = ["DirectoryCopy", "DirectoryPublisher", "SharedGeneration"]

_DIRECTORY = Kind.DIRECTORY.value


class SharedGeneration:
    """One counter in shared memory: the main process bumps it, workers read it.
    ``create()`` in the main process, ``attach(fd)`` in a worker handed the descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, 8)
        self._cell: np.ndarray[Any, np.dtype[np.int64]] = np.ndarray((1,), np.int64, buffer=self._map)

    @classmethod
    def create(cls) -> SharedGeneration:
        fd = os.memfd_create("nereid-frontend-directory", 0)
        os.ftruncate(fd, 8)
        return cls(fd)

    @classmethod
    def attach(cls, fd: int) -> SharedGeneration:
        return cls(fd)

    def read(self) -> int:
        return int(self._cell[0])

    def bump(self) -> int:
        value = int(self._cell[0]) + 1
        self._cell[0] = value
        return value

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)


class DirectoryPublisher:
    """The main process's side: pictures of ``manager`` for every worker's link.
    ``start()`` follows the manager's changes, ``close()`` stops; ``join(index, link)``
    sends a worker the whole picture, and the changes from then on. ``stats_rows``: the
    statistics rows of the versions the manager serves now (``StatsPublisher.sync``),
    sent with each picture (None: the workers do not answer statistics)."""

    def __init__(self, manager: ModelManager, generation: SharedGeneration,
                 stats_rows: Callable[[], dict[tuple[str, int], int]] | None = None) -> None:
        self.manager = manager
        self.generation = generation
        self.stats_rows = stats_rows
        #: each worker's link (frontends.link.WorkerLink: what is used of it is ``send``)
        self._links: dict[int, Any] = {}
        self._sent: Directory | None = None
        self._scheduled = False

    def start(self) -> None:
        self.manager.on_change.append(self.changed)

    def close(self) -> None:
        if self.changed in self.manager.on_change:
            self.manager.on_change.remove(self.changed)

    def join(self, index: int, link: Any) -> None:
        """Worker ``index`` (a new one, or one replacing it) and its link."""
        self._links[index] = link
        directory = Directory.of(self.manager)  # now: changes not yet published are in it
        if self._sent is None:
            self._sent = directory
        link.send(self._message(directory, directory.models, whole=True))

    def changed(self) -> None:
        """What the manager shows changed: workers stop answering from their pictures at
        once (the shared generation), and get the new one at the end of this loop turn."""
        self.generation.bump()
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._publish)

    def _publish(self) -> None:
        self._scheduled = False
        directory = Directory.of(self.manager)
        before = self._sent.models if self._sent is not None else {}
        changes: dict[str, ModelFacts | None] = {
            name: facts for name, facts in directory.models.items() if before.get(name) != facts
        }
        changes.update((name, None) for name in before if name not in directory.models)
        self._sent = directory
        message = self._message(directory, changes, whole=False)
        for link in self._links.values():
            link.send(message)

    def _message(
        self, directory: Directory, models: Mapping[str, ModelFacts | None], *, whole: bool,
    ) -> tuple[Any, ...]:
        rows = self.stats_rows() if self.stats_rows is not None else None
        return (_DIRECTORY, self.generation.read(), directory.ready, directory.ready_strict, dict(models), whole, rows)


class DirectoryCopy:
    """The worker's side: the picture the main process sent, and the generation it was
    taken at. ``current()`` is it while no change has happened since (else None: ask
    the main process). Before the first message there is none."""

    def __init__(self, generation: SharedGeneration) -> None:
        self.shared = generation
        self._generation = -1
        self._directory = Directory(False, False, {})
        #: each served version's row in the statistics table (shared_stats.py), as of the
        #: picture: empty when the workers do not answer statistics
        self.stats_rows: Mapping[tuple[str, int], int] = {}

    def update(self, generation: int, ready: bool, ready_strict: bool, models: dict[str, ModelFacts | None],
               whole: bool, stats_rows: dict[tuple[str, int], int] | None = None) -> None:
        known = {} if whole else dict(self._directory.models)
        for name, facts in models.items():
            if facts is None:
                known.pop(name, None)
            else:
                known[name] = facts
        self._directory = Directory(ready, ready_strict, known)
        self.stats_rows = stats_rows if stats_rows is not None else {}
        self._generation = generation

    def current(self) -> Directory | None:
        return self._directory if self._generation == self.shared.read() else None
