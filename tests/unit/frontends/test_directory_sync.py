"""directory_sync: the main process's picture of the models kept in each front-end
worker's copy, through DIRECTORY messages and a shared generation that makes a copy
unusable the moment something changes (a stub loader: no model files run)."""

from __future__ import annotations

import asyncio
import os
import pickle
from typing import Any

import pytest

from nereid.frontends.directory_sync import DirectoryCopy, DirectoryPublisher, SharedGeneration
from nereid.frontends.messages import Kind
from nereid.models.directory import Directory
from nereid.models.manager import ModelManager
from tests.conftest import IDENTITY_CONFIG, RepoBuilder
from tests.unit.models.test_manager import StubLoader
from tests.unit.manual_clock import next_turn


class FakeLink:
    """A worker's link: what the publisher sends, as the worker would read it (pickled)."""

    def __init__(self) -> None:
        self.messages: list[tuple[Any, ...]] = []
        self.arrived = asyncio.Event()

    def send(self, message: tuple[Any, ...]) -> None:
        self.messages.append(pickle.loads(pickle.dumps(message)))
        self.arrived.set()

    def deliver(self, copy: DirectoryCopy) -> int:
        """Hand every message to ``copy`` (as MainLink does); how many there were."""
        messages, self.messages = self.messages, []
        self.arrived.clear()
        for message in messages:
            assert message[0] == Kind.DIRECTORY.value
            copy.update(*message[1:])
        return len(messages)


async def settle(link: FakeLink, copy: DirectoryCopy) -> None:
    """Deliver pictures until the copy is current (no change since the last one)."""
    link.deliver(copy)
    while copy.current() is None:
        await link.arrived.wait()
        link.deliver(copy)


def test_a_shared_generation_bumped_in_one_mapping_is_read_in_another() -> None:
    main = SharedGeneration.create()
    worker = SharedGeneration.attach(os.dup(main.fd))
    assert (main.read(), worker.read()) == (0, 0)
    assert main.bump() == 1 and worker.read() == 1
    worker.close()
    main.close()


def run(repo: RepoBuilder, scenario: Any) -> None:
    loader = StubLoader()

    async def main() -> None:
        manager = ModelManager(repo.root, mode="explicit", startup_models=["m"], loader=loader)
        generation = SharedGeneration.create()
        publisher = DirectoryPublisher(manager, generation)
        copy = DirectoryCopy(SharedGeneration.attach(os.dup(generation.fd)))
        publisher.start()
        try:
            await manager.start()
            await scenario(manager, loader, publisher, copy)
        finally:
            publisher.close()
            await manager.aclose()
            generation.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_joining_worker_gets_the_whole_picture_and_each_change_after(repo: RepoBuilder) -> None:
    repo.add("m", IDENTITY_CONFIG)

    async def scenario(manager: ModelManager, loader: StubLoader, publisher: DirectoryPublisher,
                       copy: DirectoryCopy) -> None:
        assert copy.current() is None  # nothing received yet
        link = FakeLink()
        publisher.join(0, link)
        assert link.deliver(copy) == 1
        assert copy.current() == Directory.of(manager) and copy.current().get("m").version == 1  # type: ignore[union-attr]
        unload = asyncio.create_task(manager.unload("m"))
        while copy.current() is not None:  # the change is seen by the worker at once ...
            await next_turn()
        await unload
        await settle(link, copy)  # ... and the new picture comes at the end of the loop turn
        assert copy.current() == Directory.of(manager)
        with pytest.raises(Exception, match="'m' has no available versions; version 1 is UNAVAILABLE: unloaded"):
            copy.current().get("m")  # type: ignore[union-attr]
        later = FakeLink()
        publisher.join(1, later)
        fresh = DirectoryCopy(copy.shared)
        later.deliver(fresh)
        assert fresh.current() == copy.current()

    run(repo, scenario)


def test_a_model_forgotten_by_the_manager_is_forgotten_by_the_copy(repo: RepoBuilder) -> None:
    repo.add("m", IDENTITY_CONFIG)

    async def scenario(manager: ModelManager, loader: StubLoader, publisher: DirectoryPublisher,
                       copy: DirectoryCopy) -> None:
        link = FakeLink()
        publisher.join(0, link)
        link.deliver(copy)
        with pytest.raises(Exception, match="model folder not found"):
            await manager.load("nothing")  # known for a moment (its record), then forgotten
        await settle(link, copy)
        assert copy.current() == Directory.of(manager)
        assert "nothing" not in copy.current().models  # type: ignore[union-attr]

    run(repo, scenario)
