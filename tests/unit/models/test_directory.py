"""Directory: a picture of the model manager that answers ``get``, ``model_versions`` and
``is_ready`` word for word as the manager does; ``ModelManager.on_change`` announces every
change to what the manager shows, so a picture taken at the last announcement is always
the current one. A stub loader (test_manager.py's): no model files run."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

from nereid.errors import NereidError
from nereid.models.directory import Directory, Lookup
from nereid.models.manager import ModelManager
from tests.conftest import IDENTITY_CONFIG, RepoBuilder
from tests.unit.models.test_manager import ALL_VERSIONS, StubLoader, wait

NAMES = ("m", "other", "broken", "nothing")


def answers(lookup: Lookup) -> list[Any]:
    """Everything the health, metadata and config answers read, errors by class and words."""
    seen: list[Any] = []
    for name in NAMES:
        for version in (None, 1, 2, 3, 99):
            try:
                served = lookup.get(name, version)
            except NereidError as exc:
                seen.append((name, version, type(exc).__name__, exc.message))
            else:
                seen.append((name, version, served.version, served.config, served.config_json, served.problem))
        seen.append((name, [served.version for served in lookup.model_versions(name)]))
    seen.append((lookup.is_ready(strict=True), lookup.is_ready(strict=False)))
    return seen


class Pictures:
    """A picture of the manager taken at each announcement."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self.taken = 0
        self.last = Directory.of(manager)
        manager.on_change.append(self.take)

    def take(self) -> None:
        self.taken += 1
        self.last = Directory.of(self.manager)

    def check(self) -> None:
        """The last announced picture is what the manager shows now, and answers as it does."""
        assert Directory.of(self.manager) == self.last
        assert answers(self.last) == answers(self.manager)
        assert pickle.loads(pickle.dumps(self.last)) == self.last  # it travels to the workers


def run_with_pictures(repo: RepoBuilder, scenario: Any, startup: tuple[str, ...] = ("*",)) -> None:
    loader = StubLoader()

    async def main() -> None:
        manager = ModelManager(repo.root, mode="explicit", startup_models=startup, loader=loader)
        pictures = Pictures(manager)
        pictures.check()
        await manager.start()
        pictures.check()
        try:
            await scenario(manager, loader, pictures)
        finally:
            await manager.aclose()
        pictures.check()
        assert not pictures.last.is_ready(strict=False)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_every_step_of_a_load_reload_and_unload_is_announced_and_answered_alike(repo: RepoBuilder) -> None:
    repo.add("m", ALL_VERSIONS, version=1)
    repo.add("broken", "max_batch_size = 'eight'\n")

    async def scenario(manager: ModelManager, loader: StubLoader, pictures: Pictures) -> None:
        assert pictures.last.get("m").version == 1
        repo.add("m", ALL_VERSIONS, version=2)
        loader.hold[("m", 2)] = release = asyncio.Event()
        reload = asyncio.create_task(manager.load("m"))
        await wait(loader.entered[("m", 2)])
        pictures.check()  # version 2 LOADING: the server is not ready
        assert not pictures.last.is_ready() and pictures.last.get("m").version == 1
        release.set()
        await reload
        pictures.check()
        assert [served.version for served in pictures.last.model_versions("m")] == [1, 2]
        loader.fail[("m", 2)] = "boom"
        with pytest.raises(NereidError):
            await manager.load("m")
        pictures.check()  # a failed reload: version 2 keeps serving, with the reason
        del loader.fail[("m", 2)]
        unload = asyncio.create_task(manager.unload("m"))
        await wait(loader.closing[("m", 1)])
        pictures.check()  # UNLOADING: "has no available versions"
        await unload
        pictures.check()
        with pytest.raises(NereidError, match="model folder not found"):
            await manager.load("nothing")
        pictures.check()

    run_with_pictures(repo, scenario)


def test_a_model_known_only_by_its_unreadable_config_is_announced_and_answered_alike(repo: RepoBuilder) -> None:
    folder = repo.add("broken", "max_batch_size = 'eight'\n")

    async def scenario(manager: ModelManager, loader: StubLoader, pictures: Pictures) -> None:
        pictures.check()
        with pytest.raises(NereidError, match="max_batch_size"):
            pictures.last.get("broken", 3)  # "version 3 is not found; UNAVAILABLE: <why>"
        (folder / "config.toml").write_text(IDENTITY_CONFIG)
        await manager.load("broken")
        pictures.check()
        assert pictures.last.is_ready()

    run_with_pictures(repo, scenario)


def test_an_instance_problem_shows_in_a_new_picture_but_is_not_announced(repo: RepoBuilder) -> None:
    repo.add("m", IDENTITY_CONFIG)

    async def scenario(manager: ModelManager, loader: StubLoader, pictures: Pictures) -> None:
        taken = pictures.taken
        instance = loader.instances[("m", 1)]
        manager.get("m").instances = (instance,)  # type: ignore[assignment]  # the stub's list none
        instance.problem = "restarting"  # type: ignore[misc]
        assert pictures.taken == taken  # the front ends look for problems themselves (directory_sync.py)
        picture = Directory.of(manager)
        assert answers(picture) == answers(manager)
        assert picture.get("m").problem == "no instance can serve: restarting" and not picture.is_ready()

    run_with_pictures(repo, scenario)
