"""ModelConfig -> Triton's JSON form (nereid.config.triton_json): the /config rendering,
and the round trip back through the JSON override path."""

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
    parse_model_config,
    to_triton_json,
)

from tests.unit.config.json_samples import FP32, INT64, SOURCE, data_type, from_json, minimal

pytestmark = pytest.mark.unit


def as_json(config: ModelConfig) -> dict[str, Any]:
    """to_triton_json, typed loosely so tests can index into it."""
    return to_triton_json(config)


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
