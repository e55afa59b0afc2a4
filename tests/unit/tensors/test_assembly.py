"""batch.py: grouping by signature, assembling a batch, splitting outputs, request cost."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

from nereid.tensors.assembly import assemble, batch_signature, request_cost, signature_function, split
from nereid.config.schema import ModelConfig, ModelInput, ModelOutput
from nereid.errors import InternalError, ModelExecutionError
from nereid.inference import InferRequest
from tests.strategies import BatchWorkload, batch_workloads, datatype_named, identity_outputs

FP32 = datatype_named("FP32")
INT32 = datatype_named("INT32")
INT64 = datatype_named("INT64")
BYTES = datatype_named("BYTES")
BF16 = datatype_named("BF16")


def config(
    inputs: tuple[ModelInput, ...] = (ModelInput("INPUT0", FP32, (16,)),),
    outputs: tuple[ModelOutput, ...] = (ModelOutput("OUTPUT0", FP32, (16,)),),
    max_batch_size: int = 64,
) -> ModelConfig:
    return ModelConfig(name="m", max_batch_size=max_batch_size, input=inputs, output=outputs)


def request(rows: int = 1, **inputs: Any) -> InferRequest:
    return InferRequest(model_name="m", inputs=dict(inputs), rows=rows)


def fp32(*shape: int, start: float = 0.0) -> np.ndarray:
    return (np.arange(int(np.prod(shape)), dtype=np.float32) + start).reshape(shape)


# ---------------------------------------------------------------------------------------
# The round trip, as a property


def _check_round_trip(workload: BatchWorkload) -> None:
    cfg, requests = workload.config, workload.requests
    batch = assemble(requests, cfg)
    results = split(identity_outputs(batch), requests, cfg, "identity")

    assert len(results) == len(requests)
    for req, result in zip(requests, results):
        assert list(result) == [f"OUT_{name}" for name in batch]
        for name, sent in req.inputs.items():
            got = result[f"OUT_{name}"]
            spec = cfg.input_by_name(name)
            assert spec is not None
            assert got.dtype == sent.dtype
            assert got.shape[0] == req.rows
            own = (slice(None), *(slice(0, n) for n in sent.shape[1:]))
            assert np.array_equal(got[own], sent)
            if spec.pad_value is None:
                assert got.shape == sent.shape
            else:
                padding = np.ones(got.shape, dtype=bool)
                padding[own] = False
                expected = (
                    b"" if sent.dtype == object else np.asarray(spec.pad_value).astype(sent.dtype)
                )
                assert all(cell == expected for cell in got[padding])


@settings(deadline=None)
@given(batch_workloads())
def test_assemble_then_split_returns_each_request_its_own_rows_in_order(
    workload: BatchWorkload,
) -> None:
    _check_round_trip(workload)


@settings(deadline=None)
@given(batch_workloads())
def test_requests_that_fit_one_batch_share_one_signature(workload: BatchWorkload) -> None:
    signatures = {batch_signature(req, workload.config) for req in workload.requests}
    assert len(signatures) == 1


@settings(deadline=None)
@given(batch_workloads())
def test_the_per_model_signature_function_gives_batch_signature(workload: BatchWorkload) -> None:
    signature_of = signature_function(workload.config)
    for req in workload.requests:
        assert signature_of(req) == batch_signature(req, workload.config)


@pytest.mark.parametrize("max_batch_size", [0, 8])
@pytest.mark.parametrize("pad_value", [None, 0])
@pytest.mark.parametrize("present", [True, False])
def test_the_signature_function_of_one_input_matches_batch_signature(
    max_batch_size: int, pad_value: int | None, present: bool
) -> None:
    cfg = config(
        inputs=(ModelInput("INPUT0", FP32, (2, -1), pad_value=pad_value, optional=True),),
        max_batch_size=max_batch_size,
    )
    shape = (1, 2, 3) if max_batch_size else (2, 3)
    req = request(INPUT0=np.zeros(shape, np.float32)) if present else request()
    assert signature_function(cfg)(req) == batch_signature(req, cfg)


@settings(deadline=None)
@given(batch_workloads(max_requests=1))
def test_a_single_request_round_trips_without_a_copy(workload: BatchWorkload) -> None:
    (req,) = workload.requests
    batch = assemble(workload.requests, workload.config)
    (result,) = split(identity_outputs(batch), workload.requests, workload.config, "identity")
    for name, sent in req.inputs.items():
        assert batch[name] is sent
        assert result[f"OUT_{name}"] is sent


# ---------------------------------------------------------------------------------------
# batch_signature


@pytest.mark.parametrize(
    "dims, shape_a, shape_b",
    [
        pytest.param((16,), (1, 16), (1, 16), id="fixed dims"),
        pytest.param((-1,), (1, 7), (1, 7), id="variable dim, same length"),
        pytest.param((16,), (1, 16), (5, 16), id="rows differ (batch dim is not part of it)"),
    ],
)
def test_equal_non_batch_shapes_give_equal_signatures(
    dims: tuple[int, ...], shape_a: tuple[int, ...], shape_b: tuple[int, ...]
) -> None:
    cfg = config(inputs=(ModelInput("INPUT0", FP32, dims),))
    a = request(shape_a[0], INPUT0=np.zeros(shape_a, np.float32))
    b = request(shape_b[0], INPUT0=np.zeros(shape_b, np.float32))
    assert batch_signature(a, cfg) == batch_signature(b, cfg)
    assert hash(batch_signature(a, cfg)) == hash(batch_signature(b, cfg))


@pytest.mark.parametrize(
    "pad_value, same",
    [
        pytest.param(None, False, id="no pad_value: different"),
        pytest.param(0, True, id="pad_value: equal"),
    ],
)
def test_variable_dim_lengths_split_signatures_unless_the_input_pads(
    pad_value: int | None, same: bool
) -> None:
    cfg = config(inputs=(ModelInput("INPUT0", FP32, (2, -1), pad_value=pad_value),))
    a = request(INPUT0=np.zeros((1, 2, 3), np.float32))
    b = request(INPUT0=np.zeros((1, 2, 9), np.float32))
    assert (batch_signature(a, cfg) == batch_signature(b, cfg)) is same


def test_a_padded_input_with_only_variable_dims_always_shares_a_signature() -> None:
    cfg = config(inputs=(ModelInput("INPUT0", FP32, (-1, -1), pad_value=0),))
    a = request(INPUT0=np.zeros((1, 2, 3), np.float32))
    b = request(INPUT0=np.zeros((1, 5, 9), np.float32))
    assert batch_signature(a, cfg) == batch_signature(b, cfg)


def test_an_optional_input_present_or_absent_gives_different_signatures() -> None:
    cfg = config(
        inputs=(ModelInput("INPUT0", FP32, (4,)), ModelInput("MASK", FP32, (4,), optional=True))
    )
    with_mask = request(INPUT0=np.zeros((1, 4), np.float32), MASK=np.ones((1, 4), np.float32))
    without = request(INPUT0=np.zeros((1, 4), np.float32))
    assert batch_signature(with_mask, cfg) != batch_signature(without, cfg)


def test_signature_does_not_depend_on_the_order_inputs_arrived_in() -> None:
    cfg = config(inputs=(ModelInput("A", FP32, (2,)), ModelInput("B", FP32, (3,))))
    a, b = np.zeros((1, 2), np.float32), np.zeros((1, 3), np.float32)
    assert batch_signature(request(A=a, B=b), cfg) == batch_signature(request(B=b, A=a), cfg)


def test_a_non_batching_model_signs_the_full_shape() -> None:
    cfg = config(inputs=(ModelInput("INPUT0", FP32, (-1, 4)),), max_batch_size=0)
    a = request(INPUT0=np.zeros((2, 4), np.float32))
    b = request(INPUT0=np.zeros((3, 4), np.float32))
    assert batch_signature(a, cfg) != batch_signature(b, cfg)


# ---------------------------------------------------------------------------------------
# assemble


def test_assemble_concatenates_inputs_in_request_order() -> None:
    cfg = config()
    reqs = [request(INPUT0=fp32(1, 16)), request(2, INPUT0=fp32(2, 16, start=100))]
    batch = assemble(reqs, cfg)
    assert np.array_equal(batch["INPUT0"], np.concatenate([fp32(1, 16), fp32(2, 16, start=100)]))


def test_assemble_pads_shorter_requests_at_the_end_of_each_variable_dim() -> None:
    cfg = config(inputs=(ModelInput("IDS", INT64, (-1, -1), pad_value=-1),))
    a = np.array([[[1, 2], [3, 4]]], dtype=np.int64)  # [1, 2, 2]
    b = np.array([[[5, 6, 7]]], dtype=np.int64)  # [1, 1, 3]
    batch = assemble([request(IDS=a), request(IDS=b)], cfg)
    assert batch["IDS"].tolist() == [
        [[1, 2, -1], [3, 4, -1]],
        [[5, 6, 7], [-1, -1, -1]],
    ]


def test_pad_value_is_cast_to_the_input_dtype() -> None:
    cfg = config(inputs=(ModelInput("IDS", INT32, (-1,), pad_value=2.75),))
    a = np.array([[1, 2, 3]], dtype=np.int32)
    b = np.array([[4]], dtype=np.int32)
    batch = assemble([request(IDS=a), request(IDS=b)], cfg)
    assert batch["IDS"].dtype == np.int32
    assert batch["IDS"].tolist() == [[1, 2, 3], [4, 2, 2]]


def test_bytes_inputs_pad_with_empty_bytes() -> None:
    cfg = config(inputs=(ModelInput("TEXT", BYTES, (-1,), pad_value=0),))
    a = np.array([[b"a", b"b"]], dtype=object)
    b = np.array([[b"c"]], dtype=object)
    batch = assemble([request(TEXT=a), request(TEXT=b)], cfg)
    assert batch["TEXT"].dtype == object
    assert batch["TEXT"].tolist() == [[b"a", b"b"], [b"c", b""]]


def test_assemble_of_one_request_returns_its_own_arrays() -> None:
    array = fp32(3, 16)
    (batch_array,) = assemble([request(3, INPUT0=array)], config()).values()
    assert batch_array is array


@pytest.mark.parametrize(
    "requests, max_batch_size, message",
    [
        pytest.param([], 64, "assemble() needs at least one request", id="no requests"),
        pytest.param(
            [request(INPUT0=fp32(16)), request(INPUT0=fp32(16))],
            0,
            'model "m" does not batch, but assemble() got 2 requests',
            id="two requests for a non-batching model",
        ),
    ],
)
def test_assemble_refuses_batches_the_batcher_must_never_form(
    requests: list[InferRequest], max_batch_size: int, message: str
) -> None:
    with pytest.raises(InternalError) as info:
        assemble(requests, config(max_batch_size=max_batch_size))
    assert str(info.value) == message


# ---------------------------------------------------------------------------------------
# split: conversions


def test_split_gives_each_request_views_of_its_rows() -> None:
    reqs = [request(2), request(1), request(3)]
    out = fp32(6, 16)
    results = split({"OUTPUT0": out}, reqs, config(), "m")
    assert [r["OUTPUT0"].shape for r in results] == [(2, 16), (1, 16), (3, 16)]
    assert np.array_equal(np.concatenate([r["OUTPUT0"] for r in results]), out)
    assert all(np.shares_memory(r["OUTPUT0"], out) for r in results)


def test_split_keeps_the_order_the_model_returned_outputs_in() -> None:
    cfg = config(outputs=(ModelOutput("A", FP32, (1,)), ModelOutput("B", FP32, (1,))))
    results = split({"B": fp32(2, 1), "A": fp32(2, 1)}, [request(), request()], cfg, "m")
    assert [list(r) for r in results] == [["B", "A"], ["B", "A"]]


def test_a_model_may_return_a_subset_of_its_config_outputs() -> None:
    cfg = config(outputs=(ModelOutput("A", FP32, (1,)), ModelOutput("B", FP32, (1,))))
    assert split({}, [request(), request()], cfg, "m") == [{}, {}]


@pytest.mark.parametrize(
    "value, expected_dtype",
    [
        pytest.param(np.ones((2, 16), np.float64), np.float32, id="float64 -> FP32"),
        pytest.param(np.ones((2, 16), np.int64), np.float32, id="int64 -> FP32"),
        pytest.param(np.ones((2, 16), np.float16), np.float32, id="float16 -> FP32"),
    ],
)
def test_numeric_outputs_are_cast_to_the_config_dtype_when_same_kind(
    value: np.ndarray, expected_dtype: type
) -> None:
    results = split({"OUTPUT0": value}, [request(), request()], config(), "m")
    assert [r["OUTPUT0"].dtype for r in results] == [np.dtype(expected_dtype)] * 2
    assert np.array_equal(np.concatenate([r["OUTPUT0"] for r in results]), value)


def test_torch_tensor_outputs_are_converted_to_numpy() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.arange(32, dtype=torch.float32, requires_grad=True).reshape(2, 16) * 2
    results = split({"OUTPUT0": tensor}, [request(), request()], config(), "m")
    assert all(type(r["OUTPUT0"]) is np.ndarray for r in results)
    assert np.array_equal(np.concatenate([r["OUTPUT0"] for r in results]), tensor.detach().numpy())


def test_torch_float64_tensors_are_cast_like_numpy_arrays() -> None:
    torch = pytest.importorskip("torch")
    (result,) = split(
        {"OUTPUT0": torch.ones(1, 16, dtype=torch.float64)}, [request()], config(), "m"
    )
    assert result["OUTPUT0"].dtype == np.float32


def test_torch_bfloat16_tensors_become_bf16_arrays() -> None:
    torch = pytest.importorskip("torch")
    cfg = config(outputs=(ModelOutput("OUTPUT0", BF16, (2,)),))
    tensor = torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16)
    (result,) = split({"OUTPUT0": tensor}, [request()], cfg, "m")
    assert result["OUTPUT0"].dtype == BF16.numpy
    assert result["OUTPUT0"].astype(np.float32).tolist() == [[1.5, -2.0]]


@pytest.mark.parametrize(
    "value, per_request",
    [
        pytest.param([["héllo"], [b"raw"]], [[[b"h\xc3\xa9llo"]], [[b"raw"]]], id="lists of str and bytes"),
        pytest.param([["a", "b"], ["c", "d"]], [[[b"a", b"b"]], [[b"c", b"d"]]], id="nested lists"),
        pytest.param((("a",), ("b",)), [[[b"a"]], [[b"b"]]], id="tuples"),
        pytest.param(np.array([["a"], ["b"]]), [[[b"a"]], [[b"b"]]], id="numpy str array"),
        pytest.param(np.array([[b"a"], [b"b"]]), [[[b"a"]], [[b"b"]]], id="numpy bytes array"),
        pytest.param(np.array([["a"], [b"b"]], dtype=object), [[[b"a"]], [[b"b"]]], id="object array"),
    ],
)
def test_string_outputs_become_object_arrays_of_bytes(value: Any, per_request: list[Any]) -> None:
    cfg = config(outputs=(ModelOutput("TEXT", BYTES, (-1,)),))
    results = split({"TEXT": value}, [request(), request()], cfg, "m")
    assert [r["TEXT"].dtype for r in results] == [np.dtype(object)] * 2
    assert [r["TEXT"].tolist() for r in results] == per_request
    assert all(type(item) is bytes for r in results for item in r["TEXT"].flat)


def test_a_flat_string_list_for_dims_1_names_the_shape_it_should_have() -> None:
    cfg = config(outputs=(ModelOutput("TEXT", BYTES, (1,)),))
    with pytest.raises(ModelExecutionError) as caught:
        split({"TEXT": ["a", "b"]}, [request(), request()], cfg, "m")
    assert caught.value.message == (
        'model "m", output "TEXT": expected shape [2, 1] ([batch 2] + dims [1]), got [2] '
        "(a STRING output is a nested list or object array of that shape, e.g. [[s] for s in texts] for dims [1])"
    )


@pytest.mark.parametrize(
    "dims, shape",
    [
        pytest.param((16,), (1, 8), id="short dim"),
        pytest.param((16,), (1, 16, 1), id="extra dim"),
        pytest.param((16,), (1,), id="missing dim"),
        pytest.param((-1, 4), (1, 3, 5), id="fixed dim after a wildcard"),
    ],
)
def test_an_output_whose_shape_differs_from_its_dims_fails_the_batch(dims: tuple[int, ...], shape: tuple[int, ...]) -> None:
    cfg = config(outputs=(ModelOutput("OUTPUT0", FP32, dims),))
    with pytest.raises(ModelExecutionError) as caught:
        split({"OUTPUT0": np.zeros(shape, np.float32)}, [request()], cfg, "m")
    assert caught.value.message == (
        f'model "m", output "OUTPUT0": expected shape {[1, *dims]} ([batch 1] + dims {list(dims)}), got {list(shape)}'
    )


@pytest.mark.parametrize("shape", [(2, 5, 4), (2, 1, 4), (2, 0, 4)])
def test_wildcard_dims_take_any_size(shape: tuple[int, ...]) -> None:
    cfg = config(outputs=(ModelOutput("OUTPUT0", FP32, (-1, 4)),))
    results = split({"OUTPUT0": np.zeros(shape, np.float32)}, [request(), request()], cfg, "m")
    assert [r["OUTPUT0"].shape for r in results] == [(1, *shape[1:])] * 2


def test_an_output_in_its_reshape_shape_is_reshaped_to_its_dims() -> None:
    """Triton's [batch] idiom: dims [1] with an empty reshape; the model returns [rows]."""
    cfg = config(outputs=(ModelOutput("OUTPUT0", FP32, (1,), reshape=()),))
    results = split({"OUTPUT0": np.array([1.0, 2.0], np.float32)}, [request(), request()], cfg, "m")
    assert [r["OUTPUT0"].tolist() for r in results] == [[[1.0]], [[2.0]]]
    same = split({"OUTPUT0": np.array([[1.0], [2.0]], np.float32)}, [request(), request()], cfg, "m")
    assert [r["OUTPUT0"].tolist() for r in same] == [[[1.0]], [[2.0]]]


def test_a_reshape_mismatch_names_both_shapes() -> None:
    cfg = config(outputs=(ModelOutput("OUTPUT0", FP32, (4,), reshape=(2, 2)),))
    with pytest.raises(ModelExecutionError) as caught:
        split({"OUTPUT0": np.zeros((1, 3), np.float32)}, [request()], cfg, "m")
    assert caught.value.message == (
        'model "m", output "OUTPUT0": expected shape [1, 4] ([batch 1] + dims [4]) '
        "or [1, 2, 2] ([batch 1] + reshape [2, 2]), got [1, 3]"
    )


def test_a_non_batching_model_output_is_checked_against_its_dims() -> None:
    cfg = config(outputs=(ModelOutput("OUTPUT0", FP32, (2, -1)),), max_batch_size=0)
    (result,) = split({"OUTPUT0": np.zeros((2, 7), np.float32)}, [request()], cfg, "m")
    assert result["OUTPUT0"].shape == (2, 7)
    with pytest.raises(ModelExecutionError) as caught:
        split({"OUTPUT0": np.zeros((7,), np.float32)}, [request()], cfg, "m")
    assert caught.value.message == 'model "m", output "OUTPUT0": expected shape [2, -1] (dims [2, -1]), got [7]'


def test_a_non_batching_model_gets_its_outputs_whole() -> None:
    cfg = config(outputs=(ModelOutput("OUTPUT0", FP32, (-1,)),), max_batch_size=0)
    out = fp32(5)
    (result,) = split({"OUTPUT0": out}, [request()], cfg, "m")
    assert result["OUTPUT0"] is out


@pytest.mark.parametrize(
    "requests, max_batch_size, message",
    [
        pytest.param([], 64, "split() needs at least one request", id="no requests"),
        pytest.param(
            [request(), request()],
            0,
            'model "m" does not batch, but split() got 2 requests',
            id="two requests for a non-batching model",
        ),
    ],
)
def test_split_refuses_batches_the_batcher_must_never_form(
    requests: list[InferRequest], max_batch_size: int, message: str
) -> None:
    with pytest.raises(InternalError) as info:
        split({"OUTPUT0": fp32(16)}, requests, config(max_batch_size=max_batch_size), "m")
    assert str(info.value) == message


# ---------------------------------------------------------------------------------------
# split: errors


TWO_OUTPUTS = config(outputs=(ModelOutput("A", FP32, (16,)), ModelOutput("B", INT32, (16,))))
STRING_OUTPUT = config(outputs=(ModelOutput("TEXT", BYTES, (1,)),))


@pytest.mark.parametrize(
    "cfg, outputs, message",
    [
        pytest.param(
            TWO_OUTPUTS,
            {"A": fp32(5, 16), "B": np.zeros((4, 16), np.int32)},
            'model "m", output "B": expected axis 0 of length 5 (the batch), got shape [4, 16]',
            id="axis 0 is not the batch",
        ),
        pytest.param(
            TWO_OUTPUTS,
            {"A": np.float32(1.0)},
            'model "m", output "A": expected a numpy array or torch tensor, got float32',
            id="numpy scalar",
        ),
        pytest.param(
            TWO_OUTPUTS,
            {"A": np.array(1.0, np.float32)},
            'model "m", output "A": expected axis 0 of length 5 (the batch), got shape []',
            id="0-d array",
        ),
        pytest.param(
            TWO_OUTPUTS,
            {"A": fp32(5, 16), "X": fp32(5, 16)},
            'model "m" returned output "X" that is not in its config (config outputs: ["A", "B"])',
            id="unknown output",
        ),
        pytest.param(
            TWO_OUTPUTS,
            [fp32(5, 16)],
            'model "m": expected a dict of output name -> array, got list',
            id="not a dict",
        ),
        pytest.param(
            TWO_OUTPUTS,
            None,
            'model "m": expected a dict of output name -> array, got NoneType',
            id="None",
        ),
        pytest.param(
            TWO_OUTPUTS,
            {"B": fp32(5, 16)},
            'model "m", output "B": expected data type INT32, got FP32',
            id="float into an int output",
        ),
        pytest.param(
            TWO_OUTPUTS,
            {"A": np.ones((5, 16), np.complex64)},
            'model "m", output "A": expected data type FP32, got complex64',
            id="complex into a float output",
        ),
        pytest.param(
            TWO_OUTPUTS,
            {"A": [1.0] * 5},
            'model "m", output "A": expected a numpy array or torch tensor, got list',
            id="list for a numeric output",
        ),
        pytest.param(
            TWO_OUTPUTS,
            {"A": np.array(["x"] * 5)},
            'model "m", output "A": expected data type FP32, got BYTES',
            id="strings for a numeric output",
        ),
        pytest.param(
            STRING_OUTPUT,
            {"TEXT": fp32(5, 1)},
            'model "m", output "TEXT": expected data type BYTES, got FP32',
            id="numbers for a string output",
        ),
        pytest.param(
            STRING_OUTPUT,
            {"TEXT": "hello"},
            'model "m", output "TEXT": expected a sequence of str or bytes (one per row), '
            "got a single str",
            id="a single str for a string output",
        ),
        pytest.param(
            STRING_OUTPUT,
            {"TEXT": ["a", 1, "b", "c", "d"]},
            'model "m", output "TEXT": expected str or bytes elements, got int',
            id="a non-string element",
        ),
        pytest.param(
            STRING_OUTPUT,
            {"TEXT": 42},
            'model "m", output "TEXT": expected a numpy array or a sequence of str or bytes, '
            "got int",
            id="an int for a string output",
        ),
    ],
)
def test_split_rejects_outputs_that_do_not_fit_the_config(
    cfg: ModelConfig, outputs: Any, message: str
) -> None:
    reqs = [request(2), request(3)]
    with pytest.raises(ModelExecutionError) as info:
        split(outputs, reqs, cfg, "m")
    assert str(info.value) == message
    assert info.value.model == "m"


def test_split_checks_axis_0_of_a_single_request_too() -> None:
    with pytest.raises(ModelExecutionError) as info:
        split({"OUTPUT0": fp32(4, 16)}, [request(3)], config(), "m")
    assert str(info.value) == (
        'model "m", output "OUTPUT0": expected axis 0 of length 3 (the batch), got shape [4, 16]'
    )


# ---------------------------------------------------------------------------------------
# request_cost


def test_a_request_costs_its_rows_by_default() -> None:
    assert request_cost(request(7, INPUT0=fp32(7, 16)), None) == 7


@pytest.mark.parametrize(
    "returned", [pytest.param(12, id="int"), pytest.param(np.int64(12), id="numpy int")]
)
def test_a_request_costs_what_the_models_batch_size_returns(returned: Any) -> None:
    cost = request_cost(request(1, IDS=np.zeros((1, 12))), lambda inputs: returned)
    assert cost == 12
    assert type(cost) is int


@pytest.mark.parametrize(
    "returned, got",
    [
        pytest.param(0, "0 (int)", id="zero"),
        pytest.param(-3, "-3 (int)", id="negative"),
        pytest.param(2.5, "2.5 (float)", id="float"),
        pytest.param(True, "True (bool)", id="bool"),
        pytest.param("3", "'3' (str)", id="str"),
        pytest.param(None, "None (NoneType)", id="None"),
    ],
)
def test_batch_size_must_return_a_positive_int(returned: Any, got: str) -> None:
    with pytest.raises(ModelExecutionError) as info:
        request_cost(request(INPUT0=fp32(1, 16)), lambda inputs: returned)
    assert str(info.value) == (
        f'model "m", Model.batch_size(inputs): expected a positive int, got {got}'
    )


def test_an_exception_in_batch_size_becomes_a_model_execution_error() -> None:
    def batch_size(inputs: dict[str, np.ndarray]) -> int:
        raise KeyError("IDS")

    with pytest.raises(ModelExecutionError) as info:
        request_cost(request(INPUT0=fp32(1, 16)), batch_size)
    assert str(info.value) == "model \"m\", Model.batch_size(inputs) raised KeyError: 'IDS'"
    assert isinstance(info.value.__cause__, KeyError)
