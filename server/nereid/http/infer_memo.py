"""InferMemo: the memo in front of the infer path for what a steady client sends again,
and ``HttpModelTables``: one served model version's lookup tables with its memo.

Clients repeat themselves: perf_analyzer and tritonclient send the same JSON header with
every request of a given shape (only the tensor bytes change), and the answers to them
have the same JSON header too (only the output bytes change). One served model version
keeps an ``InferMemo`` of both (in its ``HttpModelTables``, kept per served model
version by ``HttpTablesCache`` and dropped with it):

- a request whose JSON header (and body length) was seen twice gets a *plan*: everything
  the full parser decided from it. ``parse`` answers a repeat from its plan (the arrays
  are made from the new body) and ``learn_request`` makes plans from full parses;
- an answer whose outputs all go out as binary blobs has a JSON header that depends only
  on the request's output selection, id, model version and each output's name, dtype and
  shape: ``answer`` gives a repeat its headers and body parts, ``learn_answer`` keeps
  them from a full encode.

A client that gives each request an id of its own (perf_analyzer ``--async``, tracing
clients: ``{"id":"281474976710657",...``) repeats everything but the id. Where the id
leads the JSON header and is a plain string (no escape, no control character: its text
is its bytes), plan and answer are kept for the header with the id cut out and the id's
length, and each repeat puts its own id back (``_without_id``): the same request and the
same answer bytes as the full path, without a full parse and encode per id.

The caller reads as: shortcut, else the full path, then learn. ``parse`` and ``answer``
never guess: None means "not a repeat", and the full path decides and reports. Property
tests check that a repeat's request and answer equal the full path's, byte for byte;
``counters`` says how often each shortcut was taken.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from nereid.config.schema import ModelConfig
from nereid.datatypes import DataType
from nereid.tensors import wire_inputs
from nereid.tensors import wire_outputs
from nereid.inference import InferRequest, ParameterValue, RequestedOutput
from nereid.tensors.assembly import outputs_key
from nereid.tensors.tables import ModelTables

__all__ = ["HttpModelTables", "HttpTablesCache", "InferMemo", "LearntAnswer", "MemoCounters"]

#: headers longer than this (JSON data, usually) are parsed every time, not planned.
_PLAN_MAX_HEADER = 4096
#: plans and answers remembered per model version; past it the memo starts afresh.
_CACHE_SIZE = 256
#: how a JSON header that leads with its id begins (perf_analyzer and orjson write the
#: first, tritonclient's json.dumps the second)
_ID_OPENINGS = (b'{"id":"', b'{"id": "')
#: the bytes that cannot stand in a JSON string as they are
_CONTROL = bytes(range(32))


#: how an answer's JSON header that carries an id begins (infer_response.py, orjson)
_ANSWER_OPENING = b'{"id":"'
_ANSWER_ID_AT = len(_ANSWER_OPENING)


def _plain(text: bytes) -> bool:
    """Whether ``text`` stands in a JSON string as it is: no quote, no backslash (an
    escape), no control character."""
    return b'"' not in text and b"\\" not in text and len(text.translate(None, _CONTROL)) == len(text)


def _answer_id(request_id: str) -> bytes | None:
    """The id's bytes where an answer's JSON header holds them as they are (orjson
    escapes only quotes, backslashes and control characters), else None."""
    try:
        text = request_id.encode()
    except UnicodeEncodeError:  # a lone surrogate, from a \ud800 escape
        return None
    return text if _plain(text) else None


def _without_id(header: bytes) -> tuple[bytes, int, str] | None:
    """``header`` without the text of the id it leads with, that text's length in bytes,
    and the id, when the id is plain (``_plain``, and UTF-8: its text is its bytes).
    None otherwise, or when the id does not lead."""
    for opening in _ID_OPENINGS:
        if header.startswith(opening):
            start = len(opening)
            end = header.find(b'"', start)
            if end < 0:
                return None
            text = header[start:end]
            if not _plain(text):
                return None
            try:
                request_id = text.decode("utf-8")
            except UnicodeDecodeError:
                return None
            return header[:start] + header[end:], end - start, request_id
    return None


@dataclasses.dataclass(slots=True)
class MemoCounters:
    """How often each shortcut was taken (tests assert on these)."""

    requests: int = 0  # requests made from a plan
    answers: int = 0  # answers made from a remembered header
    plans: int = 0  # plans learnt
    replies: int = 0  # answer headers learnt


@dataclasses.dataclass(slots=True)  # not frozen: a frozen init costs more than the fields
class _Plan:
    """Everything the full parser decided from one JSON header and the body's length.
    Only requests whose inputs are all binary blobs and whose outputs use no shared
    memory get one, so nothing in it depends on the body beyond its length, except
    BYTES framing, which is checked again every time."""

    request_id: str
    prefix: str
    parameters: dict[str, ParameterValue]
    priority: int
    timeout_us: int | None
    binary_data_output: bool
    outputs: tuple[RequestedOutput, ...] | None
    rows: int
    #: the inputs in Triton's check order, by name (their buffer unset: a plan keeps no
    #: body alive), and their names in request order when that differs.
    inputs: tuple[wire_inputs.WireInput, ...]
    order: tuple[str, ...] | None
    #: every input's view_spec, when each is a plain view of the body (numeric, not BOOL).
    views: tuple[wire_inputs.ViewSpec, ...] | None


@dataclasses.dataclass(frozen=True, slots=True)
class LearntAnswer:
    """What the full encoder tells about an uncompressed answer it made (see
    infer_response.encode_answer): whether its header may serve repeats, and what a
    repeat needs to rebuild the same bytes."""

    header: bytes
    #: the outputs sent as blobs, in order, with their datatypes.
    sent: tuple[tuple[str, DataType], ...]
    #: the answer's HTTP headers, content-length included.
    headers: tuple[tuple[bytes, bytes], ...]
    #: every blob is one ``tobytes`` copy of its output (wire_outputs.copied_whole).
    copied: bool


@dataclasses.dataclass(frozen=True, slots=True)
class _Reply:
    """A remembered answer header; ``requested`` is the very ``request.outputs`` object
    it was made for (the key holds its id, meaningful only while that object lives)."""

    requested: tuple[RequestedOutput, ...] | None
    learnt: LearntAnswer
    #: kept under its id's length (the header leads with that plain id): each repeat's
    #: header is this one with its own id put in its place
    swaps_id: bool = False


class InferMemo:
    """The memo of one served model version: request plans and answer headers."""

    __slots__ = ("_plans", "_seen", "_replies", "counters")

    def __init__(self) -> None:
        #: by (header, body length, JSON limit), or for a header that leads with a plain id
        #: (the header without the id's text, the id's length, body length, JSON limit)
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._seen: set[tuple[Any, ...]] = set()  # headers parsed once, not yet planned
        self._replies: dict[tuple[Any, ...], _Reply] = {}
        self.counters = MemoCounters()

    # -- requests ------------------------------------------------------------------------

    def parse(
        self, body: bytes, header_length: str | None, model_name: str, model_version: int | None, max_json_size: int
    ) -> InferRequest | None:
        """The request a planned header's body parses to, or None (not a repeat: parse it
        in full). Raises InvalidInputError only for BYTES framing, as the full parser
        would for the same body."""
        if header_length is None or not (header_length.isdigit() and header_length.isascii() and len(header_length) <= 10):
            return None
        json_length = int(header_length)
        total = len(body)
        if not 0 < json_length <= min(total, max_json_size, _PLAN_MAX_HEADER):
            return None
        header = body[:json_length]
        plan = self._plans.get((header, total, max_json_size))
        request_id = None
        if plan is None:  # a header planned but for its own id?
            split = _without_id(header)
            if split is None:
                return None
            rest, id_length, request_id = split
            plan = self._plans.get((rest, id_length, total, max_json_size))
            if plan is None:
                return None
        if plan.views is not None:
            arrays = wire_inputs.body_views(plan.views, body)
        else:
            prefix = plan.prefix if request_id is None else f"[request id: {request_id}] "
            arrays = {item.name: wire_inputs.to_array(item, model_name, prefix, body) for item in plan.inputs}
            if plan.order is not None:
                arrays = {name: arrays[name] for name in plan.order}
        self.counters.requests += 1
        # InferRequest's fields in order (positional: this runs once per request)
        return InferRequest(
            model_name, arrays, plan.rows, plan.request_id if request_id is None else request_id, model_version,
            plan.outputs,
            dict(plan.parameters) if plan.parameters else {}, plan.priority, plan.timeout_us,
            plan.binary_data_output,
        )

    def learn_request(
        self,
        body: bytes,
        json_length: int,
        max_json_size: int,
        request: InferRequest,
        inputs: Mapping[str, wire_inputs.WireInput],
        prefix: str,
    ) -> None:
        """Remember a fully parsed request's header: planned the second time it is seen
        (a header seen once, as with a per-request id, only costs a set entry)."""
        if not 0 < json_length <= _PLAN_MAX_HEADER or request.sequence is not None:
            return  # a sequence's requests differ in their flags: no repeats to plan
        header = body[:json_length]
        key: tuple[Any, ...] = (header, len(body), max_json_size)
        if request.id:
            split = _without_id(header)
            # the id that leads is the request's (not a later "id" key, nor one spelt with
            # an escape: the header has no other "id" and no \u)
            if split is not None and header.count(b'"id"') == 1 and b"\\u" not in header:
                key = (split[0], split[1], len(body), max_json_size)
        if key in self._plans:
            return
        seen = self._seen
        if key not in seen:
            if len(seen) >= _CACHE_SIZE:
                seen.clear()  # unique headers must not pile up
            seen.add(key)
            return
        if any(item.source != wire_inputs.BINARY for item in inputs.values()):
            return
        if request.outputs is not None and any(out.shm_region is not None for out in request.outputs):
            return
        stripped = tuple(
            wire_inputs.WireInput(item.name, item.dt, item.shape, item.source, None, item.offset, item.size, item.negative)
            for item in (inputs[name] for name in sorted(inputs))
        )
        order = tuple(inputs) if list(inputs) != sorted(inputs) else None
        specs = [wire_inputs.view_spec(item) for item in inputs.values()]
        views = tuple(spec for spec in specs if spec is not None) if None not in specs else None
        if len(self._plans) >= _CACHE_SIZE:
            self._plans.clear()
        self._plans[key] = _Plan(
            request.id, prefix, dict(request.parameters), request.priority, request.timeout_us,
            request.binary_data_output, request.outputs, request.rows, stripped, order, views,
        )
        self.counters.plans += 1

    # -- answers -------------------------------------------------------------------------

    def answer(
        self, request: InferRequest, outputs: Mapping[str, Any], model_version: int
    ) -> tuple[tuple[tuple[bytes, bytes], ...], list[Any]] | None:
        """The uncompressed answer of a request whose answer header is remembered: its
        HTTP headers (the same object each time) and its body as parts to join (JSON
        header, then blobs). None when it is not: encode it in full."""
        swap = _answer_id(request.id) if request.id else None
        key = _answer_key(request, outputs, model_version, swap)
        if key is None:
            return None
        known = self._replies.get(key)
        if known is None or known.requested is not request.outputs:
            return None
        learnt = known.learnt
        header = learnt.header
        if known.swaps_id:  # its own id, of the same length, in place of the one learnt
            assert swap is not None
            header = header[:_ANSWER_ID_AT] + swap + header[_ANSWER_ID_AT + len(swap):]
        parts = [header]
        if learnt.copied:
            for name, _ in learnt.sent:
                parts.append(outputs[name].tobytes())
        else:
            for name, dt in learnt.sent:
                parts.extend(wire_outputs.binary_blob(outputs[name], dt, name, request.model_name)[0])
        self.counters.answers += 1
        return learnt.headers, parts

    def learn_answer(
        self, request: InferRequest, outputs: Mapping[str, Any], model_version: int, learnt: LearntAnswer
    ) -> None:
        """Remember the header of a fully encoded answer the encoder found reusable: under
        its id's length where the header leads with that id as it is, else under the id."""
        swap = _answer_id(request.id) if request.id else None
        if swap is not None and not learnt.header.startswith(_ANSWER_OPENING + swap + b'",'):
            swap = None
        key = _answer_key(request, outputs, model_version, swap)
        if key is None:
            return
        known = self._replies.get(key)
        if known is not None and known.requested is request.outputs:
            return  # known already: its headers stay the same object (engines key on it)
        if len(self._replies) >= _CACHE_SIZE:
            self._replies.clear()  # answers of ever-changing shapes must not pile up
        self._replies[key] = _Reply(request.outputs, learnt, swap is not None)
        self.counters.replies += 1


def _answer_key(
    request: InferRequest, outputs: Mapping[str, Any], model_version: int, swap: bytes | None
) -> tuple[Any, ...] | None:
    """What an answer header is remembered by: the request's output selection, its id (or,
    where the header holds it as it is: ``swap``, its length), the model version and each
    output's name, dtype and shape (None: an output is not a numpy array)."""
    return outputs_key(
        [id(request.outputs), request.binary_data_output, request.id if swap is None else len(swap),
         request.model_name, model_version], outputs,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class HttpModelTables(ModelTables):
    """What the HTTP infer path needs of one served model version, made once: its lookup
    tables (ModelTables) and the memo of its repeated requests and answers (``memo``).
    The parser and encoder take one, or a plain ModelConfig (a fresh one per call)."""

    memo: InferMemo

    @classmethod
    def for_config(cls, config: ModelConfig) -> HttpModelTables:
        return cls(**ModelTables.fields_for(config), memo=InferMemo())  # type: ignore[arg-type]

    @classmethod
    def of(cls, config: ModelConfig | HttpModelTables) -> HttpModelTables:
        """``config`` itself when it is an HttpModelTables, else a fresh one."""
        return config if isinstance(config, HttpModelTables) else cls.for_config(config)


class HttpTablesCache:
    """One HttpModelTables per served model version (any object that has a ``config``),
    held weakly: an unloaded model's tables go with it. The one asked for last is found
    through one weak reference (most requests ask for the same model as the last one)."""

    __slots__ = ("_tables", "_last")

    def __init__(self) -> None:
        self._tables: weakref.WeakKeyDictionary[Any, HttpModelTables] = weakref.WeakKeyDictionary()
        self._last: tuple[weakref.ref[Any], HttpModelTables] | None = None

    def get(self, serving: Any) -> HttpModelTables:
        last = self._last
        if last is not None and last[0]() is serving:
            return last[1]
        found = self._tables.get(serving)
        if found is None:
            found = self._tables[serving] = HttpModelTables.for_config(serving.config)
        self._last = (weakref.ref(serving), found)
        return found
