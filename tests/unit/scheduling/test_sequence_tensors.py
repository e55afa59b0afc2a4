"""SequenceTensors: control values and dtypes as Triton fills them, implicit state (initial
values, kept outputs), warmup samples, and the config instances run with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nereid.config import parse_model_config
from nereid.config.schema import ModelConfig
from nereid.errors import ModelLoadError
from nereid.inference import InferRequest, SequenceFlags
from nereid.scheduling.sequence_tensors import SequenceTensors, execution_config


def config(max_batch_size: int = 4, corrid: str = "TYPE_STRING", initial: dict[str, Any] | None = None) -> ModelConfig:
    state: dict[str, Any] = {"input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_FP32", "dims": [2]}
    if initial is not None:
        state["initial_state"] = [{"data_type": "TYPE_FP32", "dims": [2], **initial}]
    return parse_model_config({
        "name": "m", "max_batch_size": max_batch_size,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
        "sequence_batching": {
            "control_input": [
                {"name": "READY", "control": [{"kind": "READY", "fp32_false_true": [0.5, 2.5]}]},
                {"name": "END", "control": [{"kind": "END", "bool_false_true": [False, True]}]},
                {"name": "ID", "control": [{"kind": "CORRID", "data_type": corrid}]},
            ],
            "state": [state],
        },
    }, source="config.toml", folder_name="m")


def request(flags: SequenceFlags, rows: int = 1) -> InferRequest:
    return InferRequest("m", {"X": np.ones((rows, 2), dtype=np.float32)}, rows=rows, sequence=flags)


def test_controls_take_the_configured_values_dtypes_and_a_batch_dim() -> None:
    step = SequenceTensors(config(), Path(".")).step(request(SequenceFlags("s1", True, False)), None)
    assert step.inputs["READY"].dtype == np.float32 and step.inputs["READY"].tolist() == [[2.5]]
    assert step.inputs["END"].dtype == np.bool_ and step.inputs["END"].tolist() == [[False]]
    assert step.inputs["ID"].tolist() == [[b"s1"]]
    assert step.inputs["S_IN"].tolist() == [[0.0, 0.0]]


def test_a_non_batching_model_gets_controls_and_state_without_a_batch_dim() -> None:
    tensors = SequenceTensors(config(max_batch_size=0, corrid="TYPE_UINT64"), Path("."))
    step = tensors.step(InferRequest("m", {"X": np.ones(2, dtype=np.float32)}, sequence=SequenceFlags(7)), None)
    assert step.inputs["ID"].dtype == np.uint64 and step.inputs["ID"].tolist() == [7]
    assert step.inputs["S_IN"].shape == (2,)


def test_the_state_output_is_kept_out_of_the_answer_and_fed_back_until_a_start() -> None:
    tensors = SequenceTensors(config(), Path("."))
    answer, state = tensors.keep({"Y": np.zeros((1, 2)), "S_OUT": np.array([[3.0, 4.0]])}, None)
    assert list(answer) == ["Y"]
    assert tensors.step(request(SequenceFlags("s", False)), state).inputs["S_IN"].tolist() == [[3.0, 4.0]]
    assert tensors.step(request(SequenceFlags("s", True)), state).inputs["S_IN"].tolist() == [[0.0, 0.0]]


def test_initial_state_comes_from_the_data_file_in_the_model_folder(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "start.bin").write_bytes(np.array([1.5, -2.0], dtype=np.float32).tobytes())
    tensors = SequenceTensors(config(initial={"data_file": "start.bin"}), tmp_path)
    assert tensors.step(request(SequenceFlags("s", True)), None).inputs["S_IN"].tolist() == [[1.5, -2.0]]


def test_an_initial_state_file_of_the_wrong_size_fails_the_load_naming_it(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "start.bin").write_bytes(b"\0" * 4)
    with pytest.raises(ModelLoadError, match="start.bin: initial_state of state 'S_IN' expected 8 bytes"):
        SequenceTensors(config(initial={"data_file": "start.bin"}), tmp_path)


def test_a_warmup_sample_is_a_one_step_sequence_with_controls_for_each_row() -> None:
    sample = SequenceTensors(config(), Path(".")).warmup(request(None, rows=3))  # type: ignore[arg-type]
    assert sample.inputs["END"].tolist() == [[True]] * 3
    assert sample.inputs["S_IN"].shape == (3, 2)


def test_instances_run_with_the_control_and_state_tensors_declared() -> None:
    running = execution_config(config())
    assert [tensor.name for tensor in running.input] == ["X", "READY", "END", "ID", "S_IN"]
    assert [tensor.name for tensor in running.output] == ["Y", "S_OUT"]


@pytest.mark.parametrize(("corrid", "id_", "expected"), [
    ("TYPE_INT32", 2**32 + 5, 5), ("TYPE_UINT32", 2**33 + 7, 7), ("TYPE_INT64", 2**64 - 1, -1),
], ids=["int32", "uint32", "int64"])
def test_an_integer_id_too_wide_for_the_corrid_type_keeps_its_low_bytes_as_in_triton(
        corrid: str, id_: int, expected: int) -> None:
    step = SequenceTensors(config(corrid=corrid), Path(".")).step(request(SequenceFlags(id_, True)), None)
    assert step.inputs["ID"].tolist() == [[expected]]


@pytest.mark.parametrize("corrid", ["TYPE_STRING", "TYPE_UINT64"])
def test_a_null_request_copies_the_shapes_of_a_real_one_with_zeros_and_not_ready_controls(corrid: str) -> None:
    tensors = SequenceTensors(config(corrid=corrid), Path("."))
    real = tensors.step(request(SequenceFlags("s" if corrid == "TYPE_STRING" else 9, True)),
                        {"S_IN": np.array([3.0, 4.0], dtype=np.float32)})
    null = tensors.null(real)
    assert {name: array.shape for name, array in null.inputs.items()} == {
        name: array.shape for name, array in real.inputs.items()}
    assert null.inputs["X"].tolist() == [[0.0, 0.0]] and null.inputs["S_IN"].tolist() == [[0.0, 0.0]]
    assert null.inputs["READY"].tolist() == [[0.5]] and null.inputs["END"].tolist() == [[False]]
    assert null.inputs["ID"].tolist() == ([[b""]] if corrid == "TYPE_STRING" else [[0]])
    assert null.inputs["ID"].dtype == real.inputs["ID"].dtype
    assert (null.sequence, null.parameters, null.rows) == (None, {}, 1)
