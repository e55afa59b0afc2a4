"""RepositoryPoller: poll mode's watcher acts on a model folder's change once it held still
for one poll, through the load and unload it is given (recorded here, nothing loads)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from nereid.models.poller import RepositoryPoller
from nereid.repository.scan import Repositories
from tests.conftest import IDENTITY_CONFIG, RepoBuilder

pytestmark = pytest.mark.unit


class Recorded:
    """The poller's calls to load and unload, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def load(self, name: str) -> None:
        self.calls.append(("load", name))

    async def unload(self, name: str) -> None:
        self.calls.append(("unload", name))


def poller_over(*folders: Path) -> tuple[RepositoryPoller, Recorded]:
    recorded = Recorded()
    return RepositoryPoller(Repositories(folders), 3600, load=recorded.load, unload=recorded.unload), recorded


def test_the_first_poll_without_a_baseline_takes_one_and_acts_on_nothing(repo: RepoBuilder) -> None:
    repo.add("a", IDENTITY_CONFIG)
    poller, recorded = poller_over(repo.root)

    async def scenario() -> None:
        first = await poller.poll()
        assert (first.added, first.modified, first.removed) == ((), (), ())
        assert (await poller.poll()).added == ()  # "a" was in the baseline

    asyncio.run(scenario())
    assert recorded.calls == []


def test_a_new_folder_loads_and_a_removed_one_unloads_once_each_held_still(repo: RepoBuilder) -> None:
    poller, recorded = poller_over(repo.root)

    async def scenario() -> None:
        await poller.take_baseline(Repositories([repo.root]).scan())
        folder = repo.add("a", IDENTITY_CONFIG)
        assert (await poller.poll()).added == ()  # seen, not yet still
        assert (await poller.poll()).added == ("a",)
        assert recorded.calls == [("load", "a")]
        shutil.rmtree(folder)
        await poller.poll()
        assert (await poller.poll()).removed == ("a",)

    asyncio.run(scenario())
    assert recorded.calls == [("load", "a"), ("unload", "a")]


def test_a_name_now_in_two_repositories_unloads_then_fails_to_load(tmp_path: Path) -> None:
    first, second = RepoBuilder(tmp_path / "one"), RepoBuilder(tmp_path / "two")
    first.add("a", IDENTITY_CONFIG)
    second.root.mkdir()
    poller, recorded = poller_over(first.root, second.root)

    async def scenario() -> None:
        await poller.take_baseline(Repositories([first.root, second.root]).scan())
        second.add("a", IDENTITY_CONFIG)
        await poller.poll()
        assert (await poller.poll()).removed == ("a",)

    asyncio.run(scenario())
    # the load is what says why it went (the manager's load fails naming both folders)
    assert recorded.calls == [("unload", "a"), ("load", "a")]


def test_polling_stops_at_aclose(repo: RepoBuilder) -> None:
    poller, recorded = poller_over(repo.root)

    async def scenario() -> None:
        poller.start()
        await poller.aclose()
        await poller.aclose()  # a second close is a no-op

    asyncio.run(scenario())
    assert recorded.calls == []
