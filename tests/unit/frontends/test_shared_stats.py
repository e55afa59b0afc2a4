"""The statistics table: what the main process publishes is what a worker reads, and
exactly the main process's own answer; what cannot be read for certain is left to it."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from nereid.frontends.directory_sync import DirectoryCopy, SharedGeneration
from nereid.frontends.shared_stats import BATCH_SIZES_PER_ROW, StatisticsCopy, StatsPublisher, StatsTable
from nereid.models import admin
from nereid.models.directory import Directory
from nereid.models.manager import ModelManager
from nereid.stats import ModelStats
from tests.conftest import IDENTITY_CONFIG, RepoBuilder
from tests.unit.models.test_manager import ALL_VERSIONS, StubLoader


class Worker:
    """The main process's publisher and a worker's copy of the picture and the table."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self.generation = SharedGeneration.create()
        self.publisher = StatsPublisher(manager, StatsTable.create())
        self.copy = DirectoryCopy(SharedGeneration.attach(os.dup(self.generation.fd)))
        self.statistics = StatisticsCopy(StatsTable.attach(os.dup(self.publisher.table.fd)), self.copy)
        self.changed()

    def changed(self) -> None:
        """What directory_sync does after a change: bump, then the picture and its rows."""
        self.generation.bump()
        directory = Directory.of(self.manager)
        rows = self.publisher.sync()
        self.copy.update(self.generation.read(), directory.ready, directory.ready_strict, dict(directory.models),
                         True, rows)

    def close(self) -> None:
        for closing in (self.publisher.table, self.statistics.table, self.generation, self.copy.shared):
            closing.close()


def run(repo: RepoBuilder, scenario: Any) -> None:
    repo.add("m", ALL_VERSIONS, version=1)
    repo.add("m", ALL_VERSIONS, version=2)
    repo.add("other", IDENTITY_CONFIG)

    async def main() -> None:
        manager = ModelManager(repo.root, mode="explicit", startup_models=["*"], loader=StubLoader())
        await manager.start()
        worker = Worker(manager)
        try:
            await scenario(manager, worker)
        finally:
            worker.close()
            await manager.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))


def record(stats: ModelStats, batch_sizes: range) -> None:
    """Batches of each size, a failure, scheduling figures: every counter moves."""
    for rows in batch_sizes:
        stats.record_batch(rows, 1000 * rows, [10 * rows] * rows, (rows, 2 * rows, 3 * rows), (7 * rows, rows, 5))
        stats.record_answer(11)
    stats.record_failure(99, "BACKEND")
    stats.record_formation(3)


def answers(source: Any) -> list[Any]:
    """Every statistics answer (or its error's text) a worker is asked for."""
    found = []
    for name, version in ((None, None), ("m", None), ("m", "1"), ("m", 2), ("m", "3"), ("other", None),
                          ("nothing", None), ("m", "99999999999999999999")):
        try:
            found.append(admin.model_statistics(source, name, version))
        except Exception as exc:
            found.append(f"{type(exc).__name__}: {exc}")
    return found


def test_a_worker_reads_exactly_what_the_main_process_answers(repo: RepoBuilder) -> None:
    async def scenario(manager: ModelManager, worker: Worker) -> None:
        versions = manager.serving_models()
        for index, serving in enumerate(versions):
            record(serving.stats, range(1, 3 + 4 * index))
        worker.publisher.publish()
        picture = worker.statistics.read(None)
        assert picture is not None
        assert answers(picture) == answers(manager)
        assert [entry["inference_count"] for entry in admin.model_statistics(picture, None, None)["model_stats"]] == [
            sum(range(1, 3 + 4 * index)) for index in range(len(versions))]

    run(repo, scenario)


def test_figures_counted_after_a_publish_are_read_only_after_the_next(repo: RepoBuilder) -> None:
    async def scenario(manager: ModelManager, worker: Worker) -> None:
        stats = manager.model_versions("other")[0].stats
        record(stats, range(1, 2))
        before = worker.statistics.read("other")
        worker.publisher.publish()
        after = worker.statistics.read("other")
        assert before is not None and after is not None
        assert before.model_versions("other")[0].stats.execution_count == 0
        assert after.model_versions("other")[0].stats.counters() == stats.counters()

    run(repo, scenario)


def test_loaded_again_and_unloaded_versions_read_as_the_manager_shows_them(repo: RepoBuilder) -> None:
    async def scenario(manager: ModelManager, worker: Worker) -> None:
        record(manager.model_versions("m")[1].stats, range(1, 4))
        worker.publisher.publish()
        await manager.load("m")  # new versions, new figures
        worker.changed()
        picture = worker.statistics.read(None)
        assert picture is not None and answers(picture) == answers(manager)
        await manager.unload("m")
        worker.changed()
        picture = worker.statistics.read(None)
        assert picture is not None and answers(picture) == answers(manager)
        assert [served.version for served in picture.serving_models()] == [1]  # "other"'s only

    run(repo, scenario)


def test_a_read_across_a_change_or_during_a_write_is_left_to_the_main_process(repo: RepoBuilder) -> None:
    async def scenario(manager: ModelManager, worker: Worker) -> None:
        assert worker.statistics.read("m") is not None
        worker.publisher.table.begin()  # the main process is writing (or stopped mid-write)
        assert worker.statistics.read("m") is None
        worker.publisher.table.end()
        assert worker.statistics.read("m") is not None
        worker.generation.bump()  # a change, its picture (and rows) on the way
        assert worker.statistics.read("m") is None

    run(repo, scenario)


def test_figures_past_a_row_are_left_to_the_main_process_and_the_rest_read(repo: RepoBuilder) -> None:
    async def scenario(manager: ModelManager, worker: Worker) -> None:
        record(manager.model_versions("m")[0].stats, range(1, BATCH_SIZES_PER_ROW + 2))
        worker.publisher.publish()
        assert worker.statistics.read("m") is None
        assert worker.statistics.read(None) is None
        assert worker.statistics.read("other") is not None

    run(repo, scenario)


def test_a_row_reads_back_what_was_written() -> None:
    table = StatsTable.create()
    try:
        stats = ModelStats("m", 1)
        record(stats, range(1, 5))
        table.begin()
        table.write(3, 2, stats.counters())
        table.end()
        assert table.read(3) == (2, tuple(stats.counters()))
        assert table.sequence() == 2
    finally:
        table.close()


def test_publishing_writes_nothing_when_nothing_changed(repo: RepoBuilder) -> None:
    async def scenario(manager: ModelManager, worker: Worker) -> None:
        table = worker.publisher.table
        worker.publisher.publish()
        sequence = table.sequence()
        worker.publisher.publish()
        assert table.sequence() == sequence  # no write: readers are never made to wait
        manager.model_versions("other")[0].stats.record_failure(5)
        worker.publisher.publish()
        assert table.sequence() == sequence + 2

    run(repo, scenario)
