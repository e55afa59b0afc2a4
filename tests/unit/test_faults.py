"""FaultLog: a model's failure is logged with its traceback once, its repeats counted and
summarised at most once a window (time driven by an injected clock)."""

from __future__ import annotations

import logging
from typing import Iterator

import pytest

from nereid.faults import FaultLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[Lines]:
    logger = logging.getLogger("tests.model_faults")
    logger.propagate = False
    handler = Lines()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def make(lines: Lines, clock: Clock, **kwargs: object) -> FaultLog:
    return FaultLog(logging.getLogger("tests.model_faults"), clock=clock, **kwargs)  # type: ignore[arg-type]


def failure(value: int) -> ValueError:
    """A ValueError raised (so it has a traceback) always from the same line."""
    try:
        raise ValueError(f"bad value {value}")
    except ValueError as exc:
        return exc


def other_failure() -> KeyError:
    try:
        raise KeyError("x")
    except KeyError as exc:
        return exc


def test_the_first_failure_is_logged_with_its_traceback(lines: Lines) -> None:
    faults = make(lines, Clock())
    faults.record("m", 1, "infer", failure(1))
    (line,) = lines.lines
    head, _, body = line.partition("\n")
    assert head == "model 'm' version 1 raised in infer (logged once; repeats are counted):"
    assert body.startswith("Traceback (most recent call last):\n")
    assert __file__ in body and ", in failure\n" in body
    assert body.endswith("ValueError: bad value 1")


def test_repeats_are_counted_and_summarised_once_a_window(lines: Lines) -> None:
    clock = Clock()
    faults = make(lines, clock, window_s=60.0)
    faults.record("m", 1, "infer", failure(1))
    for value in range(2, 12):  # ten repeats within the window: nothing more logged
        clock.now += 1
        faults.record("m", 1, "infer", failure(value))
    assert len(lines.lines) == 1
    clock.now += 60
    faults.record("m", 1, "infer", failure(99))
    assert lines.lines[1] == (
        "model 'm' version 1 raised in infer again: 11 more times in the last 60 s (last: ValueError: bad value 99)"
    )
    clock.now += 1
    faults.record("m", 1, "infer", failure(100))
    assert len(lines.lines) == 2  # the window starts again at the summary


def test_distinct_failures_each_get_their_traceback(lines: Lines) -> None:
    faults = make(lines, Clock())
    faults.record("m", 1, "infer", failure(1))
    faults.record("m", 1, "infer", other_failure())  # another type and line
    faults.record("m", 1, "batch_size", failure(1))  # another stage
    faults.record("m", 2, "infer", failure(1))  # another version
    faults.record("n", 1, "infer", failure(1))  # another model
    assert [line.partition(" (logged once")[0] for line in lines.lines] == [
        "model 'm' version 1 raised in infer",
        "model 'm' version 1 raised in infer",
        "model 'm' version 1 raised in batch_size",
        "model 'm' version 2 raised in infer",
        "model 'n' version 1 raised in infer",
    ]
    assert lines.lines[1].endswith("KeyError: 'x'")


def test_past_its_traceback_budget_a_model_gets_one_summary_per_window(lines: Lines) -> None:
    clock = Clock()
    faults = make(lines, clock, max_tracebacks=2)
    for index in range(5):  # five distinct messages without tracebacks
        faults.record_message("m", 1, "outputs", f"output shape {index}")
    assert lines.lines == [
        "model 'm' version 1 returned outputs that do not match its config (logged once; repeats are counted): output shape 0",
        "model 'm' version 1 returned outputs that do not match its config (logged once; repeats are counted): output shape 1",
    ]
    clock.now += 60  # a new window: two new messages get theirs, the third reports the rest
    for index in (5, 6, 7):
        faults.record_message("m", 1, "outputs", f"output shape {index}")
    assert [line.rpartition(": ")[2] for line in lines.lines[2:4]] == ["output shape 5", "output shape 6"]
    assert lines.lines[4] == (
        "model 'm' version 1 returned outputs that do not match its config again: "
        "4 other failures in the last 60 s (last: output shape 7)"
    )


def test_flush_reports_pending_repeats_and_forgets_the_version(lines: Lines) -> None:
    faults = make(lines, Clock())
    faults.record("m", 1, "infer", failure(1))
    faults.record("m", 1, "infer", failure(2))
    faults.record("m", 2, "infer", failure(3))
    faults.flush("m", 1)
    assert lines.lines[-1] == "model 'm' version 1 raised in infer again: 1 more times in the last 60 s (last: ValueError: bad value 2)"
    faults.flush("m", 1)  # nothing left to say
    assert len(lines.lines) == 3
    faults.record("m", 1, "infer", failure(4))  # a new load: logged afresh, with its traceback
    assert "Traceback (most recent call last)" in lines.lines[-1]
    faults.record("m", 2, "infer", failure(5))  # version 2 was not flushed: a repeat
    assert len(lines.lines) == 4


def test_import_failures_show_the_users_file_and_line_not_importlibs(lines: Lines, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from nereid.errors import ModelLoadError
    from nereid.repository.model_file import load_model_class

    model_file = tmp_path / "model.py"
    model_file.write_text("import os\n\ndef broken(:\n    pass\n")
    faults = make(lines, Clock())
    with pytest.raises(ModelLoadError):
        load_model_class(model_file, "m", 1, faults)
    (line,) = lines.lines
    assert line.startswith("model 'm' version 1 failed to import (logged once; repeats are counted):\n")
    assert f'File "{model_file}", line 3' in line
    assert "importlib" not in line and "SyntaxError" in line
