#!/usr/bin/env python3
"""Triton's classic "simple" client flow against nereid: two INT32 vectors of 16 to the
``simple`` model, OUTPUT0 (their sum) asked for as binary data and OUTPUT1 (their
difference) as JSON; prints every sum and difference, checks them, prints PASS.

    python clients/simple_client.py --url 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="server host:port (default 127.0.0.1:8000)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the HTTP traffic")
    args = parser.parse_args()

    try:
        client = httpclient.InferenceServerClient(url=args.url, verbose=args.verbose)
    except Exception as exc:
        print(f"client creation failed: {exc}")
        return 1
    model_name = "simple"
    input0_data = np.arange(16, dtype=np.int32).reshape(1, 16)
    input1_data = np.ones((1, 16), dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(input0_data, binary_data=False)
    inputs[1].set_data_from_numpy(input1_data, binary_data=True)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    try:
        results = client.infer(model_name, inputs, outputs=outputs, query_params={"test_1": 1, "test_2": 2})
    except InferenceServerException as exc:
        print(f"inference failed: {exc}")
        return 1
    finally:
        client.close()

    response = results.get_response()
    print(f"model {response['model_name']} version {response['model_version']}")
    output0_data = results.as_numpy("OUTPUT0")
    output1_data = results.as_numpy("OUTPUT1")
    for i in range(16):
        a, b = int(input0_data[0][i]), int(input1_data[0][i])
        print(f"{a} + {b} = {int(output0_data[0][i])}")
        print(f"{a} - {b} = {int(output1_data[0][i])}")
        if a + b != output0_data[0][i]:
            print("sync infer error: incorrect sum")
            return 1
        if a - b != output1_data[0][i]:
            print("sync infer error: incorrect difference")
            return 1
    print("PASS: infer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
