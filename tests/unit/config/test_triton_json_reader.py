"""Triton JSON -> config.toml's shape (nereid.config.triton_json_reader), through the JSON
override path: Triton's own JSON accepted, unused fields only at their defaults, nereid's
extensions read back from ``parameters``, and what is refused, with key, expected and got."""

from __future__ import annotations

import copy

import pytest

from nereid.config import DynamicBatching, InstanceGroup, ModelInput

from tests.unit.config.json_samples import INT64, SOURCE, from_json, json_error, minimal

pytestmark = pytest.mark.unit

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
