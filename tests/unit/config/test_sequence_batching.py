"""sequence_batching in config.toml and config.pbtxt: the walk, Triton's defaults and
rules, and the /config JSON (round trip through the JSON form)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from nereid.config import config_from_triton_json, parse_model_config, to_triton_json
from nereid.config.pbtxt import load_pbtxt_config
from nereid.errors import ConfigError

HEAD = """
name = "seq"
max_batch_size = 4
[[input]]
name = "INPUT"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "OUTPUT"
data_type = "TYPE_INT32"
dims = [1]
"""

START = """
[[sequence_batching.control_input]]
name = "START"
control = [{ kind = "CONTROL_SEQUENCE_START", int32_false_true = [0, 1] }]
"""


def load(text: str) -> object:
    return parse_model_config(tomllib.loads(HEAD + text), source="config.toml", folder_name="seq")


def error(text: str) -> str:
    with pytest.raises(ConfigError) as raised:
        load(text)
    return str(raised.value)


def test_an_empty_section_gets_tritons_one_second_idle_time_and_no_strategy() -> None:
    config = load("[sequence_batching]\n")
    rendered = to_triton_json(config)["sequence_batching"]
    assert rendered == {"max_sequence_idle_microseconds": 1_000_000, "control_input": [], "state": [],
                        "iterative_sequence": False}


def test_oldest_preferred_batch_size_defaults_to_max_batch_size() -> None:
    config = load("[sequence_batching]\noldest = { max_candidate_sequences = 8 }\n")
    assert to_triton_json(config)["sequence_batching"]["oldest"] == {
        "max_candidate_sequences": 8, "preferred_batch_size": [4], "max_queue_delay_microseconds": 0,
        "preserve_ordering": False}


def test_controls_and_state_render_as_triton_json_and_read_back_equal() -> None:
    config = load("[sequence_batching]\ndirect = { max_queue_delay_microseconds = 100 }\n" + START + """
[[sequence_batching.control_input]]
name = "CORRID"
control = [{ kind = "CORRID", data_type = "UINT64" }]
[[sequence_batching.state]]
input_name = "IN_STATE"
output_name = "OUT_STATE"
data_type = "TYPE_FP32"
dims = [2]
initial_state = [{ data_type = "TYPE_FP32", dims = [2], zero_data = true, name = "zeros" }]
""")
    rendered = to_triton_json(config)
    batching = rendered["sequence_batching"]
    assert batching["control_input"][1] == {"name": "CORRID", "control": [{
        "kind": "CONTROL_SEQUENCE_CORRID", "int32_false_true": [], "fp32_false_true": [], "bool_false_true": [],
        "data_type": "TYPE_UINT64"}]}
    assert batching["direct"] == {"max_queue_delay_microseconds": 100, "minimum_slot_utilization": 0.0}
    assert batching["state"][0]["initial_state"] == [
        {"data_type": "TYPE_FP32", "dims": [2], "zero_data": True, "name": "zeros"}]
    assert config_from_triton_json(rendered, source="x", folder_name="seq") == config


def test_config_pbtxt_reads_the_same_as_config_toml(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text("""
name: "seq" backend: "python" max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
}
""")
    from_pbtxt = load_pbtxt_config(tmp_path / "config.pbtxt", "seq")
    assert from_pbtxt == load("[sequence_batching]\nmax_sequence_idle_microseconds = 5000000\n" + START)


def test_both_strategies_are_refused() -> None:
    assert "set one of direct and oldest" in error("[sequence_batching]\ndirect = {}\noldest = {}\n")


def test_dynamic_and_sequence_batching_together_are_refused() -> None:
    assert "dynamic_batching or sequence_batching, not both" in error("[dynamic_batching]\n[sequence_batching]\n")


def test_a_boolean_control_needs_exactly_one_false_true_pair_of_two() -> None:
    message = error("[sequence_batching]\n" + START.replace("[0, 1]", "[0, 1, 2]"))
    assert "control_input[0].control[0].int32_false_true" in message
    assert "must have exactly 2 entries for CONTROL_SEQUENCE_START" in message
    message = error("[sequence_batching]\n" + START.replace(", int32_false_true = [0, 1]", ""))
    assert ("sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' "
            "for CONTROL_SEQUENCE_START for seq") in message


def test_corrid_types_are_tritons() -> None:
    message = error('[sequence_batching]\n[[sequence_batching.control_input]]\nname = "C"\n'
                    'control = [{ kind = "CONTROL_SEQUENCE_CORRID", data_type = "TYPE_FP32" }]\n')
    assert ("unexpected data type for control CONTROL_SEQUENCE_CORRID for seq. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING") in message


def test_a_control_input_named_like_a_model_input_is_refused() -> None:
    message = error("[sequence_batching]\n" + START.replace('name = "START"', 'name = "INPUT"'))
    assert 'sequence_batching.control_input[0].name: "INPUT" is already an [[input]]' in message


def test_oldest_preferred_batch_size_above_max_batch_size_is_refused() -> None:
    message = error("[sequence_batching]\noldest = { preferred_batch_size = [8] }\n")
    assert "sequence batching preferred batch size must be <= max batch size for seq" in message


def test_unknown_keys_suggest_the_nearest() -> None:
    assert 'did you mean "max_sequence_idle_microseconds"' in error(
        "[sequence_batching]\nmax_sequence_idle_microsecond = 5\n")
