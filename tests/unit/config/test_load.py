"""config.toml -> ModelConfig: defaults, enum spellings, and every validation message."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

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
    load_model_config,
    parse_model_config,
)
from nereid.datatypes import DATATYPES, DataType, by_config_name
from nereid.errors import ConfigError

pytestmark = pytest.mark.unit

SOURCE = "model_repository/add_one/config.toml"


def data_type(name: str) -> DataType:
    found = by_config_name(name)
    assert found is not None, name
    return found


FP32 = data_type("FP32")
INT32 = data_type("INT32")
STRING = data_type("STRING")

# A batching model with one variable-size input and output; cases append to it.
BASE = """\
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "FP32"
dims = [-1, 4]
[[output]]
name = "OUTPUT0"
data_type = "FP32"
dims = [-1, 4]
"""

# The example of docs/model-repository.md, verbatim.
CONTRACT_EXAMPLE = """\
name = "add_one"              # optional; if given it must equal the folder name
backend = "python"            # optional; "python" is the only backend
max_batch_size = 64           # 0: the model does not batch; dims are then full shapes
default_model_filename = "model.py"

[version_policy]              # one of the three; default latest = { num_versions = 1 }
latest = { num_versions = 1 }
# all = {}
# specific = { versions = [1, 3] }

[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"       # BOOL UINT8 UINT16 UINT32 UINT64 INT8 INT16 INT32 INT64
                              # FP16 BF16 FP32 FP64 STRING (wire name BYTES)
dims = [16]                   # shape without the batch dimension; -1 = any size
optional = false
allow_ragged_batch = false

[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [16]

[dynamic_batching]            # its presence turns the dynamic batcher on
preferred_batch_size = [16, 32]
max_queue_delay_microseconds = 100
preserve_ordering = false
priority_levels = 0           # 0: no priorities; else requests name 1..priority_levels
default_priority_level = 0

[dynamic_batching.default_queue_policy]
timeout_action = "REJECT"     # or "DELAY"
default_timeout_microseconds = 0    # 0: no timeout
allow_timeout_override = false      # request parameter "timeout" (microseconds)
max_queue_size = 0                  # 0: unbounded; beyond it requests are rejected

[dynamic_batching.priority_queue_policy.1]   # optional, same keys, per priority level
max_queue_size = 100

[[instance_group]]
count = 2
kind = "KIND_AUTO"            # AUTO: GPU when one is visible, else CPU; or KIND_GPU / KIND_CPU
gpus = [0]                    # KIND_GPU: `count` instances on EACH listed GPU

[parameters]                  # free-form; every value reaches the model as a string
tokenizer = "bert-base"

[model_transaction_policy]
decoupled = false             # true: the model may stream several responses per request

[[model_warmup]]              # run before the model is marked READY
name = "warmup"
batch_size = 8
inputs.INPUT0 = { data_type = "TYPE_FP32", dims = [16], zero_data = true }
"""


@pytest.fixture
def repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model_repository/add_one folder; the working directory is its parent, so
    errors name the file as ``model_repository/add_one/config.toml``."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "model_repository" / "add_one"
    folder.mkdir(parents=True)
    return folder


def load(repository: Path, text: str) -> ModelConfig:
    (repository / "config.toml").write_text(textwrap.dedent(text))
    return load_model_config(Path(SOURCE), "add_one")


def error(repository: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(repository, text)
    return str(info.value)


# -- accepted configs ---------------------------------------------------------------------


def test_contract_example_loads_into_the_documented_records(repository: Path) -> None:
    config = load(repository, CONTRACT_EXAMPLE)
    assert config == ModelConfig(
        name="add_one",
        max_batch_size=64,
        version_policy=VersionPolicy("latest", num_versions=1),
        input=(ModelInput("INPUT0", FP32, (16,)),),
        output=(ModelOutput("OUTPUT0", FP32, (16,)),),
        dynamic_batching=DynamicBatching(
            preferred_batch_size=(16, 32),
            max_queue_delay_microseconds=100,
            default_queue_policy=QueuePolicy(),
            priority_queue_policy={1: QueuePolicy(max_queue_size=100)},
        ),
        instance_group=(InstanceGroup("add_one_0", count=2, kind="KIND_AUTO", gpus=(0,)),),
        parameters={"tokenizer": "bert-base"},
        model_transaction_policy=ModelTransactionPolicy(decoupled=False),
        model_warmup=(
            ModelWarmup(
                "warmup", batch_size=8, inputs={"INPUT0": WarmupInput(FP32, (16,), zero_data=True)}
            ),
        ),
    )


def test_minimal_config_takes_tritons_defaults(repository: Path) -> None:
    config = load(repository, "")
    assert config == ModelConfig(
        name="add_one",
        platform="",
        backend="python",
        runtime="",
        version_policy=VersionPolicy("latest", num_versions=1),
        max_batch_size=0,
        input=(),
        output=(),
        dynamic_batching=None,
        instance_group=(InstanceGroup("add_one", count=1, kind="KIND_AUTO"),),
        default_model_filename="model.py",
        parameters={},
        model_transaction_policy=ModelTransactionPolicy(decoupled=False),
        model_warmup=(),
        execution_timeout_ms=0,
    )
    assert config.instance_group[0].isolation == ""  # not set: by the device, at load


def test_missing_name_defaults_to_the_folder_name(repository: Path) -> None:
    assert load(repository, BASE).name == "add_one"


def test_unnamed_instance_groups_are_named_model_and_index_as_in_triton(
    repository: Path,
) -> None:
    config = load(
        repository,
        """
        [[instance_group]]
        kind = "CPU"
        [[instance_group]]
        name = "gpu_group"
        kind = "GPU"
        gpus = [0, 1]
        [[instance_group]]
        count = 3
        """,
    )
    assert config.instance_group == (
        InstanceGroup("add_one_0", count=1, kind="KIND_CPU"),
        InstanceGroup("gpu_group", count=1, kind="KIND_GPU", gpus=(0, 1)),
        InstanceGroup("add_one_2", count=3, kind="KIND_AUTO"),
    )


@pytest.mark.parametrize(
    "written",
    [
        pytest.param(name, id=name)
        for dt in DATATYPES
        for name in (dt.config_name, dt.config_name.removeprefix("TYPE_"))
    ]
    + [pytest.param("fp32", id="lowercase"), pytest.param("BYTES", id="wire-name-BYTES")],
)
def test_data_type_is_accepted_with_or_without_prefix(repository: Path, written: str) -> None:
    config = load(
        repository,
        BASE.replace(
            'data_type = "FP32"\ndims = [-1, 4]\n[[output]]',
            f'data_type = "{written}"\ndims = [-1, 4]\n[[output]]',
        ),
    )
    expected = (
        "TYPE_STRING" if written == "BYTES" else "TYPE_" + written.upper().removeprefix("TYPE_")
    )
    assert config.input[0].data_type.config_name == expected


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        pytest.param("KIND_GPU", "KIND_GPU", id="prefixed"),
        pytest.param("GPU", "KIND_GPU", id="bare"),
        pytest.param("cpu", "KIND_CPU", id="lowercase"),
        pytest.param("AUTO", "KIND_AUTO", id="auto"),
    ],
)
def test_instance_kind_is_stored_with_its_prefix(
    repository: Path, written: str, stored: str
) -> None:
    config = load(repository, f'[[instance_group]]\nkind = "{written}"\n')
    assert config.instance_group[0].kind == stored


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        pytest.param("REJECT", "REJECT", id="reject"),
        pytest.param("DELAY", "DELAY", id="delay"),
        pytest.param("delay", "DELAY", id="lowercase"),
    ],
)
def test_timeout_action_is_case_insensitive(repository: Path, written: str, stored: str) -> None:
    text = BASE + f'[dynamic_batching.default_queue_policy]\ntimeout_action = "{written}"\n'
    policy = load(repository, text).dynamic_batching
    assert policy is not None and policy.default_queue_policy == QueuePolicy(timeout_action=stored)


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        pytest.param("FORMAT_NCHW", "FORMAT_NCHW", id="prefixed"),
        pytest.param("NHWC", "FORMAT_NHWC", id="bare"),
        pytest.param("none", "FORMAT_NONE", id="lowercase-none"),
    ],
)
def test_input_format_is_stored_with_its_prefix(
    repository: Path, written: str, stored: str
) -> None:
    text = f"""
    [[input]]
    name = "IMAGE"
    data_type = "UINT8"
    dims = [3, 224, 224]
    format = "{written}"
    """
    assert load(repository, text).input[0].format == stored


def test_parameters_reach_the_model_as_strings(repository: Path) -> None:
    text = """
    [parameters]
    tokenizer = "bert-base"
    max_length = 128
    temperature = 0.5
    lowercase = true
    strict = false
    json_form = { string_value = "as Triton writes it" }
    """
    assert load(repository, text).parameters == {
        "tokenizer": "bert-base",
        "max_length": "128",
        "temperature": "0.5",
        "lowercase": "true",
        "strict": "false",
        "json_form": "as Triton writes it",
    }


def test_version_policies_of_each_form(repository: Path) -> None:
    assert load(repository, "version_policy = { all = {} }").version_policy == VersionPolicy("all")
    specific = load(repository, "version_policy.specific.versions = [1, 3]").version_policy
    assert specific == VersionPolicy("specific", versions=(1, 3))
    latest = load(repository, "version_policy.latest = {}").version_policy
    assert latest == VersionPolicy("latest", num_versions=1)


def test_extensions_are_read_into_their_fields(repository: Path) -> None:
    text = BASE.replace("dims = [-1, 4]\n[[output]]", "dims = [-1, 4]\npad_value = -1\n[[output]]")
    config = load(repository, text + "[dynamic_batching]\nmax_concurrent_batches = 4\n")
    assert config.input[0].pad_value == -1
    assert config.dynamic_batching == DynamicBatching(max_concurrent_batches=4)


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        pytest.param("thread", "thread", id="thread"),
        pytest.param("process", "process", id="process"),
        pytest.param("PROCESS", "process", id="uppercase"),
        pytest.param("Thread", "thread", id="mixed-case"),
    ],
)
def test_instance_isolation_is_case_insensitive_and_stored_lowercase(
    repository: Path, written: str, stored: str
) -> None:
    config = load(repository, f'[[instance_group]]\nisolation = "{written}"\n')
    assert config.instance_group == (InstanceGroup("add_one_0", isolation=stored),)


def test_isolation_is_per_group_and_not_set_by_default(repository: Path) -> None:
    text = """
    [[instance_group]]
    kind = "CPU"
    count = 2
    isolation = "process"
    [[instance_group]]
    name = "threads"
    """
    assert load(repository, text).instance_group == (
        InstanceGroup("add_one_0", count=2, kind="KIND_CPU", isolation="process"),
        InstanceGroup("threads"),  # not set: a thread on the CPU, a process on a GPU (devices.isolation_of)
    )


@pytest.mark.parametrize(("text", "expected"), [("", "numpy"), ('input_tensors = "TORCH"', "torch")])
def test_input_tensors_defaults_to_numpy_and_takes_torch(repository: Path, text: str, expected: str) -> None:
    assert load(repository, text).input_tensors == expected


@pytest.mark.parametrize("timeout", [0, 1, 250, 3_600_000])
def test_execution_timeout_ms_is_read_at_the_top_level(repository: Path, timeout: int) -> None:
    assert load(repository, f"execution_timeout_ms = {timeout}\n").execution_timeout_ms == timeout


def test_extensions_stay_out_of_the_models_parameters(repository: Path) -> None:
    text = """
    execution_timeout_ms = 250
    [[instance_group]]
    isolation = "process"
    [parameters]
    tokenizer = "bert-base"
    """
    assert load(repository, text).parameters == {"tokenizer": "bert-base"}


def test_pad_value_on_a_string_input_is_accepted(repository: Path) -> None:
    text = """
    max_batch_size = 4
    [[input]]
    name = "TEXT"
    data_type = "STRING"
    dims = [-1]
    pad_value = 0
    """
    assert load(repository, text).input[0] == ModelInput("TEXT", STRING, (-1,), pad_value=0)


def test_dynamic_batching_without_batching_is_accepted_as_in_triton(repository: Path) -> None:
    # Triton runs the dynamic batcher one request at a time then, for its queue policies.
    config = load(repository, "[dynamic_batching]\nmax_queue_delay_microseconds = 10\n")
    assert config.dynamic_batching == DynamicBatching(max_queue_delay_microseconds=10)


def test_priority_settings_are_unchecked_without_priority_levels_as_in_triton(
    repository: Path,
) -> None:
    text = BASE + "[dynamic_batching]\ndefault_priority_level = 7\n"
    text += "[dynamic_batching.priority_queue_policy.9]\nmax_queue_size = 1\n"
    batching = load(repository, text).dynamic_batching
    assert batching is not None and batching.priority_queue_policy == {
        9: QueuePolicy(max_queue_size=1)
    }


def test_gpus_with_kind_auto_are_accepted_as_in_triton(repository: Path) -> None:
    config = load(repository, '[[instance_group]]\nkind = "KIND_AUTO"\ngpus = [1]\n')
    assert config.instance_group[0].gpus == (1,)


def test_batched_scalar_input_uses_dims_one_with_empty_reshape(repository: Path) -> None:
    text = """
    max_batch_size = 8
    [[input]]
    name = "X"
    data_type = "INT32"
    dims = [1]
    reshape = { shape = [] }
    """
    assert load(repository, text).input[0] == ModelInput("X", INT32, (1,), reshape=())


def test_reshape_may_regroup_fixed_sizes_between_variable_dims(repository: Path) -> None:
    text = """
    [[input]]
    name = "X"
    data_type = "FP32"
    dims = [2, 4, -1, 6]
    reshape = { shape = [8, -1, 1, 6] }
    """
    assert load(repository, text).input[0].reshape == (8, -1, 1, 6)


def test_warmup_count_zero_means_once_as_in_triton(repository: Path) -> None:
    text = (
        BASE
        + '[[model_warmup]]\ncount = 0\ninputs.INPUT0 = { data_type = "FP32", dims = [3, 4], random_data = true }\n'
    )
    assert load(repository, text).model_warmup == (
        ModelWarmup("", inputs={"INPUT0": WarmupInput(FP32, (3, 4), random_data=True)}, count=1),
    )


def test_warmup_may_leave_out_optional_inputs(repository: Path) -> None:
    text = BASE.replace(
        "[[output]]",
        '[[input]]\nname = "MASK"\ndata_type = "BOOL"\ndims = [1]\noptional = true\n[[output]]',
    )
    text += '[[model_warmup]]\ninputs.INPUT0 = { data_type = "FP32", dims = [1, 4], input_data_file = "in0.bin" }\n'
    warmup = load(repository, text).model_warmup[0]
    assert warmup.inputs == {"INPUT0": WarmupInput(FP32, (1, 4), input_data_file="in0.bin")}


def test_parse_model_config_validates_an_already_parsed_document() -> None:
    config = parse_model_config(
        {"max_batch_size": 2, "instance_group": [{"kind": "CPU"}]},
        source="inline",
        folder_name="m",
    )
    assert config.instance_group == (InstanceGroup("m_0", kind="KIND_CPU"),)


# -- file errors ---------------------------------------------------------------------------


def test_toml_syntax_error_names_the_file_line_and_column(repository: Path) -> None:
    message = error(repository, 'max_batch_size = 8\nname "add_one"\n')
    assert message == (
        f"{SOURCE}: invalid TOML: Expected '=' after a key in a key/value pair (at line 2, column 6)"
    )


def test_config_that_is_not_utf8_names_the_file(repository: Path) -> None:
    (repository / "config.toml").write_bytes(b'name = "\xff"\n')
    with pytest.raises(ConfigError) as info:
        load_model_config(Path(SOURCE), "add_one")
    assert str(info.value) == f"{SOURCE}: invalid TOML: not UTF-8 text (invalid start byte)"


def test_missing_config_file_names_the_file(repository: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_model_config(Path(SOURCE), "add_one")
    assert str(info.value) == f"{SOURCE}: cannot read the file (No such file or directory)"
    assert info.value.path == SOURCE


def test_config_error_keeps_file_and_key_as_attributes(repository: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(
            repository,
            'max_batch_size = 8\n[[input]]\nname = "X"\ndata_type = "FP32"\ndims = "16"\n',
        )
    assert (info.value.path, info.value.key) == (SOURCE, "input[0].dims")
    assert (info.value.expected, info.value.got) == ("a list of integers", '"16"')


# -- validation messages -------------------------------------------------------------------

DATA_TYPES = ", ".join(dt.config_name for dt in DATATYPES)
DYNAMIC_KEYS = (
    "default_priority_level, default_queue_policy, max_concurrent_batches, "
    "max_queue_delay_microseconds, preferred_batch_size, preserve_ordering, "
    "priority_levels, priority_queue_policy"
)


def _input(extra: str, dims: str = "[-1, 4]", data_type: str = "FP32") -> str:
    return f'max_batch_size = 8\n[[input]]\nname = "INPUT0"\ndata_type = "{data_type}"\ndims = {dims}\n{extra}\n'


def _warmup(sample: str, extra: str = "") -> str:
    return BASE + f"[[model_warmup]]\n{extra}\ninputs.INPUT0 = {{ {sample} }}\n"


REJECTED = [
    # unknown keys
    pytest.param(
        "max_batch_sise = 8",
        'unknown key "max_batch_sise" (did you mean "max_batch_size"?)',
        id="unknown-top-level-key-suggests-nearest",
    ),
    pytest.param(
        _input("dim = [4]").replace("dims = [-1, 4]\n", ""),
        'input[0]: unknown key "dim" (did you mean "dims"?)',
        id="unknown-input-key-suggests-nearest",
    ),
    pytest.param(
        BASE + "[dynamic_batching]\nwhatever = 1\n",
        f'dynamic_batching: unknown key "whatever" (known keys: {DYNAMIC_KEYS})',
        id="unknown-key-without-close-match-lists-known-keys",
    ),
    pytest.param(
        "version_policy.all = { versions = [1] }",
        'version_policy.all: unknown key "versions" (this table takes no keys)',
        id="unknown-key-in-empty-table",
    ),
    # types
    pytest.param(
        _input("", dims='"16"'),
        'input[0].dims: expected a list of integers, got "16"',
        id="dims-as-string",
    ),
    pytest.param(
        _input("", dims="[4.0]"),
        "input[0].dims: expected a list of integers, got [4.0]",
        id="dims-float-is-not-an-integer",
    ),
    pytest.param(
        _input("", dims='[4, "a"]'),
        'input[0].dims: expected a list of integers, got [4, "a"]',
        id="dims-mixed-list",
    ),
    pytest.param(
        "max_batch_size = true",
        "max_batch_size: expected an integer >= 0, got true",
        id="bool-is-not-an-integer",
    ),
    pytest.param(
        "max_batch_size = 8.0",
        "max_batch_size: expected an integer >= 0, got 8.0",
        id="float-is-not-an-integer",
    ),
    pytest.param(
        "max_batch_size = -1",
        "max_batch_size: expected an integer >= 0, got -1",
        id="negative-max-batch-size",
    ),
    pytest.param(
        "platform = 3",
        "platform: expected a string, got 3",
        id="platform-not-a-string",
    ),
    pytest.param(
        _input("optional = 1"),
        "input[0].optional: expected a boolean (true or false), got 1",
        id="integer-is-not-a-boolean",
    ),
    pytest.param(
        '[input]\nname = "X"',
        'input: expected an array of tables ([[input]]), got {"name": "X"}',
        id="single-table-instead-of-array",
    ),
    pytest.param(
        "dynamic_batching = true",
        "dynamic_batching: expected a table, got true",
        id="scalar-instead-of-table",
    ),
    pytest.param(
        '[[input]]\ndata_type = "FP32"\ndims = [4]',
        'input[0]: missing required key "name"',
        id="input-without-name",
    ),
    pytest.param(
        '[[output]]\nname = "Y"\ndims = [4]',
        'output[0]: missing required key "data_type"',
        id="output-without-data-type",
    ),
    pytest.param(
        '[[input]]\nname = ""\ndata_type = "FP32"\ndims = [4]',
        'input[0].name: expected a non-empty string, got ""',
        id="empty-input-name",
    ),
    # enums
    pytest.param(
        _input("", data_type="FLOAT32"),
        f'input[0].data_type: expected one of {DATA_TYPES} (the TYPE_ prefix is optional), got "FLOAT32"',
        id="unknown-data-type",
    ),
    pytest.param(
        '[[instance_group]]\nkind = "KIND_MODEL"',
        'instance_group[0].kind: expected one of KIND_AUTO, KIND_GPU, KIND_CPU, got "KIND_MODEL"',
        id="unsupported-kind",
    ),
    pytest.param(
        BASE + '[dynamic_batching.default_queue_policy]\ntimeout_action = "DROP"',
        'dynamic_batching.default_queue_policy.timeout_action: expected one of REJECT, DELAY, got "DROP"',
        id="unknown-timeout-action",
    ),
    pytest.param(
        _input('format = "NCWH"', dims="[3, 8, 8]"),
        'input[0].format: expected one of FORMAT_NONE, FORMAT_NHWC, FORMAT_NCHW, got "NCWH"',
        id="unknown-format",
    ),
    pytest.param(
        'backend = "onnxruntime"',
        'backend: expected "python" (the only backend nereid serves), got "onnxruntime"',
        id="backend-other-than-python",
    ),
    # names
    pytest.param(
        'name = "add_two"',
        'name: expected "add_one" (the folder name), got "add_two"',
        id="name-differs-from-folder",
    ),
    pytest.param(
        BASE + '[[input]]\nname = "INPUT0"\ndata_type = "FP32"\ndims = [1]',
        'input[1].name: duplicate name "INPUT0" (input[0] has it too)',
        id="duplicate-input-name",
    ),
    pytest.param(
        BASE + '[[output]]\nname = "OUTPUT0"\ndata_type = "FP32"\ndims = [1]',
        'output[1].name: duplicate name "OUTPUT0" (output[0] has it too)',
        id="duplicate-output-name",
    ),
    # dims and reshape
    pytest.param(
        _input("", dims="[0, 4]"),
        "input[0].dims: expected a list of integers, each -1 (any size) or >= 1, got [0, 4]",
        id="zero-dim",
    ),
    pytest.param(
        _input("", dims="[-2]"),
        "input[0].dims: expected a list of integers, each -1 (any size) or >= 1, got [-2]",
        id="dim-below-minus-one",
    ),
    pytest.param(
        _input("", dims="[]"),
        "input[0].dims: expected a non-empty list of integers (for a [batch] shape: "
        "dims = [1], reshape = { shape = [] }), got []",
        id="empty-dims-even-when-batching",
    ),
    pytest.param(
        _input("reshape = { shape = [] }", dims="[1]").replace("max_batch_size = 8", ""),
        "input[0].reshape.shape: expected a non-empty shape "
        "(max_batch_size is 0: the model does not batch), got []",
        id="empty-reshape-without-batching",
    ),
    pytest.param(
        _input("reshape = { shape = [4, 3] }", dims="[2, 8]"),
        "input[0].reshape.shape: expected a shape with the element count of dims [2, 8] "
        "(between matching -1 dims), got [4, 3]",
        id="reshape-element-count-differs",
    ),
    pytest.param(
        _input("reshape = { shape = [2, -1, 8] }", dims="[4, -1, 4]"),
        "input[0].reshape.shape: expected a shape with the element count of dims [4, -1, 4] "
        "(between matching -1 dims), got [2, -1, 8]",
        id="reshape-chunks-around-variable-dims-differ",
    ),
    pytest.param(
        _input("reshape = { shape = [0] }", dims="[4]"),
        "input[0].reshape.shape: expected a list of integers, each -1 (any size) or >= 1, got [0]",
        id="reshape-zero-dim",
    ),
    pytest.param(
        _input('format = "NHWC"', dims="[224, 224]"),
        "input[0].dims: expected 3 dims for format FORMAT_NHWC, got [224, 224]",
        id="image-format-needs-three-dims",
    ),
    pytest.param(
        _input("is_shape_tensor = true"),
        "input[0].is_shape_tensor: expected false (Triton supports shape tensors for TensorRT only), got true",
        id="shape-tensor",
    ),
    # pad_value
    pytest.param(
        _input("pad_value = 0").replace("max_batch_size = 8", "max_batch_size = 0"),
        "input[0].pad_value: needs max_batch_size > 0 to pad requests into a batch "
        "(max_batch_size is 0: the model does not batch)",
        id="pad-value-without-batching",
    ),
    pytest.param(
        _input("pad_value = 0", dims="[4]"),
        "input[0].pad_value: needs a -1 (variable-size) dimension to pad, got dims [4]",
        id="pad-value-without-variable-dim",
    ),
    pytest.param(
        _input("pad_value = 0.5", data_type="INT32"),
        "input[0].pad_value: expected an integer in -2147483648..2147483647 (TYPE_INT32), got 0.5",
        id="float-pad-value-for-integer-input",
    ),
    pytest.param(
        _input("pad_value = -1", data_type="UINT8"),
        "input[0].pad_value: expected an integer in 0..255 (TYPE_UINT8), got -1",
        id="pad-value-out-of-range",
    ),
    pytest.param(
        _input("pad_value = 2", data_type="BOOL"),
        "input[0].pad_value: expected an integer in 0..1 (TYPE_BOOL), got 2",
        id="bool-pad-value-beyond-one",
    ),
    pytest.param(
        _input('pad_value = "0"'),
        'input[0].pad_value: expected a number, got "0"',
        id="pad-value-string",
    ),
    pytest.param(
        _input("pad_value = false"),
        "input[0].pad_value: expected a number, got false",
        id="pad-value-bool",
    ),
    # version policy
    pytest.param(
        "version_policy = { latest = {}, all = {} }",
        'version_policy: expected exactly one of latest, all, specific, got {"latest": {}, "all": {}}',
        id="two-version-policies",
    ),
    pytest.param(
        "version_policy = {}",
        "version_policy: expected exactly one of latest, all, specific, got {}",
        id="empty-version-policy",
    ),
    pytest.param(
        "version_policy.latest.num_versions = 0",
        "version_policy.latest.num_versions: expected an integer >= 1, got 0",
        id="latest-zero-versions",
    ),
    pytest.param(
        "version_policy.specific.versions = []",
        "version_policy.specific.versions: expected a non-empty list of integers >= 1, got []",
        id="specific-without-versions",
    ),
    pytest.param(
        "version_policy.specific.versions = [0, 1]",
        "version_policy.specific.versions: expected a non-empty list of integers >= 1, got [0, 1]",
        id="specific-version-zero",
    ),
    # dynamic batching
    pytest.param(
        BASE + "[dynamic_batching]\npreferred_batch_size = [4, 16]",
        "dynamic_batching.preferred_batch_size: expected sizes in 1..8 (max_batch_size), got [4, 16]",
        id="preferred-size-above-max-batch-size",
    ),
    pytest.param(
        BASE + "[dynamic_batching]\npreferred_batch_size = [0]",
        "dynamic_batching.preferred_batch_size: expected sizes in 1..8 (max_batch_size), got [0]",
        id="preferred-size-zero",
    ),
    pytest.param(
        "[dynamic_batching]\npreferred_batch_size = [4]",
        "dynamic_batching.preferred_batch_size: expected an empty list "
        "(max_batch_size is 0: the model does not batch), got [4]",
        id="preferred-size-without-batching",
    ),
    pytest.param(
        BASE + "[dynamic_batching]\npriority_levels = 3",
        "dynamic_batching.default_priority_level: expected an integer in 1..3 (priority_levels), got 0",
        id="default-priority-level-zero-with-priorities",
    ),
    pytest.param(
        BASE + "[dynamic_batching]\npriority_levels = 3\ndefault_priority_level = 4",
        "dynamic_batching.default_priority_level: expected an integer in 1..3 (priority_levels), got 4",
        id="default-priority-level-above-levels",
    ),
    pytest.param(
        BASE + "[dynamic_batching]\npriority_levels = 2\ndefault_priority_level = 1\n"
        "[dynamic_batching.priority_queue_policy.3]\nmax_queue_size = 1",
        "dynamic_batching.priority_queue_policy.3: expected a priority level in 1..2 (priority_levels), got 3",
        id="queue-policy-for-missing-level",
    ),
    pytest.param(
        BASE + "[dynamic_batching.priority_queue_policy.high]\nmax_queue_size = 1",
        'dynamic_batching.priority_queue_policy: expected priority levels (integers >= 1) as keys, got "high"',
        id="queue-policy-level-not-a-number",
    ),
    pytest.param(
        BASE + "[dynamic_batching.priority_queue_policy.1]\nmax_queue_sise = 1",
        'dynamic_batching.priority_queue_policy.1: unknown key "max_queue_sise" (did you mean "max_queue_size"?)',
        id="queue-policy-unknown-key",
    ),
    pytest.param(
        BASE + "[dynamic_batching.default_queue_policy]\nmax_queue_size = -1",
        "dynamic_batching.default_queue_policy.max_queue_size: expected an integer >= 0, got -1",
        id="negative-queue-size",
    ),
    pytest.param(
        BASE
        + "[dynamic_batching]\npreserve_ordering = true\npriority_levels = 2\ndefault_priority_level = 1",
        "dynamic_batching.priority_levels: expected 0 or 1 when preserve_ordering is true, got 2",
        id="preserve-ordering-with-priorities",
    ),
    pytest.param(
        BASE + "[dynamic_batching]\npreserve_ordering = true\n"
        '[dynamic_batching.default_queue_policy]\ntimeout_action = "DELAY"\ndefault_timeout_microseconds = 5',
        'dynamic_batching.default_queue_policy.timeout_action: expected "REJECT" when '
        'preserve_ordering is true and a timeout is set, got "DELAY"',
        id="preserve-ordering-with-delayed-timeouts",
    ),
    pytest.param(
        BASE + "[dynamic_batching]\nmax_concurrent_batches = 0",
        "dynamic_batching.max_concurrent_batches: expected an integer >= 1, got 0",
        id="zero-concurrent-batches",
    ),
    pytest.param(
        BASE + "[dynamic_batching]\nmax_queue_delay_microseconds = -5",
        "dynamic_batching.max_queue_delay_microseconds: expected an integer >= 0, got -5",
        id="negative-queue-delay",
    ),
    # instance groups
    pytest.param(
        '[[instance_group]]\nkind = "KIND_CPU"\ngpus = [0]',
        "instance_group[0].gpus: expected no GPUs with kind KIND_CPU, got [0]",
        id="gpus-with-cpu-kind",
    ),
    pytest.param(
        '[[instance_group]]\nkind = "KIND_GPU"\ngpus = [-1]',
        "instance_group[0].gpus: expected a list of integers >= 0 (GPU ids), got [-1]",
        id="negative-gpu-id",
    ),
    pytest.param(
        "[[instance_group]]\ncount = 0",
        "instance_group[0].count: expected an integer >= 1, got 0",
        id="zero-instances",
    ),
    pytest.param(
        '[[instance_group]]\nisolation = "fork"',
        'instance_group[0].isolation: expected "thread" or "process", got "fork"',
        id="unknown-isolation",
    ),
    pytest.param(
        '[[instance_group]]\n[[instance_group]]\nisolation = ""',
        'instance_group[1].isolation: expected "thread" or "process", got ""',
        id="empty-isolation",
    ),
    pytest.param(
        "[[instance_group]]\nisolation = true",
        'instance_group[0].isolation: expected "thread" or "process", got true',
        id="isolation-not-a-string",
    ),
    pytest.param(
        '[[instance_group]]\nisolaton = "process"',
        'instance_group[0]: unknown key "isolaton" (did you mean "isolation"?)',
        id="isolation-misspelt",
    ),
    pytest.param(
        'input_tensors = "jax"',
        'input_tensors: expected "numpy" or "torch", got "jax"',
        id="input-tensors-unknown",
    ),
    pytest.param(
        '[[instance_group]]\nprocesses = "shared"',
        'instance_group[0].processes: expected "per_device" or "per_instance", got "shared"',
        id="unknown-processes",
    ),
    pytest.param(
        '[[instance_group]]\nisolation = "thread"\nprocesses = "per_device"',
        'instance_group[0].processes: expected no processes with isolation = "thread" (or isolation = "process"), '
        'got "per_device"',
        id="processes-with-threads",
    ),
    pytest.param(
        '[[instance_group]]\nname = "g"\nprocesses = "per_device"\n[[instance_group]]\nname = "g"',
        'instance_group[1].processes: expected "per_device" (the processes of instance_group[0], '
        'which has the same name "g"), got "none"',
        id="same-group-name-different-processes",
    ),
    pytest.param(
        '[[instance_group]]\nname = "g"\n[[instance_group]]\nname = "g"\nisolation = "process"',
        'instance_group[1].isolation: expected no isolation (the isolation of instance_group[0], '
        'which has the same name "g"), got "process"',
        id="same-group-name-different-isolation",
    ),
    # execution timeout
    pytest.param(
        "execution_timeout_ms = -1",
        "execution_timeout_ms: expected an integer >= 0, got -1",
        id="negative-execution-timeout",
    ),
    pytest.param(
        "execution_timeout_ms = 1.5",
        "execution_timeout_ms: expected an integer >= 0, got 1.5",
        id="execution-timeout-float",
    ),
    pytest.param(
        'execution_timeout_ms = "250"',
        'execution_timeout_ms: expected an integer >= 0, got "250"',
        id="execution-timeout-string",
    ),
    pytest.param(
        "execution_timeout_ms = true",
        "execution_timeout_ms: expected an integer >= 0, got true",
        id="execution-timeout-bool",
    ),
    pytest.param(
        "execution_timeout = 250",
        'unknown key "execution_timeout" (did you mean "execution_timeout_ms"?)',
        id="execution-timeout-misspelt",
    ),
    pytest.param(
        "[dynamic_batching]\nexecution_timeout_ms = 250",
        'dynamic_batching: unknown key "execution_timeout_ms" (known keys: '
        + DYNAMIC_KEYS
        + ")",
        id="execution-timeout-is-top-level-only",
    ),
    # parameters
    pytest.param(
        "[parameters]\nmax_concurrent_batches = 2",
        "parameters.max_concurrent_batches: this name is reserved for nereid's extension; "
        "set dynamic_batching.max_concurrent_batches",
        id="reserved-parameter-max-concurrent-batches",
    ),
    pytest.param(
        '[parameters]\n"pad_value.INPUT0" = "0"',
        'parameters."pad_value.INPUT0": this name is reserved for nereid\'s extension; '
        "set pad_value in the input's [[input]] table",
        id="reserved-parameter-pad-value",
    ),
    pytest.param(
        "[parameters]\nexecution_timeout_ms = 250",
        "parameters.execution_timeout_ms: this name is reserved for nereid's extension; "
        "set the top-level execution_timeout_ms",
        id="reserved-parameter-execution-timeout",
    ),
    pytest.param(
        '[parameters]\n"instance_group.add_one_0.isolation" = "process"',
        'parameters."instance_group.add_one_0.isolation": this name is reserved for '
        "nereid's extension; set isolation in the group's [[instance_group]] table",
        id="reserved-parameter-isolation",
    ),
    pytest.param(
        "[parameters]\nsizes = [1, 2]",
        "parameters.sizes: expected a string, number or boolean, got [1, 2]",
        id="parameter-list",
    ),
    pytest.param(
        "[parameters.nested]\nkey = 1",
        'parameters.nested: expected a string, number or boolean, got {"key": 1}',
        id="parameter-table",
    ),
    pytest.param(
        "[parameters]\nwhen = 1979-05-27",
        "parameters.when: expected a string, number or boolean, got 1979-05-27",
        id="parameter-date",
    ),
    # transaction policy
    pytest.param(
        '[model_transaction_policy]\ndecoupled = "yes"',
        'model_transaction_policy.decoupled: expected a boolean (true or false), got "yes"',
        id="decoupled-not-a-boolean",
    ),
    # warmup
    pytest.param(
        _warmup('data_type = "FP32", dims = [1, 4], zero_data = true, random_data = true'),
        "model_warmup[0].inputs.INPUT0: expected exactly one of zero_data, random_data, "
        "input_data_file, got zero_data and random_data",
        id="warmup-two-data-sources",
    ),
    pytest.param(
        _warmup('data_type = "FP32", dims = [1, 4]'),
        "model_warmup[0].inputs.INPUT0: expected exactly one of zero_data, random_data, "
        "input_data_file, got none of them",
        id="warmup-no-data-source",
    ),
    pytest.param(
        _warmup('data_type = "FP32", dims = [1, 4], zero_data = false'),
        "model_warmup[0].inputs.INPUT0.zero_data: expected true (leave the key out instead), got false",
        id="warmup-zero-data-false",
    ),
    pytest.param(
        _warmup('data_type = "FP32", dims = [1, 4], input_data_file = ""'),
        'model_warmup[0].inputs.INPUT0.input_data_file: expected a non-empty string, got ""',
        id="warmup-empty-data-file",
    ),
    pytest.param(
        _warmup('data_type = "FP32", dims = [-1, 4], zero_data = true'),
        "model_warmup[0].inputs.INPUT0.dims: expected a list of integers >= 1 "
        "(warmup data has fixed sizes), got [-1, 4]",
        id="warmup-variable-dim",
    ),
    pytest.param(
        _warmup('data_type = "FP32", dims = [2, 5], zero_data = true'),
        'model_warmup[0].inputs.INPUT0.dims: expected a shape matching dims [-1, 4] of input "INPUT0", got [2, 5]',
        id="warmup-dims-do-not-match-input",
    ),
    pytest.param(
        _warmup('data_type = "INT32", dims = [2, 4], zero_data = true'),
        'model_warmup[0].inputs.INPUT0.data_type: expected TYPE_FP32 (the data type of input "INPUT0"), '
        'got "TYPE_INT32"',
        id="warmup-data-type-differs",
    ),
    pytest.param(
        BASE
        + '[[model_warmup]]\ninputs.INPUT9 = { data_type = "FP32", dims = [2, 4], zero_data = true }',
        'model_warmup[0].inputs: expected names of the model\'s inputs (INPUT0), got "INPUT9"',
        id="warmup-unknown-input",
    ),
    pytest.param(
        BASE + '[[model_warmup]]\nname = "empty"',
        'model_warmup[0].inputs: missing input "INPUT0" (only optional inputs may be left out)',
        id="warmup-missing-required-input",
    ),
    pytest.param(
        _warmup('data_type = "FP32", dims = [2, 4], zero_data = true', "batch_size = 9"),
        "model_warmup[0].batch_size: expected an integer in 1..8 (max_batch_size), got 9",
        id="warmup-batch-above-max-batch-size",
    ),
    pytest.param(
        _warmup('data_type = "FP32", dims = [2, 4], zero_data = true', "batch_size = 0"),
        "model_warmup[0].batch_size: expected an integer >= 1, got 0",
        id="warmup-batch-zero",
    ),
    pytest.param(
        "[[model_warmup]]\nbatch_size = 2",
        "model_warmup[0].batch_size: expected 1 (max_batch_size is 0: the model does not batch), got 2",
        id="warmup-batch-without-batching",
    ),
]


@pytest.mark.parametrize(("text", "message"), REJECTED)
def test_invalid_config_is_rejected_with_file_key_expected_and_got(
    repository: Path, text: str, message: str
) -> None:
    assert error(repository, text) == f"{SOURCE}: {message}"


def test_unknown_config_key_suggests_nearest_key(repository: Path) -> None:
    message = error(repository, "max_batch_sise = 8\n")
    assert message == f'{SOURCE}: unknown key "max_batch_sise" (did you mean "max_batch_size"?)'


def test_contract_dims_example_message_is_exact(repository: Path) -> None:
    text = 'max_batch_size = 8\n[[input]]\nname = "INPUT0"\ndata_type = "TYPE_FP32"\ndims = "16"\n'
    assert (
        error(repository, text) == f'{SOURCE}: input[0].dims: expected a list of integers, got "16"'
    )


def test_long_values_are_shortened_in_messages(repository: Path) -> None:
    sizes = ", ".join(str(n) for n in range(100, 160))
    message = error(repository, BASE + f"[dynamic_batching]\npreferred_batch_size = [{sizes}]\n")
    got = message.split(", got ", 1)[1]
    assert len(got) == 120 and got.endswith("...")
