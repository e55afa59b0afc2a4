"""set_within: a context variable holds a value inside the block only, also when the
block raises, and nested blocks restore what the outer one set."""

from __future__ import annotations

import contextvars

import pytest

from nereid.triton_python.context_scope import set_within

pytestmark = pytest.mark.unit

VARIABLE: contextvars.ContextVar[str | None] = contextvars.ContextVar("test_context_scope", default=None)


def test_the_value_holds_inside_the_block_and_nested_blocks_restore_the_outer_one() -> None:
    with set_within(VARIABLE, "outer"):
        with set_within(VARIABLE, "inner"):
            assert VARIABLE.get() == "inner"
        assert VARIABLE.get() == "outer"
    assert VARIABLE.get() is None


def test_the_value_is_reset_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), set_within(VARIABLE, "set"):
        raise RuntimeError("model code failed")
    assert VARIABLE.get() is None
