"""ModelManager's transitions, with a stub loader: no model files run, no HTTP.

The repository folders are real (the manager reads configs and version folders), but
each version is "loaded" by StubLoader as a ServingModel over a fake instance that
answers every request with ``(name, version, generation)``: which load served it. A test
holds a load, a running batch or a close at an asyncio.Event and releases it when it has
looked at the state in between; it never sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import pytest

from nereid.scheduling.batcher import DynamicBatcher
from nereid.inference import InferRequest
from nereid.errors import InvalidInputError, ModelLoadError, ModelNotFoundError, ModelNotReadyError, UnavailableError
from nereid.models.manager import IndexEntry, ModelManager, ServingModel
from nereid.repository.scan import ModelSource, VersionSource
from nereid.stats import ModelStats
from tests.conftest import IDENTITY_CONFIG, RepoBuilder

ALL_VERSIONS = IDENTITY_CONFIG + "[version_policy]\nall = {}\n"
Key = tuple[str, int]


@dataclass(frozen=True)
class Outcome:
    outputs: list[Any] | None
    error: Any = None
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    began_ns: int = 0
    ended_ns: int = 0


class FakeInstance:
    """Answers each request with ``answer``; a batch waits at ``gate`` when there is one."""

    name = "stub_0"
    capacity = 1
    cost_function = None
    problem = None
    enforces_timeout = False
    queues_batches = False

    def __init__(self, answer: tuple[str, int, int], gate: asyncio.Event | None) -> None:
        self.answer = answer
        self.gate = gate
        self.running = asyncio.Event()

    async def run_batch(self, items: Sequence[Any]) -> Outcome:
        self.running.set()
        if self.gate is not None:
            await self.gate.wait()
        return Outcome([self.answer for _ in items])


class StubLoader:
    """A Loader whose loads can be held (``hold``), made to fail (``fail``), and whose
    instances can hold their batches (``gate``). ``entered``/``closing`` say when a
    load or a close of a version began."""

    def __init__(self) -> None:
        self.hold: dict[Key, asyncio.Event] = {}
        self.fail: dict[Key, str] = {}
        self.gate: dict[Key, asyncio.Event] = {}
        self.entered: defaultdict[Key, asyncio.Event] = defaultdict(asyncio.Event)
        self.closing: defaultdict[Key, asyncio.Event] = defaultdict(asyncio.Event)
        self.closed: list[tuple[str, int, int]] = []
        self.instances: dict[Key, FakeInstance] = {}
        self._generations = itertools.count(1)

    async def load(self, source: ModelSource, version: VersionSource) -> ServingModel:
        key = (source.name, version.version)
        self.entered[key].set()
        if key in self.hold:
            await self.hold[key].wait()
        if key in self.fail:
            raise ModelLoadError(source.name, self.fail[key], str(version.model_file))
        assert source.config is not None
        instance = FakeInstance((*key, next(self._generations)), self.gate.get(key))
        self.instances[key] = instance
        stats = ModelStats(*key)
        batcher = DynamicBatcher(model_name=source.name, max_batch_size=0, dynamic_batching=None,
                                 instances=[instance], stats=stats)
        await batcher.__aenter__()
        return ServingModel(source.name, version.version, source.config, {}, stats, batcher, (), None)  # type: ignore[arg-type]

    async def close(self, serving: ServingModel) -> None:
        self.closing[(serving.name, serving.version)].set()
        serving.retired = True
        await serving.batcher.aclose()
        self.closed.append(serving.batcher.instances[0].answer)  # type: ignore[attr-defined]


def _request(name: str = "x") -> InferRequest:
    return InferRequest(model_name=name, inputs={})


async def ask(serving: ServingModel, request: InferRequest | None = None) -> Any:
    """Infer ``request`` (the stub's instances answer any): who answered."""
    return await serving.infer(request or _request())


async def wait(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), 10)


def run(repo: RepoBuilder, scenario: Any, *, mode: str = "explicit", startup: Sequence[str] = ("*",),
        poll_secs: float = 3600) -> StubLoader:
    """Run ``scenario(manager, loader)`` against a started manager, closed afterwards."""
    loader = StubLoader()

    async def main() -> None:
        manager = ModelManager(repo.root, mode=mode, startup_models=startup, poll_secs=poll_secs, loader=loader)
        await manager.start()
        try:
            await scenario(manager, loader)
        finally:
            await manager.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    return loader


def rows(manager: ModelManager) -> list[tuple[str, int | None, str | None, str]]:
    return [(e.name, e.version, e.state, e.reason) for e in manager.states()]


# -- start-up by control mode ---------------------------------------------------------------


def test_none_mode_loads_every_model_folder(repo: RepoBuilder) -> None:
    repo.add("a", IDENTITY_CONFIG)
    repo.add("b", IDENTITY_CONFIG)

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        assert rows(manager) == [("a", 1, "READY", ""), ("b", 1, "READY", "")]
        assert (await ask(manager.get("b")))[:2] == ("b", 1)  # a and b load concurrently
        assert manager.is_ready()

    run(repo, scenario, mode="none", startup=())


def test_explicit_mode_loads_only_the_startup_models(repo: RepoBuilder) -> None:
    repo.add("a", IDENTITY_CONFIG)
    repo.add("b", IDENTITY_CONFIG)

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        assert rows(manager) == [("a", 1, "READY", "")]
        assert await manager.index() == [IndexEntry("a", 1, "READY", ""), IndexEntry("b")]
        assert await manager.index(ready_only=True) == [IndexEntry("a", 1, "READY", "")]
        with pytest.raises(ModelNotFoundError, match="'b' is not found"):
            manager.get("b")
        await manager.load("b")
        assert manager.get("b").version == 1

    run(repo, scenario, startup=["a"])


def test_a_missing_startup_model_is_unavailable_and_the_server_unready(repo: RepoBuilder) -> None:
    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        [(name, version, state, reason)] = rows(manager)
        assert (name, version, state) == ("gone", None, "UNAVAILABLE")
        assert "model folder not found" in reason
        assert not manager.is_ready() and manager.is_ready(strict=False)

    run(repo, scenario, startup=["gone"])


def test_modes_and_poll_intervals_that_do_not_exist_are_refused(repo: RepoBuilder) -> None:
    with pytest.raises(ValueError, match="expected one of"):
        ModelManager(repo.root, mode="sometimes")
    with pytest.raises(ValueError, match="--repository-poll-secs"):
        ModelManager(repo.root, mode="poll", poll_secs=0)


def test_poll_mode_acts_on_a_change_once_it_held_still_for_one_poll(repo: RepoBuilder) -> None:
    folder = repo.add("a", IDENTITY_CONFIG)

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        old = manager.get("a")
        assert await ask(old) == ("a", 1, 1)
        repo.add("b", IDENTITY_CONFIG)
        (folder / "model.py").write_text("# changed\n")
        first = await manager.poll()
        assert first.added == () and first.modified == ()  # seen, not yet still
        second = await manager.poll()
        assert (second.added, second.modified) == (("b",), ("a",))
        assert manager.get("a") is not old and old.successor is manager.get("a")
        assert rows(manager) == [("a", 1, "READY", ""), ("b", 1, "READY", "")]
        for path in sorted(folder.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        folder.rmdir()
        await manager.poll()
        assert (await manager.poll()).removed == ("a",)
        assert rows(manager)[0] == ("a", 1, "UNAVAILABLE", "unloaded")

    run(repo, scenario, mode="poll", startup=())


# -- load and reload -------------------------------------------------------------------------


def test_a_reload_keeps_the_old_object_serving_until_the_new_one_is_ready(repo: RepoBuilder) -> None:
    repo.add("m", IDENTITY_CONFIG)

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        old = manager.get("m")
        loader.hold[("m", 1)] = release = asyncio.Event()
        loader.entered.clear()
        reload = asyncio.create_task(manager.load("m"))
        await wait(loader.entered[("m", 1)])
        # Loading: the old object serves, and the index still says READY.
        assert manager.get("m") is old
        assert await ask(old) == ("m", 1, 1)
        assert rows(manager) == [("m", 1, "READY", "")]
        assert manager.is_ready()
        release.set()
        await reload
        new = manager.get("m")
        assert new is not old and old.retired and old.successor is new
        assert await ask(new) == ("m", 1, 2)
        # A caller holding the old object is served by its successor, every way in.
        assert await ask(old) == ("m", 1, 2)
        answered = asyncio.get_running_loop().create_future()
        old.submit(_request(), None, lambda outputs, error: answered.set_result((outputs, error)))
        assert await answered == (("m", 1, 2), None)
        assert loader.closed == [("m", 1, 1)]
        assert rows(manager) == [("m", 1, "READY", "")]

    run(repo, scenario)


def test_a_new_version_is_loading_until_ready_and_strict_readiness_waits_for_it(repo: RepoBuilder) -> None:
    folder = repo.add("m", ALL_VERSIONS, version=1)

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        repo.add("m", ALL_VERSIONS, version=2)
        loader.hold[("m", 2)] = release = asyncio.Event()
        reload = asyncio.create_task(manager.load("m"))
        await wait(loader.entered[("m", 2)])
        assert rows(manager) == [("m", 1, "READY", ""), ("m", 2, "LOADING", "")]
        assert not manager.is_ready() and manager.is_ready(strict=False)
        with pytest.raises(ModelNotReadyError, match="'m' version 2 is not at ready state"):
            manager.get("m", 2)
        assert manager.get("m").version == 1
        release.set()
        await reload
        assert rows(manager) == [("m", 1, "READY", ""), ("m", 2, "READY", "")]
        assert manager.get("m").version == 2 and manager.get("m", 1).version == 1
        assert [s.version for s in manager.model_versions("m")] == [1, 2]
        assert manager.is_ready()
        assert folder.is_dir()

    run(repo, scenario)


def test_a_failed_reload_keeps_the_old_version_serving_and_says_why(repo: RepoBuilder) -> None:
    repo.add("m", IDENTITY_CONFIG)

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        old = manager.get("m")
        loader.fail[("m", 1)] = "boom"
        with pytest.raises(ModelLoadError, match=r"^failed to load 'm', version 1 is at UNAVAILABLE state: boom;$"):
            await manager.load("m")
        assert manager.get("m") is old and not old.retired
        assert await ask(old) == ("m", 1, 1)
        assert rows(manager) == [("m", 1, "READY", "reload failed, the previous load keeps serving: boom")]
        assert manager.is_ready()  # a failed reload of a serving version does not unready
        del loader.fail[("m", 1)]
        await manager.load("m")  # the next successful load clears the reason
        assert rows(manager) == [("m", 1, "READY", "")]

    run(repo, scenario)


def test_a_failed_version_discards_its_siblings_of_the_same_load(repo: RepoBuilder) -> None:
    repo.add("m", ALL_VERSIONS, version=1)
    repo.add("m", ALL_VERSIONS, version=2)

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        loader.fail[("m", 2)] = "boom"
        with pytest.raises(ModelLoadError, match="version 2 is at UNAVAILABLE state: boom;"):
            await manager.load("m")
        assert rows(manager) == [
            ("m", 1, "UNAVAILABLE", "not loaded: version 2 of the same load failed"),
            ("m", 2, "UNAVAILABLE", "boom"),
        ]
        assert loader.closed == [("m", 1, 1)]
        with pytest.raises(ModelNotFoundError, match="'m' has no available versions"):
            manager.get("m")
        assert not manager.is_ready()

    run(repo, scenario, startup=())


def test_a_config_that_breaks_keeps_the_serving_version_and_shows_the_reason(repo: RepoBuilder) -> None:
    folder = repo.add("m", IDENTITY_CONFIG)

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        (folder / "config.toml").write_text("max_batch_size = 'eight'\n")
        with pytest.raises(ModelLoadError, match="^failed to load 'm', "):
            await manager.load("m")
        [(_, version, state, reason)] = rows(manager)
        assert (version, state) == (1, "READY")
        assert reason.startswith("reload failed, the previous load keeps serving: ")
        assert await ask(manager.get("m")) == ("m", 1, 1)
        assert manager.is_ready()

    run(repo, scenario)


def test_a_model_whose_config_cannot_be_read_is_one_unavailable_row(repo: RepoBuilder) -> None:
    folder = repo.add("m", "max_batch_size = 'eight'\n")

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        [(name, version, state, reason)] = rows(manager)
        assert (name, version, state) == ("m", None, "UNAVAILABLE") and "max_batch_size" in reason
        assert not manager.is_ready()
        (folder / "config.toml").write_text(IDENTITY_CONFIG)
        await manager.load("m")
        assert rows(manager) == [("m", 1, "READY", "")]
        assert manager.is_ready()

    run(repo, scenario)


def test_a_specific_version_without_a_folder_fails_the_load(repo: RepoBuilder) -> None:
    repo.add("m", IDENTITY_CONFIG + "[version_policy.specific]\nversions = [1, 3]\n", version=1)

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        [one, three] = rows(manager)
        assert one == ("m", 1, "UNAVAILABLE", "not loaded: version 3 of the same load failed")
        assert three[:3] == ("m", 3, "UNAVAILABLE") and "version folder not found" in three[3]

    run(repo, scenario)


def test_loading_something_that_is_not_a_model_folder_leaves_nothing_behind(repo: RepoBuilder) -> None:
    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        with pytest.raises(ModelLoadError, match="model folder not found"):
            await manager.load("nothing")
        assert rows(manager) == [] and await manager.index() == []
        assert manager.is_ready()
        with pytest.raises(InvalidInputError, match="invalid model name '../m'"):
            await manager.load("../m")
        with pytest.raises(InvalidInputError, match="invalid model name '_m'"):
            await manager.unload("_m")

    run(repo, scenario, startup=())


# -- unload ------------------------------------------------------------------------------------


def test_unload_refuses_new_requests_at_once_and_drains_the_accepted_ones(repo: RepoBuilder) -> None:
    repo.add("m", IDENTITY_CONFIG)
    loader = StubLoader()
    loader.gate[("m", 1)] = gate = asyncio.Event()

    async def main() -> None:
        manager = ModelManager(repo.root, mode="explicit", startup_models=["m"], loader=loader)
        await manager.start()
        serving = manager.get("m")
        running = asyncio.create_task(ask(serving, _request("first")))
        await wait(loader.instances[("m", 1)].running)
        queued = asyncio.get_running_loop().create_future()
        serving.submit(_request("second"), None, lambda outputs, error: queued.set_result(outputs))
        assert (serving.executing, serving.queue_depth) == (1, 1)
        unload = asyncio.create_task(manager.unload("m"))
        await wait(loader.closing[("m", 1)])
        assert rows(manager) == [("m", 1, "UNLOADING", "")]
        with pytest.raises(ModelNotFoundError, match="'m' has no available versions"):
            manager.get("m")
        with pytest.raises(ModelNotFoundError, match="'m' has no available versions"):
            await ask(serving, _request("late"))
        assert manager.serving_models() == []
        gate.set()
        assert await running == ("m", 1, 1) and await queued == ("m", 1, 1)
        await unload
        assert rows(manager) == [("m", 1, "UNAVAILABLE", "unloaded")]
        assert manager.is_ready()  # unloaded on purpose is fine
        await manager.unload("never-loaded")  # unknown names: a no-op
        await manager.aclose()
        assert not manager.is_ready()
        with pytest.raises(UnavailableError, match="the server is shutting down"):
            await manager.load("m")

    asyncio.run(asyncio.wait_for(main(), 30))


def test_unloading_one_version_of_several_marks_it_unloaded(repo: RepoBuilder) -> None:
    repo.add("m", ALL_VERSIONS, version=1)
    repo.add("m", ALL_VERSIONS, version=2)

    async def scenario(manager: ModelManager, loader: StubLoader) -> None:
        (repo.root / "m" / "config.toml").write_text(ALL_VERSIONS.replace("all = {}", "specific = { versions = [2] }"))
        await manager.load("m")  # version 1 is no longer selected: it drains and unloads
        assert rows(manager) == [("m", 1, "UNAVAILABLE", "unloaded"), ("m", 2, "READY", "")]
        assert loader.closed == [("m", 1, 1), ("m", 2, 2)]
        assert await ask(manager.get("m", 2)) == ("m", 2, 3)

    run(repo, scenario)
