"""Warmup samples: data built from [[model_warmup]] (zero, random, input_data_file in
Triton's raw format), batch dim prepended, and running them on every instance."""

from __future__ import annotations

import asyncio
import struct
import tomllib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

from nereid.config import ModelConfig, parse_model_config
from nereid.errors import ModelExecutionError, ModelLoadError, NereidError
from nereid.inference import InferRequest
from nereid.models.warmup import build_samples, run_warmup

pytestmark = pytest.mark.unit


def config(text: str, name: str = "m") -> ModelConfig:
    return parse_model_config(tomllib.loads(text), source=f"{name}/config.toml", folder_name=name)


BATCHING = """
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [4]
[[input]]
name = "IDS"
data_type = "TYPE_INT64"
dims = [2]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [4]
"""


def test_zero_data_gets_the_batch_dimension_when_the_model_batches(tmp_path: Path) -> None:
    cfg = config(
        BATCHING
        + """
[[model_warmup]]
name = "zeros"
batch_size = 3
count = 2
inputs.INPUT0 = { data_type = "TYPE_FP32", dims = [4], zero_data = true }
inputs.IDS = { data_type = "TYPE_INT64", dims = [2], zero_data = true }
"""
    )
    [sample] = build_samples(cfg, tmp_path, model_version=1)
    assert sample.label == "'zeros' (model_warmup[0])"
    assert sample.count == 2
    request = sample.request
    assert request.rows == 3
    assert request.model_name == "m" and request.model_version == 1
    assert request.inputs["INPUT0"].shape == (3, 4) and request.inputs["INPUT0"].dtype == np.float32
    assert request.inputs["IDS"].shape == (3, 2) and request.inputs["IDS"].dtype == np.int64
    assert not request.inputs["INPUT0"].any() and not request.inputs["IDS"].any()


def test_a_model_that_does_not_batch_gets_the_dims_as_they_are(tmp_path: Path) -> None:
    cfg = config(
        """
[[input]]
name = "X"
data_type = "TYPE_INT32"
dims = [2, 3]
[[output]]
name = "Y"
data_type = "TYPE_INT32"
dims = [2, 3]
[[model_warmup]]
inputs.X = { data_type = "TYPE_INT32", dims = [2, 3], zero_data = true }
"""
    )
    [sample] = build_samples(cfg, tmp_path)
    assert sample.label == "model_warmup[0]"
    assert sample.request.inputs["X"].shape == (2, 3)
    assert sample.request.rows == 1


def test_random_data_has_the_right_shape_type_and_range(tmp_path: Path) -> None:
    cfg = config(
        BATCHING
        + """
[[model_warmup]]
batch_size = 2
inputs.INPUT0 = { data_type = "TYPE_FP32", dims = [4], random_data = true }
inputs.IDS = { data_type = "TYPE_INT64", dims = [2], random_data = true }
"""
    )
    [sample] = build_samples(cfg, tmp_path, rng=np.random.default_rng(0))
    floats, ids = sample.request.inputs["INPUT0"], sample.request.inputs["IDS"]
    assert floats.shape == (2, 4) and floats.dtype == np.float32
    assert ((floats >= 0) & (floats < 1)).all()
    assert ids.dtype == np.int64 and ((ids >= 0) & (ids < 100)).all()
    # the batch repeats one sample, as Triton duplicates warmup inputs
    assert (floats[0] == floats[1]).all()


def test_input_data_file_is_read_as_raw_little_endian_bytes_from_the_warmup_folder(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "in0.bin").write_bytes(np.arange(4, dtype="<f4").tobytes())
    (tmp_path / "ids.bin").write_bytes(np.array([7, 9], dtype="<i8").tobytes() + b"extra is ignored")
    cfg = config(
        BATCHING
        + """
[[model_warmup]]
batch_size = 2
inputs.INPUT0 = { data_type = "TYPE_FP32", dims = [4], input_data_file = "in0.bin" }
inputs.IDS = { data_type = "TYPE_INT64", dims = [2], input_data_file = "ids.bin" }
"""
    )
    [sample] = build_samples(cfg, tmp_path)
    assert sample.request.inputs["INPUT0"].tolist() == [[0, 1, 2, 3]] * 2
    assert sample.request.inputs["IDS"].tolist() == [[7, 9]] * 2


STRINGS = """
max_batch_size = 4
[[input]]
name = "TEXT"
data_type = "TYPE_STRING"
dims = [2]
[[output]]
name = "OUT"
data_type = "TYPE_STRING"
dims = [2]
"""


def test_a_string_input_data_file_is_length_prefixed(tmp_path: Path) -> None:
    data = b"".join(struct.pack("<I", len(s)) + s for s in (b"hello", b""))
    (tmp_path / "text.bin").write_bytes(data)
    cfg = config(
        STRINGS
        + """
[[model_warmup]]
inputs.TEXT = { data_type = "TYPE_STRING", dims = [2], input_data_file = "text.bin" }
"""
    )
    [sample] = build_samples(cfg, tmp_path)
    text = sample.request.inputs["TEXT"]
    assert text.dtype == object and text.shape == (1, 2)
    assert text.tolist() == [[b"hello", b""]]


def test_string_zero_data_is_empty_strings_and_random_data_is_short_strings(tmp_path: Path) -> None:
    cfg = config(
        STRINGS
        + """
[[model_warmup]]
inputs.TEXT = { data_type = "TYPE_STRING", dims = [2], zero_data = true }
[[model_warmup]]
inputs.TEXT = { data_type = "TYPE_STRING", dims = [2], random_data = true }
"""
    )
    zero, random = build_samples(cfg, tmp_path)
    assert zero.request.inputs["TEXT"].tolist() == [[b"", b""]]
    assert all(isinstance(s, bytes) and 1 <= len(s) <= 8 for s in random.request.inputs["TEXT"].ravel())


def test_bool_input_data_file_reads_one_byte_per_element(tmp_path: Path) -> None:
    (tmp_path / "flags.bin").write_bytes(bytes([1, 0, 2]))
    cfg = config(
        """
[[input]]
name = "F"
data_type = "TYPE_BOOL"
dims = [3]
[[output]]
name = "G"
data_type = "TYPE_BOOL"
dims = [3]
[[model_warmup]]
inputs.F = { data_type = "TYPE_BOOL", dims = [3], input_data_file = "flags.bin" }
"""
    )
    [sample] = build_samples(cfg, tmp_path)
    assert sample.request.inputs["F"].tolist() == [True, False, True]


def file_config(file: str) -> ModelConfig:
    return config(
        BATCHING
        + f"""
[[model_warmup]]
inputs.INPUT0 = {{ data_type = "TYPE_FP32", dims = [4], input_data_file = "{file}" }}
inputs.IDS = {{ data_type = "TYPE_INT64", dims = [2], zero_data = true }}
"""
    )


def test_a_short_input_data_file_names_the_file_the_key_and_the_sizes(tmp_path: Path) -> None:
    (tmp_path / "short.bin").write_bytes(b"\0" * 12)
    with pytest.raises(ModelLoadError) as caught:
        build_samples(file_config("short.bin"), tmp_path)
    assert caught.value.reason == (
        f"{tmp_path / 'short.bin'}: model_warmup[0].inputs.INPUT0.input_data_file: "
        "expected at least 16 bytes (4 x FP32 for dims [4]), got 12"
    )


def test_a_missing_input_data_file_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as caught:
        build_samples(file_config("nope.bin"), tmp_path)
    reason = caught.value.reason
    assert reason.startswith(f"{tmp_path / 'nope.bin'}: model_warmup[0].inputs.INPUT0.input_data_file: file not found")
    assert str(tmp_path / "warmup") in reason


@pytest.mark.parametrize("file", ["../outside.bin", "/etc/passwd"])
def test_an_input_data_file_outside_the_model_folder_is_refused(tmp_path: Path, file: str) -> None:
    (tmp_path.parent / "outside.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError) as caught:
        build_samples(file_config(file), tmp_path)
    assert "expected a file name inside the model folder" in caught.value.reason


def test_a_truncated_string_file_names_the_element(tmp_path: Path) -> None:
    (tmp_path / "text.bin").write_bytes(struct.pack("<I", 5) + b"hello" + struct.pack("<I", 10) + b"abc")
    cfg = config(
        STRINGS
        + """
[[model_warmup]]
inputs.TEXT = { data_type = "TYPE_STRING", dims = [2], input_data_file = "text.bin" }
"""
    )
    with pytest.raises(ModelLoadError) as caught:
        build_samples(cfg, tmp_path)
    assert "model_warmup[0].inputs.TEXT.input_data_file: STRING element 1 declares 10 bytes" in caught.value.reason


def test_no_warmup_means_no_samples(tmp_path: Path) -> None:
    assert build_samples(config(BATCHING), tmp_path) == []


# -- running -------------------------------------------------------------------------------


class _Outcome:
    def __init__(self, error: NereidError | None) -> None:
        self.error = error


class FakeInstance:
    """Records the requests it runs; fails from run number ``fail_at`` on."""

    def __init__(self, name: str, fail_at: int | None = None) -> None:
        self.name = name
        self.fail_at = fail_at
        self.runs: list[Sequence[InferRequest]] = []

    async def run_batch(self, requests: Sequence[InferRequest]) -> Any:
        self.runs.append(requests)
        if self.fail_at is not None and len(self.runs) >= self.fail_at:
            return _Outcome(ModelExecutionError('model "m" raised in infer: ValueError: bad warmup'))
        return _Outcome(None)


def two_samples(tmp_path: Path) -> list[Any]:
    cfg = config(
        BATCHING
        + """
[[model_warmup]]
name = "first"
count = 3
inputs.INPUT0 = { data_type = "TYPE_FP32", dims = [4], zero_data = true }
inputs.IDS = { data_type = "TYPE_INT64", dims = [2], zero_data = true }
[[model_warmup]]
name = "second"
inputs.INPUT0 = { data_type = "TYPE_FP32", dims = [4], random_data = true }
inputs.IDS = { data_type = "TYPE_INT64", dims = [2], random_data = true }
"""
    )
    return build_samples(cfg, tmp_path)


def test_every_sample_runs_count_times_on_every_instance_one_request_per_run(tmp_path: Path) -> None:
    samples = two_samples(tmp_path)
    instances = [FakeInstance("m_0"), FakeInstance("m_1")]
    asyncio.run(run_warmup(samples, instances, "m"))
    for instance in instances:
        assert [len(run) for run in instance.runs] == [1, 1, 1, 1]
        sent = [run[0] for run in instance.runs]
        for request, sample in zip(sent, [samples[0]] * 3 + [samples[1]]):
            assert request.inputs.keys() == sample.request.inputs.keys()
            for name, array in request.inputs.items():
                np.testing.assert_array_equal(array, sample.request.inputs[name])
                assert array is not sample.request.inputs[name]  # a model may write into it
            assert request.rows == sample.request.rows


def test_a_failing_warmup_names_the_sample_the_instance_and_the_error(tmp_path: Path) -> None:
    samples = two_samples(tmp_path)
    instances = [FakeInstance("m_0"), FakeInstance("m_1", fail_at=4)]
    with pytest.raises(ModelLoadError) as caught:
        asyncio.run(run_warmup(samples, instances, "m"))
    assert caught.value.model == "m"
    assert caught.value.reason == (
        "warmup sample 'second' (model_warmup[1]) failed on instance m_1: "
        'model "m" raised in infer: ValueError: bad warmup'
    )
