"""Poll mode's change detector: what a fingerprint sees, what it ignores, and the rule
that a change is acted on only once it has held still for one poll."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereid.repository.watch import (
    ChangeDetector,
    Changes,
    FileStamp,
    Fingerprint,
    fingerprint_model,
    fingerprint_repository,
    is_ignored,
)

pytestmark = pytest.mark.unit


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "repo" / "m"
    write(folder / "config.toml", "max_batch_size = 0\n")
    write(folder / "model.py", "class Model: ...\n")
    return folder


# -- fingerprints --------------------------------------------------------------------------


def test_fingerprint_lists_every_file_relative_to_the_model_folder(model: Path) -> None:
    write(model / "1" / "weights.bin", "abc")
    paths = [stamp.path for stamp in fingerprint_model(model)]
    assert paths == ["1/weights.bin", "config.toml", "model.py"]


def test_fingerprint_changes_when_a_file_changes_even_with_the_same_size_and_mtime(model: Path) -> None:
    before = fingerprint_model(model)
    stat = (model / "model.py").stat()
    (model / "model.py").write_text("class Xodel: ...\n")  # same length
    os.utime(model / "model.py", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert fingerprint_model(model) != before


def test_fingerprint_changes_when_a_file_is_added_or_removed(model: Path) -> None:
    before = fingerprint_model(model)
    write(model / "helper.py", "X = 1\n")
    added = fingerprint_model(model)
    assert added != before
    (model / "helper.py").unlink()
    assert fingerprint_model(model) == before


def test_touching_a_file_changes_the_fingerprint(model: Path) -> None:
    before = fingerprint_model(model)
    stat = (model / "model.py").stat()
    os.utime(model / "model.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert fingerprint_model(model) != before


@pytest.mark.parametrize(
    "relative",
    [
        "__pycache__/model.cpython-311.pyc",
        "1/__pycache__/model.cpython-311.pyc",
        ".model.py.swp",
        "model.py.swp",
        "model.py.swo",
        "model.py~",
        ".#model.py",
        ".git/HEAD",
        ".DS_Store",
        "model.pyc",
    ],
)
def test_ignored_files_do_not_change_the_fingerprint(model: Path, relative: str) -> None:
    before = fingerprint_model(model)
    write(model / relative, "noise")
    assert fingerprint_model(model) == before


@pytest.mark.parametrize(
    ("name", "ignored"),
    [
        ("__pycache__", True),
        (".hidden", True),
        (".#lock", True),
        ("x.swp", True),
        ("x~", True),
        ("model.py", False),
        ("config.toml", False),
        ("weights.swp.bin", False),
        ("_private.py", False),
    ],
)
def test_is_ignored(name: str, ignored: bool) -> None:
    assert is_ignored(name) is ignored


def test_a_missing_folder_has_the_empty_fingerprint(tmp_path: Path) -> None:
    assert fingerprint_model(tmp_path / "nope") == ()


def test_repository_fingerprints_cover_model_folders_only(model: Path) -> None:
    root = model.parent
    write(root / "no_config" / "model.py", "")  # listed: UNAVAILABLE with its reason, or auto-completed
    write(root / "triton" / "config.pbtxt", "")
    write(root / "notes" / "readme.txt", "")  # no config and no model file: not a model
    write(root / "_ignored" / "config.toml", "")
    write(root / ".hidden" / "config.toml", "")
    write(root / "loose_file.txt", "")
    assert list(fingerprint_repository(root)) == ["m", "no_config", "triton"]


# -- the stability rule ----------------------------------------------------------------------


def fp(tag: str) -> Fingerprint:
    """A stand-in fingerprint: one file whose digest is ``tag``."""
    return (FileStamp("model.py", 1, 0, tag),)


def test_no_change_reports_nothing() -> None:
    detector = ChangeDetector({"a": fp("1")})
    assert detector.observe({"a": fp("1")}) == Changes()
    assert not detector.observe({"a": fp("1")})


def test_a_change_is_reported_after_it_holds_still_for_one_poll() -> None:
    detector = ChangeDetector({"a": fp("1")})
    assert detector.observe({"a": fp("2")}) == Changes()  # seen, not yet stable
    assert detector.pending == ("a",)
    assert detector.observe({"a": fp("2")}) == Changes(modified=("a",))
    assert detector.pending == ()
    assert detector.observe({"a": fp("2")}) == Changes()  # acted on once only


def test_a_folder_that_keeps_changing_is_not_reported_until_it_stops() -> None:
    detector = ChangeDetector({"a": fp("1")})
    for tag in ("2", "3", "4", "5"):
        assert detector.observe({"a": fp(tag)}) == Changes()
    assert detector.observe({"a": fp("5")}) == Changes(modified=("a",))


def test_a_change_that_is_reverted_before_it_settles_is_never_reported() -> None:
    detector = ChangeDetector({"a": fp("1")})
    assert detector.observe({"a": fp("2")}) == Changes()
    assert detector.observe({"a": fp("1")}) == Changes()
    assert detector.observe({"a": fp("1")}) == Changes()
    assert detector.pending == ()


def test_a_new_folder_is_added_once_stable() -> None:
    detector = ChangeDetector({})
    assert detector.observe({"new": fp("1")}) == Changes()
    assert detector.observe({"new": fp("1")}) == Changes(added=("new",))


def test_a_new_folder_still_being_copied_is_added_once_complete() -> None:
    detector = ChangeDetector({})
    assert detector.observe({"new": fp("config only")}) == Changes()
    assert detector.observe({"new": fp("config and model")}) == Changes()
    assert detector.observe({"new": fp("config and model")}) == Changes(added=("new",))


def test_a_removed_folder_is_removed_once_it_stays_away() -> None:
    detector = ChangeDetector({"a": fp("1"), "b": fp("1")})
    assert detector.observe({"b": fp("1")}) == Changes()
    assert detector.observe({"b": fp("1")}) == Changes(removed=("a",))
    assert detector.observe({"b": fp("1")}) == Changes()


def test_a_folder_removed_and_put_back_unchanged_is_not_reported() -> None:
    detector = ChangeDetector({"a": fp("1")})
    assert detector.observe({}) == Changes()
    assert detector.observe({"a": fp("1")}) == Changes()
    assert detector.observe({"a": fp("1")}) == Changes()


def test_changes_to_several_models_are_reported_together_sorted() -> None:
    detector = ChangeDetector({"b": fp("1"), "c": fp("1"), "d": fp("1")})
    current = {"a": fp("1"), "b": fp("2"), "c": fp("2"), "e": fp("1")}
    detector.observe(current)
    assert detector.observe(current) == Changes(added=("a", "e"), modified=("b", "c"), removed=("d",))


_tags = st.sampled_from(["1", "2", "3"])
_snapshots = st.dictionaries(st.sampled_from(["a", "b", "c"]), _tags.map(fp), max_size=3)


@given(baseline=_snapshots, polls=st.lists(_snapshots, max_size=12))
def test_after_two_equal_polls_the_acted_state_matches_the_folder(
    baseline: dict[str, Fingerprint], polls: list[dict[str, Fingerprint]]
) -> None:
    """Property: replaying the reported changes onto the baseline, and then polling the
    final state twice, always ends at exactly the final folder state."""
    detector = ChangeDetector(baseline)
    state = dict(baseline)
    for snapshot in polls + [polls[-1] if polls else baseline] * 2:
        changes = detector.observe(snapshot)
        for name in changes.removed:
            assert name in state
            del state[name]
        for name in changes.added:
            assert name not in state
            state[name] = snapshot[name]
        for name in changes.modified:
            assert name in state and state[name] != snapshot[name]
            state[name] = snapshot[name]
    assert state == (polls[-1] if polls else baseline)
    assert detector.pending == ()
