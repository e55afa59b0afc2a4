"""LocalAnswers: health, metadata and config answered in a front-end worker from its copy
of the main process's picture, with the same ASGI messages (status, headers, body) as the
main app answers from the manager itself; everything else left to the main process."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from nereid.frontends.directory_sync import DirectoryCopy, SharedGeneration
from nereid.frontends.local_answers import LocalAnswers
from nereid.frontends.shared_stats import StatisticsCopy, StatsPublisher, StatsTable
from nereid.http.app import create_app
from nereid.models.directory import Directory
from nereid.models.manager import ModelManager
from nereid.network.access import parse_restriction
from nereid.options import ServerOptions
from tests.conftest import IDENTITY_CONFIG, RepoBuilder
from tests.unit.models.test_manager import ALL_VERSIONS, StubLoader

#: every lookup route, with known and unknown models and versions, and bad versions
LOOKUPS = [
    "/v2/health/live", "/v2/health/ready", "/v2",
    "/v2/models/m", "/v2/models/m/versions/1", "/v2/models/m/versions/2", "/v2/models/m/versions/007",
    "/v2/models/m/ready", "/v2/models/m/versions/2/ready", "/v2/models/m/versions/9/ready",
    "/v2/models/m/config", "/v2/models/m/versions/1/config", "/v2/models/m/versions/99999999999999999999/config",
    "/v2/models/broken", "/v2/models/broken/ready", "/v2/models/broken/versions/3/config",
    "/v2/models/gone", "/v2/models/gone/versions/1/ready", "/v2/models/nothing/config", "/v2/models/stats/ready",
]


def scope(path: str, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": headers or [], "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}


async def no_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


class Sent(list[dict[str, Any]]):
    async def __call__(self, message: dict[str, Any]) -> None:
        self.append(message)


def run(repo: RepoBuilder, scenario: Any, options: ServerOptions | None = None, *, timed: bool = False,
        statistics: bool = False) -> None:
    repo.add("m", ALL_VERSIONS, version=1)
    repo.add("gone", IDENTITY_CONFIG)
    repo.add("broken", "max_batch_size = 'eight'\n")
    if timed:  # a batch past its timeout takes its instance out of rotation: readiness changes on its own
        repo.add("timed", "execution_timeout_ms = 300\n" + IDENTITY_CONFIG)
    options = options or ServerOptions(model_repository=repo.root)

    async def main() -> None:
        manager = ModelManager(repo.root, mode="explicit", startup_models=["*"], loader=StubLoader())
        await manager.start()
        await manager.unload("gone")
        generation = SharedGeneration.create()
        copy = DirectoryCopy(SharedGeneration.attach(os.dup(generation.fd)))
        directory = Directory.of(manager)
        publisher = StatsPublisher(manager, StatsTable.create()) if statistics else None
        rows = publisher.sync() if publisher is not None else None
        copy.update(generation.read(), directory.ready, directory.ready_strict, dict(directory.models), True, rows)
        shared = StatisticsCopy(StatsTable.attach(os.dup(publisher.table.fd)), copy) if publisher else None
        try:
            await scenario(create_app(manager, options), LocalAnswers(copy, options, shared), generation)
        finally:
            await manager.aclose()
            generation.close()
            if publisher is not None and shared is not None:
                publisher.table.close()
                shared.table.close()

    asyncio.run(asyncio.wait_for(main(), 30))


async def answered_alike(app: Any, local: LocalAnswers, paths: list[str]) -> None:
    """Each GET of ``paths`` answered by the worker itself, sending exactly what the main
    app sends."""
    for path in paths:
        main, here = Sent(), Sent()
        await app(scope(path), no_body, main)
        assert await local.answer(scope(path), here), path
        assert here == main, path
    assert local.answered == len(paths)


def test_lookups_are_answered_with_the_main_apps_exact_messages(repo: RepoBuilder) -> None:
    async def scenario(app: Any, local: LocalAnswers, generation: SharedGeneration) -> None:
        await answered_alike(app, local, LOOKUPS)

    run(repo, scenario)


#: every statistics route, with known and unknown models and versions, and bad versions
STATISTICS = [
    "/v2/models/stats", "/v2/models/m/stats", "/v2/models/m/versions/1/stats", "/v2/models/m/versions/9/stats",
    "/v2/models/m/versions/99999999999999999999/stats", "/v2/models/broken/stats", "/v2/models/gone/stats",
    "/v2/models/nothing/versions/1/stats", "/v2/models/stats/stats",
]


def test_statistics_are_answered_with_the_main_apps_exact_messages(repo: RepoBuilder) -> None:
    async def scenario(app: Any, local: LocalAnswers, generation: SharedGeneration) -> None:
        await answered_alike(app, local, STATISTICS)

    run(repo, scenario, statistics=True)


def test_restricted_statistics_are_left_to_the_main_app(repo: RepoBuilder) -> None:
    options = ServerOptions(model_repository=repo.root, http_restricted_api=(parse_restriction("statistics:key=secret"),))

    async def scenario(app: Any, local: LocalAnswers, generation: SharedGeneration) -> None:
        for path in ("/v2/models/stats", "/v2/models/m/stats", "/v2/models/m/versions/1/stats"):
            assert not await local.answer(scope(path), Sent()), path
        assert await local.answer(scope("/v2/models/m"), Sent())

    run(repo, scenario, options, statistics=True)


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v2/models/stats"), ("GET", "/v2/models/m/stats"), ("POST", "/v2/health/live"),
    ("HEAD", "/v2/health/ready"), ("GET", "/v2/models/m/versions/one"), ("GET", "/v2/repository/index"),
    ("GET", "/v2/models/m/"), ("GET", "/v2/logging"),
], ids=lambda value: str(value))
def test_other_requests_are_left_to_the_main_process(repo: RepoBuilder, method: str, path: str) -> None:
    async def scenario(app: Any, local: LocalAnswers, generation: SharedGeneration) -> None:
        sent = Sent()
        assert not await local.answer(scope(path, method), sent)
        assert sent == [] and local.answered == 0

    run(repo, scenario)


def test_nothing_is_answered_from_a_copy_older_than_the_last_change(repo: RepoBuilder) -> None:
    async def scenario(app: Any, local: LocalAnswers, generation: SharedGeneration) -> None:
        generation.bump()  # the main process changed something; its picture is on its way
        assert not await local.answer(scope("/v2/health/ready"), Sent())

    run(repo, scenario)


def test_a_restricted_group_is_left_to_the_main_app_which_checks_its_key(repo: RepoBuilder) -> None:
    options = ServerOptions(model_repository=repo.root, http_restricted_api=(parse_restriction("health:key=secret"),))

    async def scenario(app: Any, local: LocalAnswers, generation: SharedGeneration) -> None:
        assert not await local.answer(scope("/v2/health/ready"), Sent())
        assert not await local.answer(scope("/v2/models/m/ready", headers=[(b"key", b"secret")]), Sent())
        assert await local.answer(scope("/v2/models/m/config"), Sent())  # model-config is not restricted

    run(repo, scenario, options)


def test_readiness_that_can_change_on_its_own_is_left_to_the_main_process(repo: RepoBuilder) -> None:
    async def scenario(app: Any, local: LocalAnswers, generation: SharedGeneration) -> None:
        for path in ("/v2/models/timed/ready", "/v2/models/timed/versions/1/ready", "/v2/health/ready"):
            assert not await local.answer(scope(path), Sent()), path  # strict readiness reads "timed" too
        for path in ("/v2/models/m/ready", "/v2/models/timed/versions/2/ready", "/v2/models/timed",
                     "/v2/models/timed/config", "/v2/health/live"):
            main, here = Sent(), Sent()
            await app(scope(path), no_body, main)
            assert await local.answer(scope(path), here), path  # an error, another model, no readiness
            assert here == main, path

    run(repo, scenario, timed=True)


def test_without_strict_readiness_server_readiness_reads_no_instance(repo: RepoBuilder) -> None:
    options = ServerOptions(model_repository=repo.root, strict_readiness=False)

    async def scenario(app: Any, local: LocalAnswers, generation: SharedGeneration) -> None:
        assert await local.answer(scope("/v2/health/ready"), Sent())
        assert not await local.answer(scope("/v2/models/timed/ready"), Sent())

    run(repo, scenario, options, timed=True)
