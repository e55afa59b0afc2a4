"""Model control seen from outside: explicit load / unload / reload with stock
tritonclient, config overrides, poll mode following the folder, reloads under load,
refused names, warmup, and readiness that tells the truth.

Under ``make test``'s ``--workers 2`` pass only the tests marked ``workers_sensitive`` run
again: those where a front-end worker's view of a model must follow the main process's
(loads, unloads, reloads with another config, poll mode, readiness while loading, an
unload draining requests a worker forwarded, raw paths a worker routes). The others
exercise the model manager, whose answers a worker forwards as it forwards any other.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.conftest import IDENTITY_CONFIG, RepoBuilder, RunningServer
from tests.waiting import MODEL_GATE, WAIT_TIMEOUT_S, wait_until, wait_until_async

CONFIG = IDENTITY_CONFIG + """\
[dynamic_batching]
max_queue_delay_microseconds = 500
"""

#: OUTPUT0 = INPUT0 + VALUE: each version of a model tells who answered.
ADDER = """
import time
import numpy as np

VALUE = {value}

class Model:
    def __init__(self, context):
        time.sleep({init_secs})

    def infer(self, inputs):
        time.sleep({infer_secs})
        return {{"OUTPUT0": inputs["INPUT0"] + np.float32(VALUE)}}
"""


def adder(value: float, *, init_secs: float = 0.0, infer_secs: float = 0.0) -> str:
    return ADDER.format(value=value, init_secs=init_secs, infer_secs=infer_secs)


def set_value(folder: Path, value: float, **kwargs: float) -> None:
    (folder / "model.py").write_text(adder(value, **kwargs))


def client(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


def infer(server: RunningServer, model: str, data: np.ndarray | None = None) -> np.ndarray:
    data = np.arange(4, dtype=np.float32).reshape(1, 4) if data is None else data
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    c = client(server)
    try:
        result = c.infer(model, [tensor]).as_numpy("OUTPUT0")
    finally:
        c.close()
    assert result is not None
    return np.asarray(result)


def added(server: RunningServer, model: str) -> float:
    """What the serving version adds to its input (its VALUE)."""
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    values = set((infer(server, model, data) - data).ravel().tolist())
    assert len(values) == 1, values
    return float(values.pop())


def index(server: RunningServer) -> dict[str, list[dict[str, str]]]:
    c = client(server)
    try:
        rows = c.get_model_repository_index()
    finally:
        c.close()
    by_name: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_name.setdefault(row["name"], []).append(row)
    return by_name


def load(server: RunningServer, model: str, config: str | None = None) -> None:
    c = client(server)
    try:
        c.load_model(model, config=config)
    finally:
        c.close()


def unload(server: RunningServer, model: str) -> None:
    c = client(server)
    try:
        c.unload_model(model)
    finally:
        c.close()


def ready(server: RunningServer, model: str | None = None) -> bool:
    c = client(server)
    try:
        return bool(c.is_model_ready(model) if model else c.is_server_ready())
    finally:
        c.close()


def wait_for(condition: Callable[[], Any], timeout: float = WAIT_TIMEOUT_S, what: str = "condition") -> Any:
    return wait_until(condition, what, timeout=timeout, every=0.05)


def raw_post(server: RunningServer, path: str, body: bytes = b"") -> tuple[int, str]:
    """POST with the path sent byte for byte (no client-side normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Length": str(len(body))})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


# -- explicit mode ---------------------------------------------------------------------------


def test_explicit_mode_loads_only_the_named_models(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("a", CONFIG, adder(1))
    repo.add("b", CONFIG, adder(2))
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "a")
    assert ready(server, "a") and not ready(server, "b")
    rows = index(server)
    assert rows["a"] == [{"name": "a", "version": "1", "state": "READY"}]
    assert rows["b"] == [{"name": "b"}]  # in the repository, never loaded: name only
    status, body = raw_post(server, "/v2/repository/index", b'{"ready": true}')
    assert status == 200 and json.loads(body) == [{"name": "a", "version": "1", "state": "READY"}]
    status, body = raw_post(server, "/v2/repository/index", b'{"ready": "yes"}')
    assert status == 400 and json.loads(body) == {"error": "Invalid value for 'ready': expected a boolean"}
    assert ready(server)  # strict readiness counts the models the server loaded


def test_explicit_mode_with_star_loads_every_model(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("a", CONFIG, adder(1))
    repo.add("b", CONFIG, adder(2))
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "*")
    assert ready(server, "a") and ready(server, "b")


@pytest.mark.workers_sensitive
def test_load_unload_and_load_again_round_trip(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("m", CONFIG, adder(5))
    server = serve(repo.root, "--model-control-mode", "explicit")
    assert index(server)["m"] == [{"name": "m"}]
    with pytest.raises(InferenceServerException) as caught:
        infer(server, "m")
    assert caught.value.status() == "404"

    load(server, "m")
    assert ready(server, "m")
    assert added(server, "m") == 5
    assert index(server)["m"] == [{"name": "m", "version": "1", "state": "READY"}]

    unload(server, "m")
    assert not ready(server, "m")
    assert index(server)["m"] == [{"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
    with pytest.raises(InferenceServerException) as caught:
        infer(server, "m")
    assert caught.value.status() == "404"
    assert caught.value.message() == "Request for unknown model: 'm' has no available versions; version 1 is UNAVAILABLE: unloaded"
    assert ready(server)  # an unloaded model does not make the server unready

    load(server, "m")
    assert added(server, "m") == 5
    log = server.log()
    for line in ("loading: m:1", "successfully loaded 'm' version 1", "unloading: m:1", "successfully unloaded 'm' version 1"):
        assert line in log


def test_loading_a_changed_model_again_serves_the_new_code(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    folder = repo.add("m", CONFIG, adder(1))
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "m")
    assert added(server, "m") == 1
    set_value(folder, 2)
    load(server, "m")
    assert added(server, "m") == 2
    assert index(server)["m"] == [{"name": "m", "version": "1", "state": "READY"}]


def test_a_new_version_folder_replaces_the_old_version_on_load(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    folder = repo.add("m", CONFIG, adder(1), version=1)
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "m")
    (folder / "2").mkdir()
    set_value(folder / "2", 2)
    load(server, "m")
    assert added(server, "m") == 2
    assert index(server)["m"] == [
        {"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "m", "version": "2", "state": "READY"},
    ]


def test_unload_unknown_model_is_a_no_op(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    server = serve(repo.root, "--model-control-mode", "explicit")
    unload(server, "never_loaded")
    assert index(server) == {}


# -- config override -------------------------------------------------------------------------


@pytest.mark.workers_sensitive
def test_load_with_a_config_override_serves_that_config(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("m", CONFIG, adder(1))
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "m")
    c = client(server)
    try:
        config = c.get_model_config("m")
        assert config["max_batch_size"] == 8
        config["max_batch_size"] = 2
        c.load_model("m", config=json.dumps(config))
        assert c.get_model_config("m")["max_batch_size"] == 2
        # the override lasts for that load only: a plain load reads config.toml again
        c.load_model("m")
        assert c.get_model_config("m")["max_batch_size"] == 8
    finally:
        c.close()


@pytest.mark.workers_sensitive
def test_an_invalid_config_override_is_refused_naming_the_key_and_the_old_load_serves(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("m", CONFIG, adder(1))
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "m")
    c = client(server)
    try:
        config = c.get_model_config("m")
        config["max_batch_sise"] = 2
        with pytest.raises(InferenceServerException) as caught:
            c.load_model("m", config=json.dumps(config))
        assert caught.value.status() == "400"
        assert "load request for 'm' (parameters.config)" in caught.value.message()
        assert 'unknown key "max_batch_sise" (did you mean "max_batch_size"?)' in caught.value.message()
        with pytest.raises(InferenceServerException) as caught:
            c.load_model("m", config="{not json")
        assert caught.value.status() == "400"
    finally:
        c.close()
    assert added(server, "m") == 1


def test_file_overrides_are_refused(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("m", CONFIG, adder(1))
    server = serve(repo.root, "--model-control-mode", "explicit")
    c = client(server)
    try:
        with pytest.raises(InferenceServerException) as caught:
            c.load_model("m", config=json.dumps({"max_batch_size": 8}), files={"file:1/model.py": b"x = 1\n"})
    finally:
        c.close()
    assert caught.value.status() == "501"
    assert "parameter 'file:1/model.py' refused" in caught.value.message()
    assert index(server)["m"] == [{"name": "m"}]


# -- failures ----------------------------------------------------------------------------------

BROKEN_IMPORT = "import not_a_module_xyz\n"


def test_a_failed_load_is_500_with_the_reason_and_the_index_shows_it(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("broken", CONFIG, BROKEN_IMPORT)
    server = serve(repo.root, "--model-control-mode", "explicit")
    with pytest.raises(InferenceServerException) as caught:
        load(server, "broken")
    assert caught.value.status() == "500"
    message = caught.value.message()
    assert message.startswith("failed to load 'broken', version 1 is at UNAVAILABLE state: ")
    assert "model.py: import failed: ModuleNotFoundError: No module named 'not_a_module_xyz'" in message
    [row] = index(server)["broken"]
    assert row["state"] == "UNAVAILABLE" and "No module named 'not_a_module_xyz'" in row["reason"]
    assert not ready(server)  # strict readiness: a failed model makes the server unready
    assert "failed to load 'broken' version 1: " in server.log()
    unload(server, "broken")  # ... until it is unloaded
    assert ready(server)


def test_a_load_of_a_missing_folder_is_500_and_leaves_no_trace(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    server = serve(repo.root, "--model-control-mode", "explicit")
    with pytest.raises(InferenceServerException) as caught:
        load(server, "nope")
    assert caught.value.status() == "500"
    assert caught.value.message().startswith("failed to load 'nope', ")
    assert index(server) == {}
    assert ready(server)


@pytest.mark.toml_only("breaks the model's config.toml by hand")
def test_a_broken_new_version_keeps_the_old_one_serving(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    folder = repo.add("m", CONFIG, adder(1))
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "m")
    (folder / "model.py").write_text("class Model:\n    def __init__(self, context):\n        raise RuntimeError('no weights')\n"
                                     "    def infer(self, inputs):\n        return {}\n")
    with pytest.raises(InferenceServerException) as caught:
        load(server, "m")
    assert caught.value.status() == "500"
    assert "RuntimeError: no weights" in caught.value.message()
    assert added(server, "m") == 1  # the old object still serves
    [row] = index(server)["m"]
    assert row["state"] == "READY"
    assert row["reason"].startswith("reload failed, the previous load keeps serving: ")
    assert "RuntimeError: no weights" in row["reason"]
    assert ready(server, "m") and ready(server)

    # a broken config is the same story
    (folder / "config.toml").write_text("max_batch_size = -3\n")
    with pytest.raises(InferenceServerException):
        load(server, "m")
    assert added(server, "m") == 1
    assert "config.toml: max_batch_size" in index(server)["m"][0]["reason"]

    (folder / "config.toml").write_text(CONFIG)
    set_value(folder, 3)
    load(server, "m")
    assert added(server, "m") == 3
    assert index(server)["m"] == [{"name": "m", "version": "1", "state": "READY"}]


def test_a_broken_new_version_folder_keeps_the_previous_version_serving(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    folder = repo.add("m", CONFIG, adder(1), version=1)
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "m")
    (folder / "2").mkdir()
    (folder / "2" / "model.py").write_text(BROKEN_IMPORT)
    with pytest.raises(InferenceServerException) as caught:
        load(server, "m")
    assert caught.value.message().startswith("failed to load 'm', version 2 is at UNAVAILABLE state: ")
    assert added(server, "m") == 1
    v1, v2 = index(server)["m"]
    assert v1 == {"name": "m", "version": "1", "state": "READY",
                  "reason": "reload failed, the previous load keeps serving: version 2 failed to load"}
    assert v2["state"] == "UNAVAILABLE" and "No module named 'not_a_module_xyz'" in v2["reason"]
    assert not ready(server)  # as tritonserver: a version that should serve does not


# -- control modes and names -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_load_and_unload_are_refused_unless_mode_is_explicit(serve, repo: RepoBuilder, mode: str) -> None:  # type: ignore[no-untyped-def]
    repo.add("m", CONFIG, adder(1))
    server = serve(repo.root, "--model-control-mode", mode)
    for call in (load, unload):
        with pytest.raises(InferenceServerException) as caught:
            call(server, "m")
        assert caught.value.status() == "503"
        assert caught.value.message() == "explicit model load / unload is not allowed if polling is enabled"
    assert added(server, "m") == 1


@pytest.mark.workers_sensitive
def test_names_that_are_not_folder_names_are_refused_before_the_filesystem(serve, repo: RepoBuilder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo.add("m", CONFIG, adder(1))
    # a model that sits outside the repository, next to it: it must never load
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.toml").write_text(CONFIG)
    (outside / "model.py").write_text(adder(666))
    server = serve(repo.root, "--model-control-mode", "explicit")
    for name in ("%2E%2E", ".hidden", "%2Ehidden", "a%5Cb", "_private"):
        for action in ("load", "unload"):
            status, body = raw_post(server, f"/v2/repository/models/{name}/{action}")
            assert status == 400, (name, action, body)
            assert "invalid model name" in json.loads(body)["error"]
    for path in ("/v2/repository/models/..%2F..%2Fetc/load", "/v2/repository/models/..%2Foutside/load",
                 "/v2/repository/models/../outside/load", "/v2/repository/models/%2E%2E%2Foutside/unload"):
        status, body = raw_post(server, path)
        assert status in (400, 404), (path, status, body)  # the router may not even match a name with "/"
    assert set(index(server)) == {"m"}
    assert "loading:" not in server.log()  # nothing was loaded, from anywhere


# -- unload drains ---------------------------------------------------------------------------

#: infer() marks that it started, then waits for the test to release it: "in flight" is
#: certain, not a matter of timing.
GATED = """
import pathlib
import time
import numpy as np

STARTED = pathlib.Path({started!r})
RELEASE = pathlib.Path({release!r})

class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        STARTED.touch()
        wait_for_file(RELEASE)
        return {{"OUTPUT0": inputs["INPUT0"] + np.float32(7)}}
""" + MODEL_GATE


@pytest.mark.workers_sensitive
def test_unload_lets_accepted_requests_finish_and_refuses_new_ones(serve, repo: RepoBuilder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    started, release = tmp_path / "started", tmp_path / "release"
    repo.add("slow", CONFIG, GATED.format(started=str(started), release=str(release)))
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "slow")

    async def scenario() -> tuple[Any, Any, bool]:
        c = aioclient.InferenceServerClient(server.url)
        try:
            tensor = aioclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            in_flight = asyncio.create_task(c.infer("slow", [tensor]))
            await wait_until_async(started.exists, "the request to run")
            unloading = asyncio.create_task(c.unload_model("slow"))

            async def unloading_now() -> bool:
                return (await c.get_model_repository_index())[0].get("state") == "UNLOADING"

            await wait_until_async(unloading_now, "the model to turn UNLOADING")
            late: Any
            try:
                late = await c.infer("slow", [tensor])
            except InferenceServerException as exc:
                late = exc
            unload_waited = not unloading.done()  # the unload waits for the accepted request
            release.touch()
            result = await in_flight
            await unloading
            return result.as_numpy("OUTPUT0"), late, unload_waited
        finally:
            await c.close()

    output, late, unload_waited = asyncio.run(scenario())
    np.testing.assert_array_equal(output, np.full((1, 4), 8, np.float32))
    assert isinstance(late, InferenceServerException)
    assert late.status() == "404"
    assert late.message() == "Request for unknown model: 'slow' has no available versions; version 1 is UNLOADING"
    assert unload_waited
    assert index(server)["slow"] == [{"name": "slow", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]


# -- reload under load -----------------------------------------------------------------------


@pytest.mark.workers_sensitive
def test_a_reload_under_concurrent_load_fails_no_request(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    folder = repo.add("m", CONFIG, adder(1000, infer_secs=0.002))
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "m")
    failures: list[str] = []
    seen: list[tuple[float, float]] = []  # (start time, value added)
    reload_done: list[float] = []

    async def worker(c: aioclient.InferenceServerClient, seed: int, stop: asyncio.Future[None]) -> None:
        rng = np.random.default_rng(seed)
        while not stop.done():
            data = rng.integers(0, 1000, size=(1, 4)).astype(np.float32)
            tensor = aioclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(data)
            started = time.monotonic()
            try:
                result = await c.infer("m", [tensor])
            except InferenceServerException as exc:
                failures.append(str(exc))
                continue
            delta = set((result.as_numpy("OUTPUT0") - data).ravel().tolist())
            if len(delta) != 1 or next(iter(delta)) not in (1000.0, 2000.0):
                failures.append(f"garbage: input {data.tolist()} -> {result.as_numpy('OUTPUT0').tolist()}")
                continue
            seen.append((started, delta.pop()))

    async def reloader(c: aioclient.InferenceServerClient) -> None:
        await wait_until_async(lambda: len(seen) >= 50, "50 answers before the reload")
        set_value(folder, 2000, infer_secs=0.002)
        await c.load_model("m")
        reload_done.append(time.monotonic())

    async def scenario() -> None:
        c = aioclient.InferenceServerClient(server.url)
        control = aioclient.InferenceServerClient(server.url)
        try:
            # 50 answers before the reload, the reload, 1 s of traffic after it
            stop = asyncio.get_running_loop().create_future()
            reload = asyncio.create_task(reloader(control))
            reload.add_done_callback(lambda _: asyncio.get_running_loop().call_later(1.0, stop.set_result, None))
            workers = [asyncio.create_task(worker(c, seed, stop)) for seed in range(16)]
            await asyncio.gather(reload, *workers)
        finally:
            await c.close()
            await control.close()

    asyncio.run(scenario())
    assert failures == []
    values = [value for _, value in seen]
    assert 1000.0 in values and 2000.0 in values
    # once the load answered, traffic had moved: requests started after it see the new code
    assert all(value == 2000.0 for started, value in seen if started > reload_done[0])
    assert len(seen) > 100


# -- poll mode -------------------------------------------------------------------------------


def state_of(server: RunningServer, model: str) -> list[dict[str, str]]:
    return index(server).get(model, [])


@pytest.mark.workers_sensitive
def test_poll_mode_follows_new_changed_and_removed_folders(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    folder = repo.add("a", CONFIG, adder(1))
    server = serve(repo.root, "--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    assert added(server, "a") == 1

    # a new folder loads
    repo.add("b", CONFIG, adder(10))
    wait_for(lambda: state_of(server, "b") == [{"name": "b", "version": "1", "state": "READY"}], what="b READY")
    assert added(server, "b") == 10

    # a changed model.py reloads: the new behaviour shows in the outputs
    set_value(folder, 2)
    wait_for(lambda: added(server, "a") == 2, what="a to serve its new code")

    # editor and interpreter droppings do not reload anything
    loads = server.log().count("loading: a:1")
    (folder / ".model.py.swp").write_text("swap")
    (folder / "model.py~").write_text("backup")
    (folder / "__pycache__").mkdir(exist_ok=True)
    (folder / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    # A later change is found by a scan that also sees the droppings (written before it):
    # once that change has loaded, the droppings have had their chance to reload "a".
    repo.add("c", CONFIG, adder(100))
    wait_for(lambda: state_of(server, "c") == [{"name": "c", "version": "1", "state": "READY"}], what="c READY")
    assert server.log().count("loading: a:1") == loads

    # a removed folder unloads
    shutil.rmtree(repo.root / "b")
    wait_for(lambda: state_of(server, "b") == [{"name": "b", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}],
             what="b unloaded")
    with pytest.raises(InferenceServerException) as caught:
        infer(server, "b")
    assert caught.value.status() == "404"
    assert ready(server)


def test_poll_mode_keeps_the_old_version_when_a_change_breaks_the_model(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    folder = repo.add("a", CONFIG, adder(1))
    server = serve(repo.root, "--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    (folder / "model.py").write_text(BROKEN_IMPORT)
    wait_for(lambda: state_of(server, "a")[0].get("reason"), what="the failed reload in the index")
    [row] = state_of(server, "a")
    assert row["state"] == "READY" and "No module named 'not_a_module_xyz'" in row["reason"]
    assert added(server, "a") == 1


# -- warmup ------------------------------------------------------------------------------------

#: Adds the sum of every input it has seen before this call: the first real request
#: shows exactly what warmup sent.
SEEN = """
import numpy as np

class Model:
    def __init__(self, context):
        self.seen = 0.0

    def infer(self, inputs):
        x = inputs["INPUT0"]
        if np.any(x < 0):
            raise ValueError("cannot warm up on negatives")
        out = x + np.float32(self.seen)
        self.seen += float(x.sum())
        return {"OUTPUT0": out}
"""


def test_warmup_runs_on_every_instance_before_the_model_is_ready(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    config = CONFIG + """
[[model_warmup]]
name = "from_file"
batch_size = 2
count = 3
inputs.INPUT0 = { data_type = "TYPE_FP32", dims = [4], input_data_file = "in.bin" }
"""
    folder = repo.add("m", config, SEEN)
    (folder / "warmup").mkdir()
    (folder / "warmup" / "in.bin").write_bytes(np.array([1, 2, 3, 4], "<f4").tobytes())
    server = serve(repo.root)
    # 3 runs x batch of 2 x (1+2+3+4) = 60 seen before the first real request
    data = np.zeros((1, 4), np.float32)
    np.testing.assert_array_equal(infer(server, "m", data), np.full((1, 4), 60, np.float32))


def test_a_failing_warmup_makes_the_model_unavailable_with_the_reason(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    config = CONFIG + """
[[model_warmup]]
name = "negative"
inputs.INPUT0 = { data_type = "TYPE_FP32", dims = [4], input_data_file = "neg.bin" }
"""
    folder = repo.add("m", config, SEEN)
    (folder / "neg.bin").write_bytes(np.full(4, -1, "<f4").tobytes())
    server = serve(repo.root, "--model-control-mode", "explicit")
    with pytest.raises(InferenceServerException) as caught:
        load(server, "m")
    assert caught.value.status() == "500"
    expected = ("warmup sample 'negative' (model_warmup[0]) failed on instance m_0: "
                "model \"m\" raised in infer: ValueError: cannot warm up on negatives")
    assert expected in caught.value.message()
    [row] = index(server)["m"]
    assert row["state"] == "UNAVAILABLE" and row["reason"] == expected
    assert not ready(server, "m")


# -- readiness -------------------------------------------------------------------------------


#: __init__ waits for the test to open the gate: "still loading" is certain.
GATED_INIT = """
import pathlib
import time
import numpy as np

GATE = pathlib.Path({gate!r})

class Model:
    def __init__(self, context):
        wait_for_file(GATE)

    def infer(self, inputs):
        return {{"OUTPUT0": inputs["INPUT0"]}}
""" + MODEL_GATE


@pytest.mark.workers_sensitive
def test_the_server_is_not_ready_while_the_initial_load_runs(serve, repo: RepoBuilder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gate = tmp_path / "gate"
    repo.add("slow", CONFIG, GATED_INIT.format(gate=str(gate)))
    server = serve(repo.root, wait_ready=False)
    c = client(server)
    try:
        wait_for(lambda: "loading: slow:1" in server.log(), what="the load to start")
        assert c.is_server_live()
        assert not c.is_server_ready()
        assert not c.is_model_ready("slow")
        assert index(server)["slow"] == [{"name": "slow", "version": "1", "state": "LOADING"}]
        gate.touch()
        wait_for(c.is_server_ready, what="the server to turn ready")
        assert c.is_model_ready("slow")
    finally:
        c.close()
    log = server.log()
    assert log.index("loading: slow:1") < log.index("successfully loaded 'slow' version 1") < log.index("server is ready")
    assert "| slow  | 1       | READY  |" in log


def test_strict_readiness_false_is_ready_despite_a_failed_load(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("broken", CONFIG, BROKEN_IMPORT)
    server = serve(repo.root, "--model-control-mode", "explicit", "--strict-readiness", "false")
    with pytest.raises(InferenceServerException):
        load(server, "broken")
    assert ready(server)
    assert not ready(server, "broken")


# -- in process: a caller that looked the model up just before a reload ------------------------


def test_a_request_holding_the_replaced_object_is_served_by_its_replacement(repo: RepoBuilder) -> None:
    from nereid.errors import ModelNotFoundError
    from nereid.inference import InferRequest
    from nereid.models.manager import ModelManager

    folder = repo.add("m", CONFIG, adder(1))

    async def scenario() -> None:
        manager = ModelManager(repo.root, mode="explicit", startup_models=["m"])
        await manager.start()
        try:
            request = InferRequest("m", {"INPUT0": np.zeros((1, 4), np.float32)})
            held = manager.get("m")
            assert (await held.infer(request))["OUTPUT0"].tolist() == [[1.0] * 4]
            set_value(folder, 2)
            await manager.load("m")
            assert manager.get("m") is not held
            assert (await held.infer(request))["OUTPUT0"].tolist() == [[2.0] * 4]
            await manager.unload("m")
            with pytest.raises(ModelNotFoundError, match="'m' has no available versions"):
                await held.infer(request)
        finally:
            await manager.aclose()

    asyncio.run(scenario())
