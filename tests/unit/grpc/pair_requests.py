"""The "pair" model and its gRPC requests, shared by the unit tests of grpc/infer.py and
grpc/infer_messages.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from nereid.config import load_model_config
from nereid.tensors.tables import ModelTables

CONFIG = """
name = "pair"
max_batch_size = 4

[[input]]
name = "INPUT0"
data_type = "TYPE_INT32"
dims = [4]

[[input]]
name = "INPUT1"
data_type = "TYPE_FP32"
dims = [2]

[[output]]
name = "OUTPUT0"
data_type = "TYPE_INT32"
dims = [4]

[[output]]
name = "OUTPUT1"
data_type = "TYPE_FP32"
dims = [2]
"""

A = np.arange(4, dtype=np.int32).reshape(1, 4)
B = np.array([[0.5, 1.5]], dtype=np.float32)


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> ModelTables:
    path = tmp_path_factory.mktemp("pair") / "config.toml"
    path.write_text(CONFIG)
    return ModelTables.for_config(load_model_config(path, "pair"))


def raw_request(**fields: Any) -> Any:
    message = service_pb2.ModelInferRequest(model_name="pair", **fields)
    message.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 4])
    message.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 2])
    message.raw_input_contents.extend([A.tobytes(), B.tobytes()])
    return message


def typed_request() -> Any:
    message = service_pb2.ModelInferRequest(model_name="pair", id="typed")
    first = message.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 4])
    first.contents.int_contents.extend(A.ravel().tolist())
    second = message.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 2])
    second.contents.fp32_contents.extend(B.ravel().tolist())
    return message
