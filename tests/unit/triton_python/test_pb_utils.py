"""nereid's triton_python_backend_utils: the helpers a Triton model calls, and the
TritonModel adapter's answers (per-request errors, a wrong number of responses)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nereid.context import ModelContext
from nereid.errors import InvalidInputError, ModelExecutionError, UnavailableError
from nereid.inference import InferRequest
from nereid.triton_python import pb_utils
from nereid.triton_python.adapter import TritonModel

CONFIG = {
    "name": "m", "max_batch_size": 4,
    "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [2]}],
    "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [2]}],
}


def context(config: dict[str, Any] = CONFIG) -> ModelContext:
    return ModelContext(model_name="m", model_version=3, instance_name="m_0", device="cpu", kind="CPU",
                        config=config, parameters={}, model_dir=Path("/repo/m/3"))


def test_config_helpers_and_dtypes() -> None:
    assert pb_utils.get_input_config_by_name(CONFIG, "IN") == CONFIG["input"][0]
    assert pb_utils.get_output_config_by_name(CONFIG, "nope") is None
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.numpy_to_triton_type(np.int32) == 8 and pb_utils.triton_to_numpy_type(13) is np.object_
    assert not pb_utils.using_decoupled_model_transaction_policy(CONFIG)


def test_byte_tensors_round_trip_in_tritons_layout() -> None:
    items = np.array([b"a", b"", "ünï".encode()], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(items)
    assert encoded is not None and encoded.tobytes()[:5] == b"\x01\x00\x00\x00a"
    assert list(pb_utils.deserialize_bytes_tensor(encoded.tobytes())) == list(items)
    assert pb_utils.Tensor("S", np.array(["x", "y"])).as_numpy().tolist() == [b"x", b"y"]


def test_model_config_setters_follow_tritons_rules() -> None:
    config = pb_utils.ModelConfig({"name": "m", "max_batch_size": 8})
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8, but in auto-complete-config "
                                         "function for model 'm' specified max_batch_size 4"):
        config.set_max_batch_size(4)
    config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [2]})
    config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [2]})  # the same again: no change
    assert len(config.as_dict()["input"]) == 1
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_INT32 for input 'IN', model provides "
                                         "TYPE_FP32"):
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2]})
    with pytest.raises(ValueError, match="contains property other than"):
        config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [2], "reshape": {}})
    with pytest.raises(ValueError, match="is missing 'dims' property"):
        config.add_output({"name": "OUT", "data_type": "TYPE_INT32"})
    config.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        config.set_model_transaction_policy({"decoupled": False})


class Echo:
    def initialize(self, args: dict[str, str]) -> None:
        self.args = args

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse]:
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()  # type: ignore[union-attr]
            if (data < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "negative", pb_utils.TritonError.INVALID_ARG if data[0, 0] == -1 else pb_utils.TritonError.UNAVAILABLE)))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data * 2)]))
        return responses


def request(value: int) -> InferRequest:
    return InferRequest(model_name="m", inputs={"IN": np.full((1, 2), value, np.int32)}, rows=1, id=str(value))


def test_the_adapter_answers_each_request_on_its_own() -> None:
    model = TritonModel(Echo, context())
    assert model.model.args["model_repository"] == "/repo/m" and model.model.args["model_version"] == "3"
    answers = model.execute([request(1), request(-1), request(-2)])
    np.testing.assert_array_equal(answers[0]["OUT"], np.full((1, 2), 2, np.int32))  # type: ignore[index]
    assert isinstance(answers[1], InvalidInputError) and answers[1].message == "negative"
    assert isinstance(answers[2], UnavailableError)


def test_execute_must_answer_every_request() -> None:
    class Short(Echo):
        def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse]:
            return super().execute(requests)[:1]

    with pytest.raises(ModelExecutionError, match=r"execute must return one InferenceResponse per request \(2\), got 1"):
        TritonModel(Short, context()).execute([request(1), request(2)])


def test_a_decoupled_model_sends_through_each_requests_sender() -> None:
    class Steps:
        def execute(self, requests: list[pb_utils.InferenceRequest]) -> None:
            for request in requests:
                sender = request.get_response_sender()
                data = request.inputs()[0].as_numpy()
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    sent: list[tuple[int, Any, bool]] = []
    decoupled = dict(CONFIG, model_transaction_policy={"decoupled": True})
    TritonModel(Steps, context(decoupled)).execute_decoupled(
        [request(5), request(6)], lambda index, answer, final: sent.append((index, answer, final)), lambda _: False)
    assert [(index, final) for index, _, final in sent] == [(0, False), (0, True), (1, False), (1, True)]
    assert sent[1][1] is None and int(sent[2][1]["OUT"][0, 0]) == 6


def test_bls_without_a_server_says_so() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="BLS is not available here"):
        pb_utils.InferenceRequest(model_name="other", inputs=[], requested_output_names=[]).exec()
