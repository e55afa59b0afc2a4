"""nereid's Python equivalent of the simple_sequence model that Triton's sequence client
examples (simple_*_sequence_*_client.py) call: for each ready step, OUTPUT is INPUT plus
the START control (1 on a sequence's first request, else 0), the values those clients
expect. START and READY are control inputs the sequence batcher fills."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            output = ((value + start) * ready).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", output)]))
        return responses
