"""RepositoryPoller: poll mode's watcher. Every ``poll_secs`` it fingerprints the model
folders (off the event loop) and has the manager act on the changes that held still for
one poll: removed models unload, new ones load, changed ones reload.

Decides nothing itself (``repository.watch.ChangeDetector`` does) and loads nothing
itself: it calls the manager's ``load`` and ``unload``, which log their failures.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from nereid.repository.scan import Repositories, RepositoryScan
from nereid.repository.watch import ChangeDetector, Changes, fingerprint_scan

__all__ = ["RepositoryPoller"]

_log = logging.getLogger("nereid")


class RepositoryPoller:
    """Polls ``repositories`` every ``poll_secs`` once started; ``load(name)`` and
    ``unload(name)`` act on what changed (they must not raise for one model's failure)."""

    def __init__(
        self, repositories: Repositories, poll_secs: float,
        load: Callable[[str], Awaitable[None]], unload: Callable[[str], Awaitable[None]],
    ) -> None:
        self.repositories = repositories
        self.poll_secs = poll_secs
        self._load = load
        self._unload = unload
        self._detector: ChangeDetector | None = None
        self._task: asyncio.Task[None] | None = None

    async def take_baseline(self, scan: RepositoryScan) -> None:
        """Remember ``scan``'s fingerprints as what the server acts on. Taken before the
        start-up load: a change made while models load is seen by the first polls."""
        self._detector = ChangeDetector(await asyncio.to_thread(fingerprint_scan, scan))

    def start(self) -> None:
        """Poll every ``poll_secs`` until ``aclose()``."""
        self._task = asyncio.create_task(self._poll_forever(), name="nereid-repository-poll")
        _log.info("polling %s for changes every %g s", self.repositories, self.poll_secs)

    async def aclose(self) -> None:
        """Stop polling (a poll under way is cancelled)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def poll(self) -> Changes:
        """Look at the repository once and act on the changes that have held still for
        one poll; returns what it acted on. The first poll without a baseline only takes
        one."""
        scan = await asyncio.to_thread(self.repositories.scan)
        if self._detector is None:
            await self.take_baseline(scan)
            return Changes()
        # A name now in two repositories is left out of the fingerprints: it unloads, as in Triton.
        current = await asyncio.to_thread(fingerprint_scan, scan)
        changes = self._detector.observe(current)
        for name in changes.removed:
            _log.info("repository poll: '%s' was removed", name)
        for name in changes.added:
            _log.info("repository poll: '%s' was added", name)
        for name in changes.modified:
            _log.info("repository poll: '%s' changed", name)
        await asyncio.gather(
            *(self._unload(name) for name in changes.removed),
            *(self._load(name) for name in changes.added + changes.modified),
        )
        # A name now in two repositories: its load fails, so the index says why it went.
        await asyncio.gather(*(self._load(name) for name in changes.removed if name in scan.duplicates))
        return changes

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_secs)
            try:
                await self.poll()
            except Exception:  # a failed poll must not end polling
                _log.exception("repository poll of %s failed", self.repositories)
