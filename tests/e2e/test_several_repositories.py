"""``--model-repository`` given twice, as with tritonserver: the models of both folders
served together over HTTP and gRPC, listed in one index, loaded on request or by polling
from either folder; a model name in both refused at start, naming both folders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import nereid

from tests.conftest import ROOT, RepoBuilder, RunningServer
from tests.e2e.test_model_control import CONFIG, adder, added, index, wait_for


def second_repository(tmp_path: Path) -> RepoBuilder:
    root = tmp_path / "more_models"
    root.mkdir()
    return RepoBuilder(root)


def grpc_infer(server: RunningServer, model: str) -> np.ndarray:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    finally:
        client.close()
    assert result is not None
    return np.asarray(result) - data


def test_two_repositories_serve_the_models_of_both(serve, repo: RepoBuilder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    more = second_repository(tmp_path)
    repo.add("first", CONFIG, adder(1))
    more.add("second", CONFIG, adder(2))
    server = serve(repo.root, "--model-repository", str(more.root))

    assert (added(server, "first"), added(server, "second")) == (1, 2)
    assert grpc_infer(server, "second").ravel().tolist() == [2.0] * 4

    assert sorted(index(server)) == ["first", "second"]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        rows = grpc.get_model_repository_index(as_json=True)["models"]
    finally:
        grpc.close()
    assert sorted((row["name"], row["state"]) for row in rows) == [("first", "READY"), ("second", "READY")]
    assert f"nereid serving {repo.root}, {more.root} on" in server.log()


def test_a_model_name_in_two_repositories_is_one_line_and_exit_2(repo: RepoBuilder, tmp_path: Path) -> None:
    more = second_repository(tmp_path)
    repo.add("twice", CONFIG, adder(1))
    more.add("twice", CONFIG, adder(2))
    more.add("once", CONFIG, adder(3))
    result = subprocess.run(
        [sys.executable, "-m", "nereid", "serve", "--model-repository", str(repo.root), "--model-repository", str(more.root)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "nereid: --model-repository: model 'twice' is not unique across all model repositories: "
        f"{repo.root / 'twice'} and {more.root / 'twice'}\n"
    )


def test_explicit_load_finds_a_model_in_the_second_repository(serve, repo: RepoBuilder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    more = second_repository(tmp_path)
    repo.add("first", CONFIG, adder(1))
    more.add("second", CONFIG, adder(2))
    server = serve(repo.root, "--model-repository", str(more.root), "--model-control-mode", "explicit")
    assert index(server) == {"first": [{"name": "first"}], "second": [{"name": "second"}]}

    client = httpclient.InferenceServerClient(server.url)
    try:
        client.load_model("second")
    finally:
        client.close()
    assert added(server, "second") == 2
    assert index(server)["second"] == [{"name": "second", "version": "1", "state": "READY"}]


def test_poll_mode_picks_up_a_new_model_in_the_second_repository(serve, repo: RepoBuilder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    more = second_repository(tmp_path)
    repo.add("first", CONFIG, adder(1))
    server = serve(repo.root, "--model-repository", str(more.root), "--model-control-mode", "poll",
                   "--repository-poll-secs", "0.2")
    assert added(server, "first") == 1

    more.add("second", CONFIG, adder(2))
    wait_for(lambda: index(server).get("second") == [{"name": "second", "version": "1", "state": "READY"}],
             what="second READY")
    assert added(server, "second") == 2


def test_from_python_server_takes_a_list_and_serve_refuses_a_duplicate(repo: RepoBuilder, tmp_path: Path) -> None:
    more = second_repository(tmp_path)
    repo.add("first", CONFIG, adder(1))
    more.add("second", CONFIG, adder(2))
    data = np.zeros((1, 4), np.float32)
    with nereid.Server([repo.root, more.root]) as server:
        assert server.infer("second", {"INPUT0": data})["OUTPUT0"].tolist() == [[2.0] * 4]
        assert server.infer("first", {"INPUT0": data})["OUTPUT0"].tolist() == [[1.0] * 4]

    more.add("first", CONFIG, adder(3))
    why = f"model 'first' is not unique across all model repositories: {repo.root / 'first'} and {more.root / 'first'}"
    with pytest.raises(ValueError) as caught:
        nereid.serve([repo.root, more.root], http_port=0)
    assert str(caught.value) == f"nereid.serve(): model_repository: {why}"
    with nereid.Server([repo.root, more.root]) as server:
        [row] = [entry for entry in server.models() if entry.name == "first"]
        assert (row.state, row.reason) == ("UNAVAILABLE", why)
