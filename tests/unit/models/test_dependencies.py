"""An ensemble's step models in the model manager (real folders, identity models in
threads): loaded with the ensemble, waited for, never in a cycle, and unloaded with
``unload_dependents`` only when loaded for ensembles alone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nereid.models.manager import ModelManager
from tests.conftest import IDENTITY_CONFIG, RepoBuilder

pytestmark = pytest.mark.unit


def ensemble(*steps: str) -> str:
    """An ensemble passing INPUT0 through ``steps`` in turn."""
    text = IDENTITY_CONFIG.replace("max_batch_size = 8", 'platform = "ensemble"\nmax_batch_size = 8')
    tensors = ["INPUT0", *(f"t{i}" for i in range(1, len(steps))), "OUTPUT0"]
    for step, source, target in zip(steps, tensors, tensors[1:]):
        text += (f'[[ensemble_scheduling.step]]\nmodel_name = "{step}"\n'
                 f'input_map = {{ INPUT0 = "{source}" }}\noutput_map = {{ OUTPUT0 = "{target}" }}\n')
    return text


def run(scenario: Any) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, 60))


def states(manager: ModelManager) -> dict[str, tuple[str | None, str]]:
    return {row.name: (row.state, row.reason) for row in manager.states()}


def test_ensembles_that_use_each_other_fail_to_load_instead_of_waiting_forever(repo: RepoBuilder) -> None:
    repo.add("a", ensemble("b"), model=None)
    repo.add("b", ensemble("a"), model=None)

    async def scenario() -> dict[str, tuple[str | None, str]]:
        manager = ModelManager(repo.root)
        await manager.start()
        try:
            return states(manager)
        finally:
            await manager.aclose()

    found = run(scenario())
    assert found["a"][0] == found["b"][0] == "UNAVAILABLE"
    assert found["a"][1].startswith("ensemble 'a' depends on 'b' which has no loaded version")


def test_an_ensemble_started_with_its_steps_waits_for_their_loads(repo: RepoBuilder) -> None:
    repo.add("step", IDENTITY_CONFIG)
    repo.add("outer", ensemble("inner", "step"), model=None)
    repo.add("inner", ensemble("step"), model=None)

    async def scenario() -> dict[str, tuple[str | None, str]]:
        manager = ModelManager(repo.root)
        await manager.start()
        try:
            return states(manager)
        finally:
            await manager.aclose()

    assert run(scenario()) == {"inner": ("READY", ""), "outer": ("READY", ""), "step": ("READY", "")}


def test_unload_dependents_leaves_the_steps_loaded_by_name_or_used_by_another_ensemble(repo: RepoBuilder) -> None:
    for name in ("x", "y", "z"):
        repo.add(name, IDENTITY_CONFIG)
    repo.add("e1", ensemble("x", "y"), model=None)
    repo.add("e2", ensemble("y"), model=None)

    async def scenario() -> tuple[dict[str, tuple[str | None, str]], dict[str, tuple[str | None, str]]]:
        manager = ModelManager(repo.root, mode="explicit", startup_models=["e1", "e2"])
        await manager.start()
        try:
            await manager.load("x")  # by name now: no longer only a step
            loaded = states(manager)
            await manager.unload("e1", unload_dependents=True)
            await manager.unload("e2", unload_dependents=True)
            return loaded, states(manager)
        finally:
            await manager.aclose()

    loaded, after = run(scenario())
    assert {name for name, (state, _) in loaded.items() if state == "READY"} == {"e1", "e2", "x", "y"}
    # y was loaded for the ensembles only: it goes with the last one; x was loaded by name
    assert after == {"e1": ("UNAVAILABLE", "unloaded"), "e2": ("UNAVAILABLE", "unloaded"),
                     "x": ("READY", ""), "y": ("UNAVAILABLE", "unloaded")}
