"""Typed reading of one TOML-shaped table with its key path in hand, and the error wording.

Knows no config field: load.py says which keys a table has and what they mean.
"""

from __future__ import annotations

import datetime
import difflib
import json
import math
import re
from collections.abc import Collection, Mapping, Sequence
from typing import NoReturn

from nereid.errors import ConfigError

__all__ = ["Table", "render", "key_path"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_DECIMAL = re.compile(r"-?[0-9]+")
# A whole table echoed back in a message helps nobody past this length.
_MAX_RENDERED = 120


def render(value: object) -> str:
    """A value as the user wrote it, TOML/JSON-like: ``"16"``, ``[1, "a"]``, ``true``."""
    text = _render(value)
    if len(text) > _MAX_RENDERED:
        return text[: _MAX_RENDERED - 3] + "..."
    return text


def _render(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Mapping):
        items = (
            f"{json.dumps(str(k), ensure_ascii=False)}: {_render(v)}" for k, v in value.items()
        )
        return "{" + ", ".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return repr(value)


def key_path(parent: str, key: object) -> str:
    """``parent.key``, quoting the key the way TOML would when it is not a bare key."""
    text = str(key)
    if not _BARE_KEY.fullmatch(text):
        text = json.dumps(text, ensure_ascii=False)
    return f"{parent}.{text}" if parent else text


class Table:
    """One table of a config being read: its data, its key path and the file it came from.

    Construction rejects keys outside ``known`` (``None``: free-form keys). Every reader
    raises ConfigError naming ``<path>.<key>``. ``json_form`` lets integers arrive as
    decimal strings, as protobuf's JSON form writes 64-bit integers.
    """

    __slots__ = ("source", "path", "data", "json_form")

    def __init__(
        self,
        source: str,
        path: str,
        data: object,
        known: Collection[str] | None,
        *,
        json_form: bool = False,
    ) -> None:
        self.source = source
        self.path = path
        self.json_form = json_form
        if not isinstance(data, Mapping):
            self._raise(path, "a table", data)
        self.data: Mapping[object, object] = data
        if known is not None:
            for key in data:
                if key not in known:
                    self._unknown(key, known)

    # -- errors -------------------------------------------------------------------------

    def fail(self, key: object | None, expected: str, value: object) -> NoReturn:
        """Raise ``<file>: <path>.<key>: expected <expected>, got <value>``."""
        self._raise(self.where(key), expected, value)

    def fail_detail(self, key: object | None, detail: str) -> NoReturn:
        raise ConfigError(self.source, self.where(key), detail=detail)

    def where(self, key: object | None) -> str:
        return self.path if key is None else key_path(self.path, key)

    def _raise(self, where: str, expected: str, value: object) -> NoReturn:
        raise ConfigError(self.source, where, expected=expected, got=render(value))

    def _unknown(self, key: object, known: Collection[str]) -> NoReturn:
        name = str(key)
        close = difflib.get_close_matches(name, list(known), n=1)
        if close:
            hint = f"(did you mean {json.dumps(close[0])}?)"
        elif known:
            hint = "(known keys: " + ", ".join(sorted(known)) + ")"
        else:
            hint = "(this table takes no keys)"
        detail = f"unknown key {json.dumps(name, ensure_ascii=False)} {hint}"
        raise ConfigError(self.source, self.path, detail=detail)

    # -- structure ----------------------------------------------------------------------

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> object:
        return self.data.get(key)

    def items(self) -> list[tuple[object, object]]:
        return list(self.data.items())

    def table(self, key: str, known: Collection[str] | None) -> Table | None:
        """The sub-table at ``key``, or None when absent."""
        if key not in self.data:
            return None
        return self.child(key, self.data[key], known)

    def child(self, key: object, data: object, known: Collection[str] | None) -> Table:
        return Table(self.source, self.where(key), data, known, json_form=self.json_form)

    def tables(self, key: str, known: Collection[str]) -> list[Table]:
        """The array of tables at ``key`` (``[[key]]`` in TOML); empty when absent."""
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            self.fail(key, f"an array of tables ([[{key}]])", value)
        return [
            Table(self.source, f"{self.where(key)}[{i}]", v, known, json_form=self.json_form)
            for i, v in enumerate(value)
        ]

    def _missing(self, key: str) -> NoReturn:
        raise ConfigError(self.source, self.path, detail=f'missing required key "{key}"')

    # -- scalars ------------------------------------------------------------------------

    def string(self, key: str, default: str | None = None, *, non_empty: bool = False) -> str:
        """A string; required when ``default`` is None."""
        if key not in self.data:
            if default is None:
                self._missing(key)
            return default
        value = self.data[key]
        if not isinstance(value, str) or (non_empty and not value):
            self.fail(key, "a non-empty string" if non_empty else "a string", value)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, "a boolean (true or false)", value)
        return value

    def integer(self, key: str, default: int | None = None, *, minimum: int | None = None) -> int:
        """An integer (never a bool or a float), at least ``minimum``; required when
        ``default`` is None."""
        if key not in self.data:
            if default is None:
                self._missing(key)
            return default
        value = self.as_int(self.data[key])
        expected = "an integer" if minimum is None else f"an integer >= {minimum}"
        if value is None or (minimum is not None and value < minimum):
            self.fail(key, expected, self.data[key])
        return value

    def integers(self, key: str, default: Sequence[int] | None = None) -> tuple[int, ...]:
        """A list of integers (range checks are the caller's); required when ``default`` is None."""
        if key not in self.data:
            if default is None:
                self._missing(key)
            return tuple(default)
        value = self.data[key]
        items = [self.as_int(v) for v in value] if isinstance(value, list) else [None]
        result = tuple(i for i in items if i is not None)
        if len(result) != len(items):
            self.fail(key, "a list of integers", value)
        return result

    def enum(self, key: str, default: str, choices: Sequence[str], prefix: str = "") -> str:
        """One of ``choices`` (stored with ``prefix``); the prefix is optional and case
        does not matter, as Triton's JSON parser is case-insensitive too."""
        value = self.data.get(key, default)
        if isinstance(value, str):
            name = value.upper()
            if not name.startswith(prefix):
                name = prefix + name
            if name in choices:
                return name
        self.fail(key, "one of " + ", ".join(choices), value)

    def as_int(self, value: object) -> int | None:
        """``value`` as an int, or None: bools and floats are not integers."""
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if self.json_form and isinstance(value, str) and _DECIMAL.fullmatch(value):
            return int(value)
        return None
