"""nereid.models.states: the transitions of a model's record (load, swap, roll-back,
unload), what the index rows and strict readiness then read, without a manager."""

from __future__ import annotations

from typing import Any

from nereid.models.states import LOADING, READY, UNAVAILABLE, UNLOADED, UNLOADING, IndexEntry, ModelRecord


class Serving:
    """What a record reads of a ServingModel: problem, withdrawn, retired, successor."""

    def __init__(self, problem: str | None = None, withdrawn: bool = False) -> None:
        self.problem = problem
        self.withdrawn = withdrawn
        self.retired = False
        self.successor: Any = None


def record_serving(*versions: int) -> tuple[ModelRecord, dict[int, Any]]:
    record = ModelRecord("m")
    loaded: dict[int, Any] = {version: Serving() for version in versions}
    record.loading(versions)
    record.swap(loaded)
    return record, loaded


def states(record: ModelRecord) -> list[tuple[int | None, str | None, str]]:
    return [(row.version, row.state, row.reason) for row in record.rows(ready_only=False)]


def test_a_load_shows_loading_then_ready() -> None:
    record = ModelRecord("m")
    record.loading([1])
    assert states(record) == [(1, LOADING, "")] and not record.fine
    record.swap({1: Serving()})  # type: ignore[dict-item]
    assert states(record) == [(1, READY, "")] and record.fine


def test_a_reload_retires_the_old_object_and_points_it_at_its_successor() -> None:
    record, first = record_serving(1)
    second = {1: Serving()}
    old = record.swap(second)  # type: ignore[arg-type]
    assert old == first and first[1].retired and first[1].successor is second[1]


def test_a_failed_reload_keeps_the_serving_version_ready_with_the_reason() -> None:
    record, _ = record_serving(1)
    record.loading([1, 2])
    record.roll_back({1: Serving()}, {2: "ValueError: bad"})  # type: ignore[dict-item]
    assert states(record) == [
        (1, READY, "reload failed, the previous load keeps serving: version 2 of the same load failed"),
        (2, UNAVAILABLE, "ValueError: bad"),
    ]
    assert not record.fine  # a failed new version makes the server unready


def test_a_ready_version_whose_instances_cannot_serve_reads_unavailable() -> None:
    record = ModelRecord("m")
    record.swap({1: Serving(problem="instance m_0 is restarting")})  # type: ignore[dict-item]
    assert record.state_of(1) == (UNAVAILABLE, "instance m_0 is restarting")
    assert record.why_not_serving(1) == "it is UNAVAILABLE: instance m_0 is restarting"
    assert record.rows(ready_only=True) == []


def test_an_ensemble_withdrawn_for_its_steps_reads_unloaded_and_stays_fine() -> None:
    """Triton unloads an ensemble whose step model was unloaded: strict readiness accepts it."""
    record = ModelRecord("ens")
    record.swap({1: Serving(problem="ensemble 'ens' depends on 'b' which has no loaded version",  # type: ignore[dict-item]
                            withdrawn=True)})
    assert record.state_of(1) == (UNAVAILABLE, UNLOADED)
    assert record.fine and record.rows(ready_only=True) == []


def test_an_unreadable_folder_without_versions_is_one_unavailable_row() -> None:
    record = ModelRecord("m")
    record.source_failed([], "m/config.toml: unknown key")
    assert record.rows(ready_only=False) == [IndexEntry("m", None, UNAVAILABLE, "m/config.toml: unknown key")]
    assert record.why_not_serving() == "UNAVAILABLE: m/config.toml: unknown key" and not record.fine


def test_an_unload_drains_then_reads_unloaded_and_stays_fine() -> None:
    record, loaded = record_serving(1)
    retiring = record.unloading()
    assert retiring == loaded and loaded[1].retired and states(record) == [(1, UNLOADING, "")]
    record.unloaded(1)
    record.all_unloaded()
    assert states(record) == [(1, UNAVAILABLE, UNLOADED)] and record.fine


def test_a_load_cancelled_at_shutdown_says_so() -> None:
    record = ModelRecord("m")
    record.loading([3])
    record.load_cancelled([3])
    assert states(record) == [(3, UNAVAILABLE, "load cancelled: the server is shutting down")]
