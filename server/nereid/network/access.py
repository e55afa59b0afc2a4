"""Restricted endpoint groups: Triton's ``--http-restricted-api`` and
``--grpc-restricted-protocol`` (``<group>[,<group>...]:<key>=<value>``), parsed once,
and the count of requests refused for want of the key.

Owns the groups' names, the flag syntax, the comparison of a presented value with the
expected one (constant time) and the refusal messages. Which route or RPC belongs to which
group is the business of ``nereid.http`` and ``nereid.grpc``; nothing here knows a wire.
A key's value is never part of a repr, a message or a log line.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

__all__ = ["GROUPS", "GRPC_KEY_PREFIX", "Refusals", "Restriction", "parse_key", "parse_restriction", "restriction_table"]

#: Triton's restricted API / protocol groups.
GROUPS = (
    "health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace",
    "logging",
)
#: the prefix Triton puts before a gRPC restriction's key (the metadata key clients send).
GRPC_KEY_PREFIX = "triton-grpc-protocol-"


@dataclass(frozen=True, slots=True)
class Restriction:
    """Requests to ``groups`` must carry header (metadata key) ``header`` with ``value``.
    ``header`` is as the flag spelt it (for messages, as Triton's); ``name`` is its lower
    case, the way HTTP header names and gRPC metadata keys compare."""

    groups: tuple[str, ...]
    header: str
    value: str = field(repr=False)
    name: str = field(init=False, repr=False, compare=False)
    _expected: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.header.lower())
        object.__setattr__(self, "_expected", self.value.encode())

    def allows(self, presented: bytes | str | None) -> bool:
        """Whether ``presented`` (the request's value of ``header``; None when absent) is the
        expected value, compared in constant time (for values of the same length)."""
        if presented is None:
            return False
        if isinstance(presented, str):
            presented = presented.encode("latin-1", "replace")
        return hmac.compare_digest(presented, self._expected)

    def http_message(self) -> str:
        """Triton's HTTP refusal (status 403)."""
        return f"This API is restricted, expecting header '{self.header}'"

    def grpc_message(self) -> str:
        """Triton's gRPC refusal (status UNAVAILABLE); ``header`` is the full metadata key."""
        return f"This protocol is restricted, expecting header '{self.header}'"


def parse_restriction(spec: str, key_prefix: str = "") -> Restriction:
    """A Restriction from ``<group>[,<group>...]:<key>=<value>``; ``key_prefix`` goes
    before the key (``GRPC_KEY_PREFIX`` for gRPC). ValueError names what is wrong, never
    the value."""
    names, colon, setting = spec.partition(":")
    if not colon:
        raise ValueError(f"expected <group>[,<group>...]:<key>=<value>, got no ':' (groups: {', '.join(GROUPS)})")
    chosen = tuple(name.strip() for name in names.split(","))
    for name in chosen:
        if name not in GROUPS:
            raise ValueError(f"unknown restricted group '{name}' (groups: {', '.join(GROUPS)})")
    return parse_key(setting, chosen, key_prefix)


def parse_key(setting: str, groups: tuple[str, ...] = ("metrics",), key_prefix: str = "") -> Restriction:
    """A Restriction of ``groups`` from ``<key>=<value>`` (``--metrics-restricted-api``)."""
    key, equals, value = setting.partition("=")
    key = key.strip()
    if not equals or not key:
        raise ValueError("expected <key>=<value>, got no '=' or an empty key")
    if not value:
        raise ValueError(f"the value for key '{key}' is empty")
    return Restriction(groups, key_prefix + key, value)


def restriction_table(restrictions: tuple[Restriction, ...], flag: str) -> dict[str, Restriction]:
    """Each restricted group's Restriction. ValueError when a group is in two of them
    (Triton refuses that too)."""
    table: dict[str, Restriction] = {}
    for restriction in restrictions:
        for group in restriction.groups:
            if group in table:
                raise ValueError(f"{flag}: group '{group}' can not be specified in multiple config groups")
            table[group] = restriction
    return table


class Refusals:
    """Requests refused for want of a restricted group's key, by protocol and group
    (read by the metrics port)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        #: (protocol: http, grpc or metrics; group) -> requests refused
        self.counts: dict[tuple[str, str], int] = {}

    def count(self, protocol: str, group: str) -> None:
        key = (protocol, group)
        self.counts[key] = self.counts.get(key, 0) + 1
