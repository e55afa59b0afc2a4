"""An ensemble's own config (``platform = "ensemble"``): the records, the JSON and pbtxt
forms, and Triton's checks of the steps' dataflow with its messages."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from nereid.config import config_from_triton_json, parse_model_config, to_triton_json
from nereid.config.pbtxt import load_pbtxt_config
from nereid.config.schema import EnsembleScheduling, EnsembleStep
from nereid.errors import ConfigError

pytestmark = pytest.mark.unit

HEAD = """
platform = "ensemble"
max_batch_size = 8
[[input]]
name = "IN"
data_type = "FP32"
dims = [4]
[[output]]
name = "OUT"
data_type = "FP32"
dims = [4]
"""

TWO_STEPS = HEAD + """
[[ensemble_scheduling.step]]
model_name = "pre"
input_map = { X = "IN" }
output_map = { Y = "mid" }
[[ensemble_scheduling.step]]
model_name = "post"
model_version = 2
input_map = { X = "mid" }
output_map = { Y = "OUT" }
"""


def parse(text: str) -> object:
    return parse_model_config(tomllib.loads(text), source="ens/config.toml", folder_name="ens")


def error(text: str) -> str:
    with pytest.raises(ConfigError) as failure:
        parse(text)
    return failure.value.message


def test_an_ensemble_config_reads_into_its_steps_with_tritons_defaults() -> None:
    config = parse(TWO_STEPS)
    assert config.ensemble_scheduling == EnsembleScheduling(step=(  # type: ignore[attr-defined]
        EnsembleStep("pre", -1, {"X": "IN"}, {"Y": "mid"}),
        EnsembleStep("post", 2, {"X": "mid"}, {"Y": "OUT"}),
    ))
    assert (config.backend, config.instance_group, config.default_model_filename) == ("", (), "")  # type: ignore[attr-defined]


def test_the_json_form_round_trips_and_shows_no_optimization() -> None:
    config = parse(TWO_STEPS)
    rendered = to_triton_json(config)  # type: ignore[arg-type]
    assert "optimization" not in rendered
    assert rendered["instance_group"] == []
    assert rendered["ensemble_scheduling"] == {"step": [
        {"model_name": "pre", "model_version": -1, "input_map": {"X": "IN"}, "output_map": {"Y": "mid"},
         "model_namespace": ""},
        {"model_name": "post", "model_version": 2, "input_map": {"X": "mid"}, "output_map": {"Y": "OUT"},
         "model_namespace": ""},
    ]}
    assert config_from_triton_json(rendered, source="x", folder_name="ens") == config


def test_tritons_ensemble_pbtxt_loads(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text("""
name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "m"
      model_version: -1
      input_map { key: "X" value: "IN" }
      output_map { key: "Y" value: "OUT" }
    }
  ]
}
""")
    config = load_pbtxt_config(path, "ens")
    assert config.ensemble_scheduling == EnsembleScheduling(step=(EnsembleStep("m", -1, {"X": "IN"}, {"Y": "OUT"}),))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(HEAD, "ens/config.toml: platform: ensemble scheduling must be set for ensemble ens whose "
                     "platform is ensemble", id="no-scheduling"),
        pytest.param(TWO_STEPS.replace('platform = "ensemble"', ""), "ens/config.toml: ensemble_scheduling: ensemble "
                     "scheduling cannot be set for model 'ens' whose platform is not ensemble", id="not-an-ensemble"),
        pytest.param(TWO_STEPS + '[[instance_group]]\ncount = 1\n', "ens/config.toml: instance_group: instance group "
                     "should not be specified for ensemble 'ens'", id="instance-group"),
        pytest.param(TWO_STEPS.replace('platform = "ensemble"', 'platform = "ensemble"\nbackend = "python"'),
                     "ens/config.toml: backend: expected nothing (platform \"ensemble\" runs its steps' models), "
                     'got "python"', id="backend"),
        pytest.param(HEAD + "[ensemble_scheduling]\nstep = []\n", "ens/config.toml: ensemble_scheduling: must specify "
                     "'step' for ensemble 'ens'", id="no-steps"),
        pytest.param(TWO_STEPS.replace('model_name = "post"\n', ""), "ens/config.toml: ensemble_scheduling.step[1]: "
                     "must specify 'model_name' in step 1 of ensemble 'ens'", id="no-model-name"),
        pytest.param(TWO_STEPS.replace('output_map = { Y = "OUT" }', 'output_map = { Y = "mid" }'),
                     "ens/config.toml: ensemble_scheduling.step[1].output_map: ensemble tensor 'mid' can appear in an "
                     "output map only once for ensemble 'ens' step 1", id="written-twice"),
        pytest.param(TWO_STEPS.replace('input_map = { X = "IN" }', 'input_map = { X = "other" }'),
                     "ens/config.toml: input: ensemble input 'IN' for ensemble 'ens' is not used", id="input-unused"),
        pytest.param(TWO_STEPS.replace('output_map = { Y = "OUT" }', 'output_map = { Y = "elsewhere" }'),
                     "ens/config.toml: output: ensemble output 'OUT' for ensemble 'ens' is not used",
                     id="output-never-written"),
        pytest.param(TWO_STEPS.replace('input_map = { X = "mid" }', 'input_map = { X = "mid", Z = "nowhere" }'),
                     "ens/config.toml: output: output 'OUT' for ensemble 'ens' is not written: at least one of its "
                     "depending tensors, 'nowhere', is not connected", id="not-connected"),
        pytest.param(TWO_STEPS.replace('input_map = { X = "IN" }', 'input_map = { X = "IN", Z = "loop" }')
                     .replace('output_map = { Y = "OUT" }', 'output_map = { Y = "OUT", W = "loop" }'),
                     "ens/config.toml: output: output 'OUT' for ensemble 'ens' is not written: its steps depend on "
                     "each other in a cycle through ensemble tensor 'mid'", id="cycle"),
        pytest.param(TWO_STEPS.replace('output_map = { Y = "mid" }', 'output_map = { Y = "mid", Z = "spare" }'),
                     "ens/config.toml: ensemble_scheduling.step[0].output_map: ensemble tensor 'spare' is unused in "
                     "ensemble 'ens'", id="tensor-unused"),
        pytest.param(TWO_STEPS.replace("model_version = 2", "model_version = 0"),
                     "ens/config.toml: ensemble_scheduling.step[1].model_version: expected -1 (the latest version) "
                     "or a version >= 1, got 0", id="version-zero"),
        pytest.param(TWO_STEPS.replace('input_map = { X = "mid" }', 'input_map = { X = 3 }'),
                     "ens/config.toml: ensemble_scheduling.step[1].input_map.X: expected the name of an ensemble "
                     "tensor (a non-empty string), got 3", id="map-value"),
        pytest.param(TWO_STEPS.replace('model_version = 2', 'model_version = 2\nmodel_spec = 1'),
                     'ens/config.toml: ensemble_scheduling.step[1]: unknown key "model_spec" (did you mean '
                     '"model_namespace"?)', id="unknown-key"),
    ],
)
def test_an_ensemble_config_tritons_checks_refuse_is_refused_with_tritons_words(text: str, message: str) -> None:
    assert error(text) == message
