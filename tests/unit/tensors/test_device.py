"""The GPU data path's host side, on the CPU (tests/gpu covers the CUDA side)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from nereid.tensors.device import DeviceInputs, DispatchTurns, outputs_to_host

torch = pytest.importorskip("torch")


def test_inputs_become_torch_tensors_on_the_cpu_with_their_values() -> None:
    ids = np.arange(12, dtype=np.int64).reshape(3, 4)
    moved = DeviceInputs("cpu")({"IDS": ids})
    assert isinstance(moved["IDS"], torch.Tensor)
    assert moved["IDS"].dtype == torch.int64 and moved["IDS"].device.type == "cpu"
    np.testing.assert_array_equal(moved["IDS"].numpy(), ids)


def test_a_read_only_input_is_copied_rather_than_shared() -> None:
    data = np.ones((2, 2), np.float32)
    data.flags.writeable = False  # a request's own bytes
    moved = DeviceInputs("cpu")({"X": data})
    moved["X"] += 1
    np.testing.assert_array_equal(data, np.ones((2, 2), np.float32))


def test_string_inputs_stay_numpy_object_arrays() -> None:
    text = np.array([[b"a"], [b"b"]], dtype=object)
    moved = DeviceInputs("cpu")({"TEXT": text, "N": np.zeros((2, 1), np.int32)})
    assert moved["TEXT"] is text
    assert isinstance(moved["N"], torch.Tensor)


def test_outputs_without_cuda_tensors_are_left_as_they_are() -> None:
    raw = {"A": np.zeros(2), "B": torch.ones(2)}
    assert outputs_to_host(raw) is raw
    assert outputs_to_host([1, 2]) == [1, 2]


def test_instances_on_one_cuda_device_share_one_turn_and_cpu_instances_take_none() -> None:
    turns = DispatchTurns()
    first, again, other = turns.turn("cuda:0"), turns.turn("cuda:0"), turns.turn("cuda:1")
    assert first is again and first is not other
    assert isinstance(first, type(threading.Lock()))
    with turns.turn("cpu"), turns.turn("cpu"):  # no lock: nests, never waits
        pass
    assert DispatchTurns().turn("cuda:0") is not first  # each model version's own
