"""ModelConfig <-> Triton's JSON form: the /config rendering and the JSON override path."""

from __future__ import annotations

import copy
import json
import string
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereid.config import (
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelTransactionPolicy,
    ModelWarmup,
    QueuePolicy,
    VersionPolicy,
    WarmupInput,
    config_from_triton_json,
    parse_model_config,
    to_triton_json,
)
from nereid.datatypes import DataType, by_config_name
from nereid.errors import ConfigError

pytestmark = pytest.mark.unit

SOURCE = "load request for add_one"


def data_type(name: str) -> DataType:
    found = by_config_name(name)
    assert found is not None, name
    return found


FP32 = data_type("FP32")
INT64 = data_type("INT64")


def minimal(**changes: Any) -> ModelConfig:
    fields: dict[str, Any] = {
        "name": "add_one",
        "max_batch_size": 8,
        "input": (ModelInput("INPUT0", FP32, (-1, 4)),),
        "output": (ModelOutput("OUTPUT0", FP32, (-1, 4)),),
        "instance_group": (InstanceGroup("add_one"),),
        "model_transaction_policy": ModelTransactionPolicy(),
    }
    fields.update(changes)
    return ModelConfig(**fields)


def as_json(config: ModelConfig) -> dict[str, Any]:
    """to_triton_json, typed loosely so tests can index into it."""
    return to_triton_json(config)


def from_json(obj: object) -> ModelConfig:
    return config_from_triton_json(obj, source=SOURCE, folder_name="add_one")


def json_error(obj: object) -> str:
    with pytest.raises(ConfigError) as info:
        from_json(obj)
    return str(info.value)


# -- rendering -----------------------------------------------------------------------------


def test_rendering_fills_every_default_in_tritons_order() -> None:
    rendered = as_json(minimal())
    assert json.dumps(rendered) == json.dumps(
        {
            "name": "add_one",
            "platform": "",
            "backend": "python",
            "runtime": "",
            "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": 8,
            "input": [
                {
                    "name": "INPUT0",
                    "data_type": "TYPE_FP32",
                    "format": "FORMAT_NONE",
                    "dims": [-1, 4],
                    "is_shape_tensor": False,
                    "allow_ragged_batch": False,
                    "optional": False,
                    "is_non_linear_format_io": False,
                }
            ],
            "output": [
                {
                    "name": "OUTPUT0",
                    "data_type": "TYPE_FP32",
                    "dims": [-1, 4],
                    "label_filename": "",
                    "is_shape_tensor": False,
                    "is_non_linear_format_io": False,
                }
            ],
            "batch_input": [],
            "batch_output": [],
            "optimization": {
                "priority": "PRIORITY_DEFAULT",
                "input_pinned_memory": {"enable": True},
                "output_pinned_memory": {"enable": True},
                "gather_kernel_buffer_threshold": 0,
                "eager_batching": False,
            },
            "instance_group": [
                {
                    "name": "add_one",
                    "kind": "KIND_AUTO",
                    "count": 1,
                    "gpus": [],
                    "secondary_devices": [],
                    "profile": [],
                    "passive": False,
                    "host_policy": "",
                }
            ],
            "default_model_filename": "model.py",
            "cc_model_filenames": {},
            "metric_tags": {},
            "parameters": {},
            "model_warmup": [],
            "model_transaction_policy": {"decoupled": False},
        }
    )


def test_dynamic_batching_and_sequence_batching_are_absent_unless_configured() -> None:
    rendered = as_json(minimal())
    assert "dynamic_batching" not in rendered
    assert "sequence_batching" not in rendered


def test_dynamic_batching_renders_levels_as_string_keys_and_policy_only_when_set() -> None:
    batching = DynamicBatching(
        preferred_batch_size=(4, 8),
        max_queue_delay_microseconds=100,
        priority_levels=2,
        default_priority_level=1,
        priority_queue_policy={
            2: QueuePolicy(timeout_action="DELAY", default_timeout_microseconds=5),
            1: QueuePolicy(max_queue_size=3),
        },
    )
    rendered = as_json(minimal(dynamic_batching=batching))["dynamic_batching"]
    assert rendered == {
        "preferred_batch_size": [4, 8],
        "max_queue_delay_microseconds": 100,
        "preserve_ordering": False,
        "priority_levels": 2,
        "default_priority_level": 1,
        "priority_queue_policy": {
            "1": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": 0,
                "allow_timeout_override": False,
                "max_queue_size": 3,
            },
            "2": {
                "timeout_action": "DELAY",
                "default_timeout_microseconds": 5,
                "allow_timeout_override": False,
                "max_queue_size": 0,
            },
        },
    }
    assert list(rendered["priority_queue_policy"]) == ["1", "2"]


def test_default_queue_policy_is_rendered_when_set() -> None:
    batching = DynamicBatching(default_queue_policy=QueuePolicy(allow_timeout_override=True))
    rendered = as_json(minimal(dynamic_batching=batching))["dynamic_batching"]
    assert rendered["default_queue_policy"] == {
        "timeout_action": "REJECT",
        "default_timeout_microseconds": 0,
        "allow_timeout_override": True,
        "max_queue_size": 0,
    }


def test_extensions_travel_as_string_parameters_only_when_not_default() -> None:
    config = minimal(
        input=(ModelInput("INPUT0", FP32, (-1, 4), pad_value=0.5), ModelInput("IDS", INT64, (-1,))),
        dynamic_batching=DynamicBatching(max_concurrent_batches=3),
        parameters={"tokenizer": "bert-base"},
    )
    rendered = as_json(config)
    assert rendered["parameters"] == {
        "max_concurrent_batches": {"string_value": "3"},
        "pad_value.INPUT0": {"string_value": "0.5"},
        "tokenizer": {"string_value": "bert-base"},
    }
    assert "max_concurrent_batches" not in rendered["dynamic_batching"]
    assert all("pad_value" not in tensor for tensor in rendered["input"])
    plain = as_json(minimal(dynamic_batching=DynamicBatching()))
    assert plain["parameters"] == {}


def test_isolation_and_execution_timeout_travel_as_string_parameters() -> None:
    config = minimal(
        instance_group=(
            InstanceGroup("add_one_0", count=2, isolation="process"),
            InstanceGroup("threads"),
        ),
        execution_timeout_ms=250,
        parameters={"tokenizer": "bert-base"},
    )
    rendered = as_json(config)
    assert rendered["parameters"] == {
        "execution_timeout_ms": {"string_value": "250"},
        "instance_group.add_one_0.isolation": {"string_value": "process"},
        "tokenizer": {"string_value": "bert-base"},
    }
    # Never invented fields: stock clients parse the JSON as Triton's ModelConfig.
    assert "execution_timeout_ms" not in rendered
    assert all("isolation" not in group for group in rendered["instance_group"])
    # The model's own parameters stay the user's.
    assert config.parameters == {"tokenizer": "bert-base"}
    assert from_json(rendered).parameters == {"tokenizer": "bert-base"}


def test_input_tensors_travel_as_a_parameter_and_come_back() -> None:
    config = minimal(input_tensors="torch")
    rendered = as_json(config)
    assert rendered["parameters"] == {"input_tensors": {"string_value": "torch"}}
    assert from_json(json.loads(json.dumps(rendered))).input_tensors == "torch"


def test_unset_isolation_and_no_execution_timeout_are_not_rendered() -> None:
    config = minimal(instance_group=(InstanceGroup("add_one"),))
    assert as_json(config)["parameters"] == {}


def test_an_explicit_thread_isolation_is_rendered_as_a_gpus_default_is_a_process() -> None:
    config = minimal(instance_group=(InstanceGroup("add_one", kind="KIND_GPU", isolation="thread"),))
    assert as_json(config)["parameters"] == {"instance_group.add_one.isolation": {"string_value": "thread"}}


def test_isolation_is_rendered_under_the_defaulted_group_name() -> None:
    document = {"instance_group": [{"kind": "CPU"}, {"isolation": "process"}]}
    config = parse_model_config(document, source=SOURCE, folder_name="add_one")
    assert as_json(config)["parameters"] == {
        "instance_group.add_one_1.isolation": {"string_value": "process"}
    }
    # Without [[instance_group]], the one default group is named after the model.
    default = parse_model_config({}, source=SOURCE, folder_name="add_one")
    group = replace(default.instance_group[0], isolation="process")
    assert as_json(replace(default, instance_group=(group,)))["parameters"] == {
        "instance_group.add_one.isolation": {"string_value": "process"}
    }


def test_isolation_and_execution_timeout_survive_a_json_round_trip() -> None:
    config = minimal(
        instance_group=(
            InstanceGroup("add_one_0", isolation="process"),
            InstanceGroup("cpu.group", kind="KIND_CPU", isolation="process"),
            InstanceGroup("threads", count=3),
        ),
        execution_timeout_ms=1500,
        parameters={"k": "v"},
    )
    rendered = as_json(config)
    loaded = from_json(json.loads(json.dumps(rendered)))
    assert loaded == config
    assert json.dumps(as_json(loaded)) == json.dumps(rendered)


def test_reshape_is_rendered_only_when_set() -> None:
    config = minimal(
        input=(ModelInput("X", FP32, (1,), reshape=()),),
        output=(ModelOutput("Y", FP32, (2, 2), reshape=(4,)),),
    )
    rendered = as_json(config)
    assert rendered["input"][0]["reshape"] == {"shape": []}
    assert rendered["output"][0]["reshape"] == {"shape": [4]}
    assert "reshape" not in as_json(minimal())["input"][0]


def test_warmup_renders_only_the_data_source_that_is_set() -> None:
    warmup = ModelWarmup(
        "w",
        batch_size=2,
        inputs={
            "B": WarmupInput(FP32, (1, 4), input_data_file="b.bin"),
            "A": WarmupInput(FP32, (2, 4), random_data=True),
        },
        count=3,
    )
    rendered = as_json(minimal(model_warmup=(warmup,)))["model_warmup"]
    assert rendered == [
        {
            "name": "w",
            "batch_size": 2,
            "inputs": {
                "A": {"data_type": "TYPE_FP32", "dims": [2, 4], "random_data": True},
                "B": {"data_type": "TYPE_FP32", "dims": [1, 4], "input_data_file": "b.bin"},
            },
            "count": 3,
        }
    ]


@pytest.mark.parametrize(
    ("policy", "rendered"),
    [
        pytest.param(VersionPolicy(), {"latest": {"num_versions": 1}}, id="latest"),
        pytest.param(VersionPolicy("all"), {"all": {}}, id="all"),
        pytest.param(
            VersionPolicy("specific", versions=(1, 3)),
            {"specific": {"versions": [1, 3]}},
            id="specific",
        ),
    ],
)
def test_version_policy_renders_as_a_oneof(policy: VersionPolicy, rendered: dict[str, Any]) -> None:
    assert as_json(minimal(version_policy=policy))["version_policy"] == rendered


def test_decoupled_models_say_so_in_the_transaction_policy() -> None:
    config = minimal(model_transaction_policy=ModelTransactionPolicy(decoupled=True))
    assert as_json(config)["model_transaction_policy"] == {"decoupled": True}


def test_parameters_render_in_sorted_order_whatever_the_insertion_order() -> None:
    one = as_json(minimal(parameters={"b": "1", "a": "2"}))
    other = as_json(minimal(parameters={"a": "2", "b": "1"}))
    assert json.dumps(one) == json.dumps(other)


# -- the JSON override path ----------------------------------------------------------------

# What Triton 24.x shows for a python model like add_one (GET /v2/models/add_one/config).
TRITON_SHOWN = {
    "name": "add_one",
    "platform": "",
    "backend": "python",
    "runtime": "",
    "version_policy": {"latest": {"num_versions": 1}},
    "max_batch_size": 8,
    "input": [
        {
            "name": "INPUT0",
            "data_type": "TYPE_FP32",
            "format": "FORMAT_NONE",
            "dims": ["-1", "4"],
            "is_shape_tensor": False,
            "allow_ragged_batch": False,
            "optional": False,
            "is_non_linear_format_io": False,
        }
    ],
    "output": [
        {
            "name": "OUTPUT0",
            "data_type": "TYPE_FP32",
            "dims": [-1, 4],
            "label_filename": "",
            "is_shape_tensor": False,
            "is_non_linear_format_io": False,
        }
    ],
    "batch_input": [],
    "batch_output": [],
    "optimization": {
        "priority": "PRIORITY_DEFAULT",
        "input_pinned_memory": {"enable": True},
        "output_pinned_memory": {"enable": True},
        "gather_kernel_buffer_threshold": 0,
        "eager_batching": False,
    },
    "dynamic_batching": {
        "preferred_batch_size": [8],
        "max_queue_delay_microseconds": "100",
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "priority_queue_policy": {},
    },
    "instance_group": [
        {
            "name": "add_one_0",
            "kind": "KIND_CPU",
            "count": 1,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ],
    "default_model_filename": "model.py",
    "cc_model_filenames": {},
    "metric_tags": {},
    "parameters": {"EXECUTION_ENV_PATH": {"string_value": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}},
    "model_warmup": [],
    "model_transaction_policy": {"decoupled": False},
    "response_cache": {"enable": False},
}


def test_tritons_own_json_for_a_python_model_is_accepted() -> None:
    assert from_json(TRITON_SHOWN) == minimal(
        dynamic_batching=DynamicBatching(
            preferred_batch_size=(8,), max_queue_delay_microseconds=100
        ),
        instance_group=(InstanceGroup("add_one_0", kind="KIND_CPU"),),
        parameters={"EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"},
    )


def test_json_override_leaves_its_argument_untouched() -> None:
    obj = copy.deepcopy(TRITON_SHOWN)
    from_json(obj)
    assert obj == TRITON_SHOWN


def test_json_override_takes_lowercase_enums_and_string_integers() -> None:
    config = from_json(
        {
            "max_batch_size": "4",
            "input": [{"name": "X", "data_type": "type_int64", "dims": ["-1"]}],
            "instance_group": [{"kind": "kind_gpu", "gpus": ["0"], "count": "2"}],
        }
    )
    assert config.max_batch_size == 4
    assert config.input == (ModelInput("X", INT64, (-1,)),)
    assert config.instance_group == (
        InstanceGroup("add_one_0", count=2, kind="KIND_GPU", gpus=(0,)),
    )


def test_json_nulls_mean_unset_as_in_protobuf() -> None:
    config = from_json({"max_batch_size": 2, "dynamic_batching": None, "optimization": None})
    assert config.dynamic_batching is None


def test_json_override_reads_extensions_back_into_their_fields() -> None:
    config = from_json(
        {
            "max_batch_size": 4,
            "input": [{"name": "IDS", "data_type": "TYPE_INT64", "dims": [-1]}],
            "dynamic_batching": {},
            "parameters": {
                "pad_value.IDS": {"string_value": "-1"},
                "max_concurrent_batches": {"string_value": "2"},
            },
        }
    )
    assert config.input[0].pad_value == -1
    assert config.dynamic_batching == DynamicBatching(max_concurrent_batches=2)
    assert config.parameters == {}


def test_json_override_reads_isolation_and_timeout_back_from_parameters() -> None:
    config = from_json(
        {
            "instance_group": [{"name": "g", "count": 2}, {"kind": "KIND_CPU"}],
            "parameters": {
                "instance_group.g.isolation": {"string_value": "process"},
                "instance_group.add_one_1.isolation": {"string_value": "PROCESS"},
                "execution_timeout_ms": {"string_value": "250"},
                "tokenizer": {"string_value": "bert-base"},
            },
        }
    )
    assert config.instance_group == (
        InstanceGroup("g", count=2, isolation="process"),
        InstanceGroup("add_one_1", kind="KIND_CPU", isolation="process"),
    )
    assert config.execution_timeout_ms == 250
    assert config.parameters == {"tokenizer": "bert-base"}


def test_json_override_takes_isolation_and_timeout_under_nereids_own_names() -> None:
    config = from_json(
        {
            "execution_timeout_ms": 100,
            "instance_group": [{"isolation": "Process"}, {"name": "t", "isolation": "thread"}],
        }
    )
    assert config.execution_timeout_ms == 100
    assert config.instance_group == (
        InstanceGroup("add_one_0", isolation="process"),
        InstanceGroup("t", isolation="thread"),
    )
    # protobuf's JSON form writes 64-bit integers as strings; accepted as for other keys.
    assert from_json({"execution_timeout_ms": "100"}).execution_timeout_ms == 100


def test_json_isolation_parameter_for_the_default_group_applies_to_it() -> None:
    parameters = {"instance_group.add_one.isolation": {"string_value": "process"}}
    config = from_json({"parameters": parameters})
    assert config.instance_group == (InstanceGroup("add_one", isolation="process"),)
    assert config.parameters == {}


def test_json_extension_given_both_ways_is_accepted_when_they_agree() -> None:
    config = from_json(
        {
            "execution_timeout_ms": "250",
            "instance_group": [{"name": "g", "isolation": "process"}],
            "parameters": {
                "execution_timeout_ms": {"string_value": "250"},
                "instance_group.g.isolation": {"string_value": "PROCESS"},
            },
        }
    )
    assert config.execution_timeout_ms == 250
    assert config.instance_group == (InstanceGroup("g", isolation="process"),)
    assert config.parameters == {}


JSON_REJECTED = [
    pytest.param(
        [1],
        "expected a JSON object, got [1]",
        id="not-an-object",
    ),
    pytest.param(
        {"optimization": {"priority": "PRIORITY_MAX"}},
        "optimization: expected its default value (nereid does not use this Triton field), "
        'got {"priority": "PRIORITY_MAX"}',
        id="non-default-unused-field",
    ),
    pytest.param(
        {"batch_input": [{"kind": "BATCH_ELEMENT_COUNT"}]},
        "batch_input: expected its default value (nereid does not use this Triton field), "
        'got [{"kind": "BATCH_ELEMENT_COUNT"}]',
        id="batch-input",
    ),
    pytest.param(
        {"instance_group": [{"passive": True}]},
        "instance_group[0].passive: expected its default value (nereid does not use this Triton field), got true",
        id="passive-instance-group",
    ),
    pytest.param(
        {
            "input": [
                {"name": "X", "data_type": "FP32", "dims": [1], "is_non_linear_format_io": True}
            ]
        },
        "input[0].is_non_linear_format_io: expected its default value "
        "(nereid does not use this Triton field), got true",
        id="non-linear-format-io",
    ),
    pytest.param(
        {"sequence_batching": {"iterative_sequence": True}},
        "sequence_batching.iterative_sequence: not supported by nereid (set false or leave it out)",
        id="iterative-sequence",
    ),
    pytest.param(
        {"dynamic_batching": {}, "parameters": {"max_concurrent_batches": {"string_value": "two"}}},
        'parameters.max_concurrent_batches: expected an integer in a string_value, got {"string_value": "two"}',
        id="extension-not-a-number",
    ),
    pytest.param(
        {
            "max_batch_size": 2,
            "input": [{"name": "X", "data_type": "FP32", "dims": [-1]}],
            "parameters": {"pad_value.X": {"string_value": "zero"}},
        },
        'parameters."pad_value.X": expected a number in a string_value, got {"string_value": "zero"}',
        id="pad-value-not-a-number",
    ),
    pytest.param(
        {"parameters": {"pad_value.NOPE": {"string_value": "0"}}},
        'parameters."pad_value.NOPE": this name is reserved for nereid\'s extension; '
        "set pad_value in the input's [[input]] table",
        id="pad-value-for-missing-input",
    ),
    pytest.param(
        {"parameters": {"max_concurrent_batches": {"string_value": "2"}}},
        "parameters.max_concurrent_batches: this name is reserved for nereid's extension; "
        "set dynamic_batching.max_concurrent_batches",
        id="concurrency-without-dynamic-batching",
    ),
    pytest.param(
        {"instance_group": [{"isolation": "fork"}]},
        'instance_group[0].isolation: expected "thread" or "process", got "fork"',
        id="unknown-isolation",
    ),
    pytest.param(
        {"instance_group": [{"isolaton": "process"}]},
        'instance_group[0]: unknown key "isolaton" (did you mean "isolation"?)',
        id="isolation-misspelt",
    ),
    pytest.param(
        {
            "instance_group": [{"name": "g"}],
            "parameters": {"instance_group.g.isolation": {"string_value": "fork"}},
        },
        'instance_group[0].isolation: expected "thread" or "process", got "fork"',
        id="unknown-isolation-in-parameters",
    ),
    pytest.param(
        {
            "instance_group": [{"name": "g"}],
            "parameters": {"instance_group.g.isolation": {"int64_value": 1}},
        },
        'parameters."instance_group.g.isolation": expected a string in a string_value, '
        'got {"int64_value": 1}',
        id="isolation-parameter-not-a-string",
    ),
    pytest.param(
        {
            "instance_group": [{"name": "g"}],
            "parameters": {"instance_group.nope.isolation": {"string_value": "process"}},
        },
        'parameters."instance_group.nope.isolation": this name is reserved for nereid\'s '
        "extension; set isolation in the group's [[instance_group]] table",
        id="isolation-parameter-for-missing-group",
    ),
    pytest.param(
        {
            "instance_group": [{"name": "g", "isolation": "thread"}],
            "parameters": {"instance_group.g.isolation": {"string_value": "process"}},
        },
        'parameters."instance_group.g.isolation": conflicts with instance_group[0].isolation '
        '= "thread"; set it in one place',
        id="isolation-given-both-ways-differently",
    ),
    pytest.param(
        {"execution_timeout_ms": -5},
        "execution_timeout_ms: expected an integer >= 0, got -5",
        id="negative-execution-timeout",
    ),
    pytest.param(
        {"parameters": {"execution_timeout_ms": {"string_value": "-5"}}},
        "execution_timeout_ms: expected an integer >= 0, got -5",
        id="negative-execution-timeout-in-parameters",
    ),
    pytest.param(
        {"parameters": {"execution_timeout_ms": {"string_value": "soon"}}},
        "parameters.execution_timeout_ms: expected an integer in a string_value, "
        'got {"string_value": "soon"}',
        id="execution-timeout-parameter-not-a-number",
    ),
    pytest.param(
        {
            "execution_timeout_ms": 100,
            "parameters": {"execution_timeout_ms": {"string_value": "250"}},
        },
        "parameters.execution_timeout_ms: conflicts with execution_timeout_ms = 100; "
        "set it in one place",
        id="execution-timeout-given-both-ways-differently",
    ),
    pytest.param(
        {"input": [{"name": "X", "data_type": "FP32", "dims": "16"}]},
        'input[0].dims: expected a list of integers, got "16"',
        id="same-messages-as-toml",
    ),
    pytest.param(
        {"max_batch_sise": 4},
        'unknown key "max_batch_sise" (did you mean "max_batch_size"?)',
        id="unknown-key",
    ),
    pytest.param(
        {"name": "other"},
        'name: expected "add_one" (the folder name), got "other"',
        id="name-differs-from-folder",
    ),
    pytest.param(
        {"parameters": {"k": {"string_value": 3}}},
        'parameters.k: expected a string, number or boolean, got {"string_value": 3}',
        id="string-value-not-a-string",
    ),
]


@pytest.mark.parametrize(("obj", "message"), JSON_REJECTED)
def test_invalid_json_override_is_rejected_with_key_expected_and_got(
    obj: object, message: str
) -> None:
    assert json_error(obj) == f"{SOURCE}: {message}"


# -- round trip ----------------------------------------------------------------------------

NAME_CHARS = string.ascii_letters + string.digits + "_"
DATA_TYPE_SPELLINGS = {
    "TYPE_FP32": ("TYPE_FP32", "FP32", "fp32"),
    "TYPE_INT64": ("TYPE_INT64", "INT64"),
    "TYPE_UINT8": ("UINT8",),
    "TYPE_BOOL": ("BOOL",),
    "TYPE_STRING": ("STRING", "BYTES", "TYPE_STRING"),
    "TYPE_FP16": ("FP16",),
}


@st.composite
def pad_values(draw: st.DrawFn, data_type: str) -> int | float:
    if data_type == "TYPE_UINT8":
        return draw(st.integers(0, 255))
    if data_type == "TYPE_BOOL":
        return draw(st.integers(0, 1))
    if data_type == "TYPE_INT64":
        return draw(st.integers(-(2**63), 2**63 - 1))
    return draw(st.integers(-5, 5) | st.floats(allow_nan=False))


@st.composite
def tensors(draw: st.DrawFn, name: str, max_batch_size: int, *, is_input: bool) -> dict[str, Any]:
    data_type = draw(st.sampled_from(sorted(DATA_TYPE_SPELLINGS)))
    dims = draw(st.lists(st.sampled_from([-1, 1, 2, 3, 16]), min_size=1, max_size=3))
    table: dict[str, Any] = {
        "name": name,
        "data_type": draw(st.sampled_from(DATA_TYPE_SPELLINGS[data_type])),
        "dims": dims,
    }
    if draw(st.booleans()):
        table["reshape"] = {"shape": [] if dims == [1] and max_batch_size > 0 else list(dims)}
    if is_input:
        if len(dims) == 3 and draw(st.booleans()):
            table["format"] = draw(st.sampled_from(["NHWC", "FORMAT_NCHW", "FORMAT_NONE"]))
        for flag in ("optional", "allow_ragged_batch"):
            if draw(st.booleans()):
                table[flag] = draw(st.booleans())
        if max_batch_size > 0 and -1 in dims and draw(st.booleans()):
            table["pad_value"] = draw(pad_values(data_type))
    elif draw(st.booleans()):
        table["label_filename"] = draw(st.text(max_size=5))
    return table


@st.composite
def queue_policies(draw: st.DrawFn, *, delay: bool) -> dict[str, Any]:
    policy: dict[str, Any] = {}
    if draw(st.booleans()):
        policy["timeout_action"] = draw(
            st.sampled_from(["REJECT", "delay"] if delay else ["REJECT"])
        )
    if draw(st.booleans()):
        policy["default_timeout_microseconds"] = draw(st.integers(0, 10**6))
    if draw(st.booleans()):
        policy["allow_timeout_override"] = draw(st.booleans())
    if draw(st.booleans()):
        policy["max_queue_size"] = draw(st.integers(0, 100))
    return policy


@st.composite
def dynamic_batchings(draw: st.DrawFn, max_batch_size: int) -> dict[str, Any]:
    preserve = draw(st.booleans())
    levels = draw(st.integers(0, 1 if preserve else 3))
    table: dict[str, Any] = {"preserve_ordering": preserve, "priority_levels": levels}
    if max_batch_size > 0:
        table["preferred_batch_size"] = draw(
            st.lists(st.integers(1, max_batch_size), max_size=3, unique=True)
        )
    table["max_queue_delay_microseconds"] = draw(st.integers(0, 10**6))
    if levels > 0:
        table["default_priority_level"] = draw(st.integers(1, levels))
        chosen = draw(st.lists(st.integers(1, levels), max_size=levels, unique=True))
        table["priority_queue_policy"] = {
            str(level): draw(queue_policies(delay=not preserve)) for level in chosen
        }
    if draw(st.booleans()):
        table["default_queue_policy"] = draw(queue_policies(delay=not preserve))
    if draw(st.booleans()):
        table["max_concurrent_batches"] = draw(st.integers(1, 8))
    return table


@st.composite
def warmups(draw: st.DrawFn, inputs: list[dict[str, Any]], max_batch_size: int) -> dict[str, Any]:
    samples: dict[str, Any] = {}
    for spec in inputs:
        if spec.get("optional") and draw(st.booleans()):
            continue
        source: dict[str, Any] = draw(
            st.sampled_from(
                [{"zero_data": True}, {"random_data": True}, {"input_data_file": "data.bin"}]
            )
        )
        dims = [draw(st.integers(1, 4)) if d == -1 else d for d in spec["dims"]]
        samples[spec["name"]] = {"data_type": spec["data_type"], "dims": dims, **source}
    return {
        "name": draw(st.text(NAME_CHARS, max_size=6)),
        "batch_size": draw(st.integers(1, max_batch_size)) if max_batch_size else 1,
        "inputs": samples,
        "count": draw(st.integers(1, 3)),
    }


RESERVED = ("max_concurrent_batches", "execution_timeout_ms")


@st.composite
def toml_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid config.toml document (as parsed), leaving out defaults at random."""
    max_batch_size = draw(st.sampled_from([0, 1, 8, 64]))
    config: dict[str, Any] = {"max_batch_size": max_batch_size}
    if draw(st.booleans()):
        config["name"] = "add_one"
    inputs = [
        draw(tensors(f"IN{i}", max_batch_size, is_input=True))
        for i in range(draw(st.integers(0, 3)))
    ]
    config["input"] = inputs
    config["output"] = [
        draw(tensors(f"OUT{i}", max_batch_size, is_input=False))
        for i in range(draw(st.integers(0, 2)))
    ]
    config["version_policy"] = draw(
        st.sampled_from([{"latest": {"num_versions": 2}}, {"all": {}}, {"latest": {}}])
        | st.lists(st.integers(1, 9), min_size=1, max_size=3).map(
            lambda versions: {"specific": {"versions": versions}}
        )
    )
    if draw(st.booleans()):
        config["dynamic_batching"] = draw(dynamic_batchings(max_batch_size))
    if draw(st.booleans()):
        groups = []
        for _ in range(draw(st.integers(1, 2))):
            kind = draw(st.sampled_from(["CPU", "KIND_GPU", "auto"]))
            group: dict[str, Any] = {"kind": kind, "count": draw(st.integers(1, 4))}
            if kind != "CPU":
                group["gpus"] = draw(st.lists(st.integers(0, 3), max_size=2))
            if draw(st.booleans()):
                group["name"] = draw(st.text(NAME_CHARS + ".", min_size=1, max_size=6))
            if draw(st.booleans()):
                group["isolation"] = draw(st.sampled_from(["thread", "process", "PROCESS"]))
            groups.append(group)
        # Groups sharing a name must share the isolation (the JSON form keys it by name).
        isolation_of: dict[str, str] = {}
        for index, group in enumerate(groups):
            name = group.get("name", f"add_one_{index}")
            isolation = str(group.get("isolation", "")).lower()
            if isolation_of.setdefault(name, isolation) != isolation:
                if isolation_of[name]:
                    group["isolation"] = isolation_of[name]
                else:  # the first group left it unset: so do the others
                    del group["isolation"]
        config["instance_group"] = groups
    config["parameters"] = draw(
        st.dictionaries(
            st.text(NAME_CHARS + ".-", min_size=1, max_size=8).filter(
                lambda key: key not in RESERVED
                and not key.startswith("pad_value.")
                and not (key.startswith("instance_group.") and key.endswith(".isolation"))
            ),
            st.text(max_size=8) | st.integers() | st.booleans() | st.floats(allow_nan=False),
            max_size=3,
        )
    )
    if draw(st.booleans()):
        config["model_transaction_policy"] = {"decoupled": draw(st.booleans())}
    if draw(st.booleans()):
        config["execution_timeout_ms"] = draw(st.integers(0, 10**7))
    config["model_warmup"] = [
        draw(warmups(inputs, max_batch_size)) for _ in range(draw(st.integers(0, 2)))
    ]
    return config


@settings(max_examples=200, deadline=None)
@given(toml_configs())
def test_load_render_parse_back_gives_the_same_config(document: dict[str, Any]) -> None:
    config = parse_model_config(document, source=SOURCE, folder_name="add_one")
    rendered = as_json(config)
    # Through JSON text, as a client would send it back.
    assert from_json(json.loads(json.dumps(rendered))) == config


@settings(max_examples=100, deadline=None)
@given(toml_configs())
def test_rendering_is_deterministic(document: dict[str, Any]) -> None:
    first = parse_model_config(document, source=SOURCE, folder_name="add_one")
    second = parse_model_config(copy.deepcopy(document), source=SOURCE, folder_name="add_one")
    assert json.dumps(as_json(first)) == json.dumps(as_json(second))
    assert json.dumps(as_json(first)) == json.dumps(as_json(from_json(as_json(first))))


def test_processes_travel_as_a_group_parameter_and_come_back() -> None:
    config = minimal(instance_group=(InstanceGroup("add_one", isolation="process", processes="per_instance"),))
    rendered = as_json(config)
    assert rendered["parameters"] == {
        "instance_group.add_one.isolation": {"string_value": "process"},
        "instance_group.add_one.processes": {"string_value": "per_instance"},
    }
    assert all("processes" not in group for group in rendered["instance_group"])
    assert from_json(json.loads(json.dumps(rendered))).instance_group[0].processes == "per_instance"
