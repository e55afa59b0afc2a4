"""``sequence_batching``, both ways: the typed walk of its table (config.toml, or the JSON
form a config.pbtxt or a load override arrives in), its rules, and its Triton JSON.

Owns the keys, rules and JSON spelling of Triton's ``ModelSequenceBatching``; load.py and
triton_json.py call it for that one section. Knows nothing about serving it
(scheduling/sequences.py).
"""

from __future__ import annotations

from typing import Callable, NoReturn

from nereid.config._walk import Table, render
from nereid.config.schema import (
    ModelConfig,
    SequenceBatching,
    SequenceControl,
    SequenceControlInput,
    SequenceInitialState,
    SequenceState,
    SequenceStrategy,
)
from nereid.datatypes import DATATYPES, DataType, by_config_name
from nereid.errors import ConfigError

__all__ = [
    "BOOLEAN_CONTROLS", "CORRID", "CORRID_TYPES", "END", "READY", "START", "SEQUENCE_BATCHING_KEYS",
    "check_sequence_batching", "parse_sequence_batching", "render_sequence_batching",
]  # fmt: skip

START = "CONTROL_SEQUENCE_START"
READY = "CONTROL_SEQUENCE_READY"
END = "CONTROL_SEQUENCE_END"
CORRID = "CONTROL_SEQUENCE_CORRID"
BOOLEAN_CONTROLS = (START, END, READY)
_KINDS = (START, READY, END, CORRID)
#: The data types a CORRID control may have (Triton's ValidateModelConfig).
CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
#: Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS: what 0 (or nothing) in the file means.
IDLE_DEFAULT_US = 1_000_000

SEQUENCE_BATCHING_KEYS = (
    "direct", "oldest", "max_sequence_idle_microseconds", "control_input", "state", "iterative_sequence",
)  # fmt: skip
_DIRECT_KEYS = ("max_queue_delay_microseconds", "minimum_slot_utilization")
_OLDEST_KEYS = ("max_candidate_sequences", "preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering")
_CONTROL_INPUT_KEYS = ("name", "control")
_CONTROL_KEYS = ("kind", "int32_false_true", "fp32_false_true", "bool_false_true", "data_type")
_STATE_KEYS = (
    "input_name", "output_name", "data_type", "dims", "initial_state",
    "use_same_buffer_for_input_output", "use_growable_memory",
)  # fmt: skip
_INITIAL_STATE_KEYS = ("data_type", "dims", "zero_data", "data_file", "name")
_DATA_TYPE_NAMES = ", ".join(dt.config_name for dt in DATATYPES)


# -- the walk ---------------------------------------------------------------------------


def parse_sequence_batching(table: Table, max_batch_size: int) -> SequenceBatching:
    """The ``sequence_batching`` table as a record (single-field checks only; the rules
    that relate it to the rest of the config are ``check_sequence_batching``'s), with
    Triton's normalization: oldest's preferred_batch_size defaults to [max_batch_size]."""
    if table.has("direct") and table.has("oldest"):
        table.fail_detail(None, "set one of direct and oldest, not both (Triton's strategy_choice is a oneof)")
    strategy: SequenceStrategy | None = None
    direct = table.table("direct", _DIRECT_KEYS)
    oldest = table.table("oldest", _OLDEST_KEYS)
    if direct is not None:
        strategy = SequenceStrategy(
            "direct",
            max_queue_delay_microseconds=direct.integer("max_queue_delay_microseconds", 0, minimum=0),
            minimum_slot_utilization=_number(direct, "minimum_slot_utilization", 0.0),
        )
    elif oldest is not None:
        strategy = SequenceStrategy(
            "oldest",
            max_queue_delay_microseconds=oldest.integer("max_queue_delay_microseconds", 0, minimum=0),
            max_candidate_sequences=oldest.integer("max_candidate_sequences", 0, minimum=0),
            preferred_batch_size=oldest.integers("preferred_batch_size", ())
            or ((max_batch_size,) if max_batch_size > 0 else ()),
            preserve_ordering=oldest.boolean("preserve_ordering", False),
        )
    idle = table.integer("max_sequence_idle_microseconds", 0, minimum=0)
    return SequenceBatching(
        strategy=strategy,
        max_sequence_idle_microseconds=idle or IDLE_DEFAULT_US,
        control_input=tuple(_control_input(t) for t in table.tables("control_input", _CONTROL_INPUT_KEYS)),
        state=tuple(_state(t) for t in table.tables("state", _STATE_KEYS)),
        iterative_sequence=table.boolean("iterative_sequence", False),
    )


def _number(table: Table, key: str, default: float) -> float:
    value = table.raw(key) if table.has(key) else default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        table.fail(key, "a number", value)
    return float(value)


def _data_type(table: Table, key: str, default: str | None = None) -> DataType | None:
    name = table.string(key, default)
    if not name or name.upper() in ("TYPE_INVALID", "INVALID"):
        return None  # protobuf's default: "not set"
    data_type = by_config_name(name.upper())
    if data_type is None:
        table.fail(key, f"one of {_DATA_TYPE_NAMES} (the TYPE_ prefix is optional)", name)
    return data_type


def _required_type(table: Table, key: str) -> DataType:
    data_type = _data_type(table, key)
    if data_type is None:
        table.fail(key, f"one of {_DATA_TYPE_NAMES}", table.raw(key))
    return data_type


def _control_input(table: Table) -> SequenceControlInput:
    controls = []
    for control in table.tables("control", _CONTROL_KEYS):
        floats = control.raw("fp32_false_true") if control.has("fp32_false_true") else []
        if not isinstance(floats, list) or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in floats):
            control.fail("fp32_false_true", "a list of two numbers", floats)
        flags = control.raw("bool_false_true") if control.has("bool_false_true") else []
        if not isinstance(flags, list) or any(not isinstance(v, bool) for v in flags):
            control.fail("bool_false_true", "a list of two booleans", flags)
        controls.append(SequenceControl(
            # protobuf's JSON leaves the enum's default (START, 0) out
            kind=control.enum("kind", START, _KINDS, "CONTROL_SEQUENCE_"),
            int32_false_true=control.integers("int32_false_true", ()),
            fp32_false_true=tuple(float(v) for v in floats),
            bool_false_true=tuple(flags),
            data_type=_data_type(control, "data_type", ""),
        ))
    return SequenceControlInput(name=table.string("name", ""), control=tuple(controls))


def _state(table: Table) -> SequenceState:
    dims = table.integers("dims", ())
    if any(d < 1 and d != -1 for d in dims):
        table.fail("dims", "a list of integers, each -1 (any size) or >= 1", table.raw("dims"))
    return SequenceState(
        input_name=table.string("input_name", non_empty=True),
        output_name=table.string("output_name", non_empty=True),
        data_type=_required_type(table, "data_type"),
        dims=dims,
        initial_state=tuple(_initial_state(t) for t in table.tables("initial_state", _INITIAL_STATE_KEYS)),
        use_same_buffer_for_input_output=table.boolean("use_same_buffer_for_input_output", False),
        use_growable_memory=table.boolean("use_growable_memory", False),
    )


def _initial_state(table: Table) -> SequenceInitialState:
    given = [key for key in ("zero_data", "data_file") if table.has(key)]
    if len(given) != 1:
        got = " and ".join(given) if given else "none of them"
        table.fail_detail(None, f"expected exactly one of zero_data, data_file, got {got}")
    if table.has("zero_data") and not table.boolean("zero_data", True):
        table.fail("zero_data", "true (or data_file instead)", False)
    dims = table.integers("dims", ())
    if any(d < 1 for d in dims):
        table.fail("dims", "a list of integers >= 1 (initial state has fixed sizes)", table.raw("dims"))
    return SequenceInitialState(
        data_type=_required_type(table, "data_type"),
        dims=dims,
        zero_data=table.has("zero_data"),
        data_file=table.string("data_file", "", non_empty=table.has("data_file")),
        name=table.string("name", ""),
    )


# -- the rules --------------------------------------------------------------------------


def check_sequence_batching(config: ModelConfig, source: str) -> None:
    """Triton's rules for sequence_batching (ValidateModelConfig, the python backend's and
    the scheduler's), plus what nereid does not serve. Raises ConfigError."""
    batching = config.sequence_batching
    if batching is None:
        return

    def fail(where: str, detail: str) -> NoReturn:
        raise ConfigError(source, "sequence_batching" + where, detail=detail)

    if config.dynamic_batching is not None:
        raise ConfigError(source, "dynamic_batching", detail=(
            "a model has one scheduler: dynamic_batching or sequence_batching, not both "
            "(sequence_batching batches sequences itself: see its direct and oldest strategies)"))
    if config.decoupled:
        fail("", "nereid serves sequence batching for non-decoupled models only "
                 "(model_transaction_policy.decoupled is true)")
    if batching.iterative_sequence:
        fail(".iterative_sequence", "not supported by nereid (set false or leave it out)")
    taken = {tensor.name: "an [[input]]" for tensor in config.input}
    taken.update({tensor.name: "an [[output]]" for tensor in config.output})
    seen_kinds: set[str] = set()
    for index, control_input in enumerate(batching.control_input):
        where = f".control_input[{index}]"
        if not control_input.name:
            fail(where, "sequence batching control tensor must have a name")
        if control_input.name in taken:
            fail(where + ".name", f'"{control_input.name}" is already {taken[control_input.name]} of the model '
                                  "(the server fills a control input; the client never sends it)")
        taken[control_input.name] = "a control input"
        if len(control_input.control) != 1:
            fail(where + ".control", f"sequence batching control tensor '{control_input.name}' must have only a "
                                     f"single control kind (got {len(control_input.control)})")
        control = control_input.control[0]
        if control.kind in seen_kinds:
            fail(where, f"sequence batching specifies multiple {control.kind} tensors for {config.name}")
        seen_kinds.add(control.kind)
        _check_control(control, control_input.name, where + ".control[0]", config.name, fail)
    _check_states(batching.state, taken, fail)
    strategy = batching.strategy
    if strategy is not None and strategy.kind == "oldest":
        for size in strategy.preferred_batch_size:
            if size <= 0:
                fail(".oldest.preferred_batch_size",
                     f"sequence batching preferred batch size must be positive for {config.name}")
            if size > config.max_batch_size:
                fail(".oldest.preferred_batch_size",
                     f"sequence batching preferred batch size must be <= max batch size for {config.name}")
    if strategy is not None and strategy.kind == "direct" and not 0.0 <= strategy.minimum_slot_utilization <= 1.0:
        fail(".direct.minimum_slot_utilization",
             f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {config.name}")


def _check_states(
    states: tuple[SequenceState, ...], taken: dict[str, str], fail: Callable[[str, str], NoReturn]
) -> None:
    """Each state's tensor names are the model's own (``taken``: the names in use, and
    by what), and its initial state, if any, fits it."""
    for index, state in enumerate(states):
        where = f".state[{index}]"
        for key, name in (("input_name", state.input_name), ("output_name", state.output_name)):
            if name in taken:
                fail(f"{where}.{key}", f'"{name}" is already {taken[name]} of the model')
            taken[name] = "a state tensor"
        if len(state.initial_state) > 1:
            fail(where + ".initial_state", f"initial_state field for state input '{state.input_name}' must contain "
                                           f"exactly one or zero element. Found '{len(state.initial_state)}' elements.")
        for initial in state.initial_state:
            if initial.data_type != state.data_type:
                fail(where + ".initial_state[0].data_type",
                     f"expected {state.data_type.config_name} (the state's), got {initial.data_type.config_name}")
            if not _fits(initial.dims, state.dims):
                fail(where + ".initial_state[0].dims",
                     f"expected dims matching the state's {list(state.dims)}, got {list(initial.dims)}")


def _fits(dims: tuple[int, ...], pattern: tuple[int, ...]) -> bool:
    return len(dims) == len(pattern) and all(p == -1 or p == d for d, p in zip(dims, pattern))


def _check_control(control: SequenceControl, name: str, where: str, model: str,
                   fail: Callable[[str, str], NoReturn]) -> None:
    """Triton's GetBooleanSequenceControlProperties / GetTypedSequenceControlProperties."""
    pairs = [key for key, values in (("int32_false_true", control.int32_false_true),
                                     ("fp32_false_true", control.fp32_false_true),
                                     ("bool_false_true", control.bool_false_true)) if values]
    if control.kind == CORRID:
        if pairs:
            fail(where, f"sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                        f"'bool_false_true' for {CORRID} for {model}")
        if control.data_type is None:
            fail(where + ".data_type", f"sequence batching control tensor must specify a {CORRID} value for {model}")
        if control.data_type.config_name not in CORRID_TYPES:
            fail(where + ".data_type", f"unexpected data type for control {CORRID} for {model}. Allowed data types "
                                       "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING")
        return
    if not pairs:
        fail(where, f"sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                    f"'bool_false_true' for {control.kind} for {model}")
    if len(pairs) > 1:
        fail(where, f"sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
                    f"'bool_false_true' for {control.kind} for {model}")
    values = getattr(control, pairs[0])
    if len(values) != 2:
        fail(where + "." + pairs[0], f"sequence batching control '{pairs[0]}' must have exactly 2 entries for "
                                     f"{control.kind} for {model} (got {render(list(values))})")
    if control.data_type is not None:
        fail(where + ".data_type", f"a data_type is for {CORRID} only; {control.kind}'s type follows its "
                                   f"{pairs[0]} ({name})")


# -- the JSON form ----------------------------------------------------------------------


def render_sequence_batching(batching: SequenceBatching) -> dict[str, object]:
    """Triton's JSON of ``batching`` as /config shows it (every scalar present, fields in
    protobuf order)."""
    rendered: dict[str, object] = {
        "max_sequence_idle_microseconds": batching.max_sequence_idle_microseconds,
        "control_input": [
            {"name": item.name, "control": [_control(control) for control in item.control]}
            for item in batching.control_input
        ],
    }
    strategy = batching.strategy
    if strategy is not None and strategy.kind == "direct":
        rendered["direct"] = {
            "max_queue_delay_microseconds": strategy.max_queue_delay_microseconds,
            "minimum_slot_utilization": strategy.minimum_slot_utilization,
        }
    elif strategy is not None:
        rendered["oldest"] = {
            "max_candidate_sequences": strategy.max_candidate_sequences,
            "preferred_batch_size": list(strategy.preferred_batch_size),
            "max_queue_delay_microseconds": strategy.max_queue_delay_microseconds,
            "preserve_ordering": strategy.preserve_ordering,
        }
    rendered["state"] = [_state_json(state) for state in batching.state]
    rendered["iterative_sequence"] = batching.iterative_sequence
    return rendered


def _control(control: SequenceControl) -> dict[str, object]:
    return {
        "kind": control.kind,
        "int32_false_true": list(control.int32_false_true),
        "fp32_false_true": list(control.fp32_false_true),
        "bool_false_true": list(control.bool_false_true),
        "data_type": control.data_type.config_name if control.data_type is not None else "TYPE_INVALID",
    }


def _state_json(state: SequenceState) -> dict[str, object]:
    initial_states = []
    for initial in state.initial_state:
        rendered: dict[str, object] = {"data_type": initial.data_type.config_name, "dims": list(initial.dims)}
        if initial.zero_data:  # a protobuf oneof: only the member that is set appears
            rendered["zero_data"] = True
        else:
            rendered["data_file"] = initial.data_file
        rendered["name"] = initial.name
        initial_states.append(rendered)
    return {
        "input_name": state.input_name,
        "output_name": state.output_name,
        "data_type": state.data_type.config_name,
        "dims": list(state.dims),
        "initial_state": initial_states,
        "use_same_buffer_for_input_output": state.use_same_buffer_for_input_output,
        "use_growable_memory": state.use_growable_memory,
    }
