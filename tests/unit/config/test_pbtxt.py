"""Triton's config.pbtxt: read into the same ModelConfig as config.toml, the repository's
choice between the two files (and neither: auto_complete_config), its errors, and
``nereid convert-config``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nereid.config import load_model_config, to_triton_json
from nereid.config.pbtxt import load_pbtxt_config, pbtxt_to_toml
from nereid.errors import ConfigError
from nereid.repository.scan import list_model_names, read_model

ADD_SUB = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
input [ { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [ 4, 8 ] }
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "greeting" value: { string_value: "hi" } }
"""

ADD_SUB_TOML = """
name = "add_sub"
backend = "python"
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [4]
[[input]]
name = "INPUT1"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "OUTPUT1"
data_type = "TYPE_FP32"
dims = [4]
[dynamic_batching]
max_queue_delay_microseconds = 100
preferred_batch_size = [4, 8]
[[instance_group]]
count = 2
kind = "KIND_CPU"
[parameters]
greeting = "hi"
"""

TRITON_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]
"""

AUTO_COMPLETE = TRITON_MODEL + """
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [2]})
        config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [2]})
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config
"""


def model_folder(root: Path, name: str, pbtxt: str | None = None, model: str | None = TRITON_MODEL,
                 toml: str | None = None) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    if pbtxt is not None:
        (folder / "config.pbtxt").write_text(pbtxt)
    if toml is not None:
        (folder / "config.toml").write_text(toml)
    if model is not None:
        (folder / "1" / "model.py").write_text(model)
    return folder


def test_a_pbtxt_means_what_the_same_config_toml_means(tmp_path: Path) -> None:
    pbtxt = model_folder(tmp_path / "a", "add_sub", ADD_SUB) / "config.pbtxt"
    toml = model_folder(tmp_path / "b", "add_sub", toml=ADD_SUB_TOML) / "config.toml"
    assert to_triton_json(load_pbtxt_config(pbtxt, "add_sub")) == to_triton_json(load_model_config(toml, "add_sub"))


def test_convert_config_prints_toml_that_loses_nothing(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "add_sub", ADD_SUB)
    text = pbtxt_to_toml(folder / "config.pbtxt", "add_sub")
    converted = folder.parent / "converted"
    converted.mkdir()
    (converted / "config.toml").write_text(text)
    tomllib.loads(text)
    assert to_triton_json(load_model_config(converted / "config.toml", "add_sub")) == to_triton_json(
        load_pbtxt_config(folder / "config.pbtxt", "add_sub"))
    cli = subprocess.run([sys.executable, "-m", "nereid", "convert-config", str(folder)], capture_output=True, text=True)
    assert cli.returncode == 0 and cli.stdout == text


RICH = """
name: "rich"
backend: "python"
max_batch_size: 8
version_policy { specific { versions: [1, 3] } }
input [ { name: "TOKENS" data_type: TYPE_INT64 dims: [ -1 ] } ]
input [ { name: "MASK" data_type: TYPE_BOOL dims: [ 1 ] reshape { shape: [ ] } optional: true } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 4, 4 ] } ]
dynamic_batching {
  preferred_batch_size: [ 2, 4, 8 ]
  max_queue_delay_microseconds: 500
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { max_queue_size: 16 timeout_action: DELAY default_timeout_microseconds: 1000 }
  priority_queue_policy { key: 2 value: { max_queue_size: 4 } }
}
instance_group [ { name: "cpu_group" count: 2 kind: KIND_CPU } ]
parameters { key: "instance_group.cpu_group.isolation" value: { string_value: "process" } }
parameters { key: "greeting" value: { string_value: "hello \\"world\\"" } }
parameters { key: "with space" value: { string_value: "x" } }
model_warmup [ {
  name: "w" batch_size: 2
  inputs { key: "TOKENS" value: { data_type: TYPE_INT64 dims: [ 3 ] zero_data: true } }
  inputs { key: "MASK" value: { data_type: TYPE_BOOL dims: [ 1 ] random_data: true } }
} ]
"""


def test_convert_config_prints_toml_a_person_would_write(tmp_path: Path) -> None:
    """Top-level keys, then one table per section as the README writes them: short lists
    inline (``dims = [4]``), ``[[instance_group]]`` tables, ``[parameters]`` as strings."""
    folder = model_folder(tmp_path, "add_sub", ADD_SUB)
    assert pbtxt_to_toml(folder / "config.pbtxt", "add_sub") == (
        "# converted from config.pbtxt by `nereid convert-config`\n"
        + "\n".join([
            'name = "add_sub"', 'backend = "python"', "max_batch_size = 8", "",
            "[[input]]", 'name = "INPUT0"', 'data_type = "TYPE_FP32"', "dims = [4]", "",
            "[[input]]", 'name = "INPUT1"', 'data_type = "TYPE_FP32"', "dims = [4]", "",
            "[[output]]", 'name = "OUTPUT0"', 'data_type = "TYPE_FP32"', "dims = [4]", "",
            "[[output]]", 'name = "OUTPUT1"', 'data_type = "TYPE_FP32"', "dims = [4]", "",
            "[dynamic_batching]", "preferred_batch_size = [4, 8]", "max_queue_delay_microseconds = 100", "",
            "[[instance_group]]", "count = 2", 'kind = "KIND_CPU"', "",
            "[parameters]", 'greeting = "hi"',
        ])
        + "\n"
    )


def test_convert_config_of_every_kind_of_section_means_the_same_and_stays_compact(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "rich", RICH)
    text = pbtxt_to_toml(folder / "config.pbtxt", "rich")
    converted = tmp_path / "converted" / "rich"
    converted.mkdir(parents=True)
    (converted / "config.toml").write_text(text)
    assert to_triton_json(load_model_config(converted / "config.toml", "rich")) == to_triton_json(
        load_pbtxt_config(folder / "config.pbtxt", "rich"))
    lines = text.splitlines()
    assert not [line for line in lines if line.rstrip().endswith(("[", "{", ","))], text  # no value spread over lines
    for line in ("specific = { versions = [1, 3] }", "dims = [4, 4]", "reshape = { shape = [] }",
                 "preferred_batch_size = [2, 4, 8]", 'isolation = "process"', '"with space" = "x"',
                 'TOKENS = { data_type = "TYPE_INT64", dims = [3], zero_data = true }'):
        assert line in lines, (line, text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name: "m"\nbackend: "python"\ninput [ { name: "A" data_type: TYPE_FP32 dims: [ 4 } ]\n',
         "invalid protobuf text format: line 3, column"),
        ('name: "m"\nbackend: "python"\nmax_batch_sise: 4\n',
         'line 3, column 1: unknown field "max_batch_sise" of ModelConfig (did you mean "max_batch_size"?)'),
        ('name: "m"\nbackend: "python"\ninput [ { name: "A" data_type: TYPE_FP32 dimz: [ 4 ] } ]\n',
         'line 3, column 42: unknown field "dimz" of ModelInput (did you mean "dims"?)'),
        ('name: "m"\nbackend: "python"\ndynamic_batching { max_queue_delay_microsecond: 100 }\n',
         'line 3, column 20: unknown field "max_queue_delay_microsecond" of ModelDynamicBatching '
         '(did you mean "max_queue_delay_microseconds"?)'),
        ('name: "m"\nbackend: "python"\ninput [ { name: "A" data_type: FP32 dims: [ 4 ] } ]\n',
         'line 3, column 32: unknown value "FP32" of DataType (did you mean "TYPE_FP32"?)'),
        ('name: "m"\nbackend: "python"\ninstance_group [ { kind: KIND_GPUS } ]\n',
         'line 3, column 26: unknown value "KIND_GPUS" of Kind (did you mean "KIND_GPU"?)'),
        ('name: "m"\nbackend: "python"\nzzzz: 1\n', 'line 3, column 1: unknown field "zzzz" of ModelConfig (known fields: name, '),
        ('name: "m"\nbackend: "onnxruntime"\n',
         'backend: expected "python" (nereid serves Triton Python-backend models and ensembles only), got "onnxruntime"'),
        ('name: "m"\nplatform: "tensorrt_plan"\n',
         'backend: expected "python" (nereid serves Triton Python-backend models and ensembles only), got platform "tensorrt_plan"'),
        ('name: "m"\n', 'backend: expected "python" (nereid serves Triton Python-backend models and ensembles only), got nothing'),
        ('name: "m"\nbackend: "python"\nsequence_batching { iterative_sequence: true }\n',
         "sequence_batching.iterative_sequence: not supported by nereid"),
        ('name: "m"\nbackend: "python"\ninput [ { name: "A" data_type: TYPE_FP32 dims: [ 0 ] } ]\n'
         'output [ { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n', "input[0].dims"),
    ],
    ids=["parse-error", "unknown-field", "unknown-input-field", "unknown-batching-field", "enum-without-prefix",
         "unknown-enum-value", "no-close-field", "other-backend", "other-platform", "no-backend", "iterative-sequence",
         "bad-dims"],
)
def test_bad_pbtxt_files_name_the_file_and_the_reason(tmp_path: Path, text: str, message: str) -> None:
    folder = model_folder(tmp_path, "m", text)
    with pytest.raises(ConfigError) as caught:
        load_pbtxt_config(folder / "config.pbtxt", "m")
    assert caught.value.message.startswith(str(folder / "config.pbtxt") + ": ")
    assert message in caught.value.message
    source = read_model(tmp_path, "m")
    assert source.config is None and message in (source.error or "")


def test_both_config_files_is_an_error_naming_both(tmp_path: Path) -> None:
    model_folder(tmp_path, "add_sub", ADD_SUB, toml=ADD_SUB_TOML)
    source = read_model(tmp_path, "add_sub")
    assert source.config is None
    assert source.error == f"{tmp_path / 'add_sub'}: holds both config.toml and config.pbtxt: keep one of them " \
                           "(nereid reads either)"


def test_auto_complete_config_supplies_the_config_when_there_is_no_file(tmp_path: Path) -> None:
    model_folder(tmp_path, "auto", model=AUTO_COMPLETE)
    assert list_model_names(tmp_path) == ["auto"]
    source = read_model(tmp_path, "auto")
    assert source.error is None and source.config is not None
    config = source.config
    assert (config.max_batch_size, [i.name for i in config.input], [o.name for o in config.output]) == (4, ["IN"], ["OUT"])
    assert config.dynamic_batching is not None


def test_auto_complete_config_completes_a_partial_pbtxt_and_its_errors_are_tritons(tmp_path: Path) -> None:
    model_folder(tmp_path, "auto", 'name: "auto"\nbackend: "python"\nmax_batch_size: 2\n', AUTO_COMPLETE)
    assert read_model(tmp_path, "auto").config.max_batch_size == 4  # type: ignore[union-attr]
    clash = 'name: "clash"\nbackend: "python"\ninput [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    model_folder(tmp_path, "clash", clash, AUTO_COMPLETE)
    source = read_model(tmp_path, "clash")
    assert source.config is None
    assert "(auto_complete_config): ValueError: unable to load model 'clash', configuration expects datatype " \
           "TYPE_FP32 for input 'IN', model provides TYPE_INT32" in (source.error or "")


def test_a_model_file_without_a_config_is_listed_with_its_reason(tmp_path: Path) -> None:
    model_folder(tmp_path, "plain", model="class Model:\n    def infer(self, inputs):\n        return inputs\n")
    model_folder(tmp_path, "triton", model=TRITON_MODEL)
    (tmp_path / "notes").mkdir()
    assert list_model_names(tmp_path) == ["plain", "triton"]
    for name in ("plain", "triton"):
        source = read_model(tmp_path, name)
        assert source.config is None
        assert source.error == f"{tmp_path / name}: no config.toml or config.pbtxt (and no " \
                               "TritonPythonModel.auto_complete_config in the model file to supply one): add one of them"
