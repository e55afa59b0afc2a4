"""TurnResults: the outputs of the decoded requests one worker's link answered over a loop
turn, sent to the worker together at the turn's end.

Outputs of one model version and kind (each output's name, dtype and shape past the rows)
are joined into one block of the arena's answer half, one copy per output name, each
request's rows after the other's, and named in one RESULTS message ((id, rows) each; a
bundle's requests one after the other); what cannot be joined (a scalar, a BYTES output)
or finds no room goes as a RESULT per request. The worker encodes each answer from its
rows and lets the block go (FREED).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from nereid.errors import InternalError, NereidError
from nereid.frontends.arena import Arena, Ring
from nereid.frontends.layout import layout_size, row_signature, rows_size, write_arrays, write_rows
from nereid.frontends.messages import Kind

__all__ = ["TurnResults"]

_log = logging.getLogger("nereid")

_RESULT, _RESULTS = Kind.RESULT.value, Kind.RESULTS.value

#: who an entry answers: a request's id, or a bundle's ((id, rows), ...)
Answered = Any


class TurnResults:
    """The outputs answered over this turn (``add``), sent at its end (``send``) through
    ``send`` (a message to the worker) into ``arena``'s answer half (blocks from
    ``ring``); a request whose outputs cannot be sent fails through ``send_error``."""

    def __init__(self, arena: Arena, ring: Ring, send: Callable[[tuple[Any, ...]], None],
                 send_error: Callable[[int, NereidError], None], index: int) -> None:
        self._arena = arena
        self._ring = ring
        self._send = send
        self._send_error = send_error
        self._index = index
        self._answered: list[tuple[Answered, int, dict[str, Any]]] = []

    def add(self, id: Answered, version: int, outputs: dict[str, Any]) -> bool:
        """``id``'s outputs (a request's, or a bundle's: its requests' rows one after the
        other), to go at this turn's end. True when they are the turn's first: the
        caller has ``send`` called then. A model's outputs are never written again
        once returned, so they are read at the send."""
        self._answered.append((id, version, outputs))
        return len(self._answered) == 1

    def clear(self) -> None:
        """The worker is gone: nothing is sent."""
        self._answered = []

    def send(self) -> None:
        """This turn's outputs: those of one version and kind of outputs joined into one
        arena block, one copy per output name, one RESULTS message (a RESULT each when
        they cannot be joined, or the arena has no room)."""
        answered, self._answered = self._answered, []
        groups: dict[tuple[Any, ...], list[tuple[Any, int, dict[str, Any]]]] = {}
        for id, version, outputs in answered:
            if len(outputs) == 1:  # the common case, row_signature's without its call
                [(name, array)] = outputs.items()
                if array.ndim == 0 or array.dtype.hasobject:
                    self._send_alone(id, version, outputs)
                    continue
                key: tuple[Any, ...] = (version, ((name, array.dtype, array.shape[1:]),))
                rows = array.shape[0]
            else:
                joinable = row_signature(outputs)
                if joinable is None:
                    self._send_alone(id, version, outputs)
                    continue
                key, rows = (version, joinable[0]), joinable[1]
            group = groups.get(key)
            if group is None:
                groups[key] = [(id, rows, outputs)]
            else:
                group.append((id, rows, outputs))
        for (version, signature), group in groups.items():
            self._send_group(version, signature, group)

    def _send_group(self, version: int, signature: tuple[Any, ...], group: list[tuple[Any, int, dict[str, Any]]]) -> None:
        """Outputs of one version and signature in one block: a request's (its id) or a
        bundle's (its ((id, rows), ...)) rows after the other's."""
        rows = 0
        for _, count, _ in group:
            rows += count
        size = rows_size(signature, rows)
        offset = self._ring.allocate(size)
        if offset is None:
            for id, _, outputs in group:
                self._send_alone(id, version, outputs)
            return
        try:
            layout = write_rows(self._arena.answers[offset:offset + size], signature, rows,
                                [outputs for _, _, outputs in group])
        except Exception as exc:  # a bug: these requests fail, loudly
            self._ring.free(offset)
            _log.exception("sending outputs to HTTP worker %d failed", self._index)
            for id, _, _ in group:
                for one, _ in _members(id, 0):
                    self._send_error(one, InternalError(f"internal error in infer: {exc}"))
            return
        entries: list[tuple[int, int]] = []
        for id, count, _ in group:
            entries += _members(id, count)
        self._send((_RESULTS, version, offset, layout, tuple(entries)))

    def _send_alone(self, id: Any, version: int, outputs: dict[str, Any]) -> None:
        """One request's outputs on their own (RESULT); a bundle's, each request's rows."""
        if type(id) is not int:  # a bundle's
            start = 0
            for one, rows in id:
                self._send_alone(one, version, {name: array[start:start + rows] for name, array in outputs.items()})
                start += rows
            return
        try:
            self._send_result(id, version, outputs)
        except Exception as exc:  # a bug: this request fails, loudly
            _log.exception("sending outputs to HTTP worker %d failed", self._index)
            self._send_error(id, InternalError(f"internal error in infer: {exc}"))

    def _send_result(self, id: int, version: int, outputs: dict[str, Any]) -> None:
        """One request's outputs into the arena's answer half (inline when there is no
        room, or a BYTES output: copied, as the message is pickled at the flush)."""
        size = layout_size(outputs)
        offset = self._ring.allocate(size) if size is not None else None
        if offset is None or size is None:
            self._send((_RESULT, id, version, -1, None, {name: array.copy() for name, array in outputs.items()}))
            return
        layout = write_arrays(self._arena.answers[offset:offset + size], outputs)
        self._send((_RESULT, id, version, offset, layout, None))


def _members(id: Answered, rows: int) -> Any:
    """The (id, rows) of an entry's requests: its own, or a bundle's."""
    return ((id, rows),) if type(id) is int else id
