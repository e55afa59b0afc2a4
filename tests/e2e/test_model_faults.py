"""A bug in the user's model, as the user meets it: the client gets a short error naming
the model, the server log shows the traceback the first time (file and line), and repeats
do not flood the log. Outputs that do not match the config are errors too."""

from __future__ import annotations


import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import IDENTITY_CONFIG, RepoBuilder, RunningServer
from tests.waiting import wait_until

FAILING = """
class Model:
    def __init__(self, context):
        self.calls = 0

    def infer(self, inputs):
        self.calls += 1
        return {"OUTPUT0": inputs["INPUT0"] / self.divisor}
"""


def infer(server: RunningServer, model: str, rows: int = 1, datatype: str = "FP32") -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [rows, 4], datatype)
    x.set_data_from_numpy(np.ones((rows, 4), np.float32))
    try:
        return client.infer(model, [x])
    finally:
        client.close()


def failure(server: RunningServer, model: str, **kwargs: object) -> str:
    with pytest.raises(InferenceServerException) as caught:
        infer(server, model, **kwargs)  # type: ignore[arg-type]
    return str(caught.value.message())


def wait_for_log(server: RunningServer, text: str) -> str:
    """The log once it holds ``text`` (the server writes it from another process)."""
    wait_until(lambda: text in server.log(), f"{text!r} in the log {server.log_path}")
    return server.log()


def test_an_exception_in_infer_is_logged_once_with_its_traceback(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    folder = repo.add("broken", IDENTITY_CONFIG, model=FAILING)
    repo.add("fine", IDENTITY_CONFIG)
    server = serve(repo.root)
    message = "model \"broken\" raised in infer: AttributeError: 'Model' object has no attribute 'divisor'"
    assert failure(server, "broken") == message
    log = wait_for_log(server, "AttributeError: 'Model' object has no attribute 'divisor'\n")
    assert "model 'broken' version 1 raised in infer (logged once; repeats are counted):\nTraceback" in log
    assert f'File "{folder / "model.py"}", line 8, in infer\n' in log
    assert 'return {"OUTPUT0": inputs["INPUT0"] / self.divisor}' in log
    for _ in range(20):  # the same bug again: counted, not logged again
        assert failure(server, "broken") == message
    assert infer(server, "fine").as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
    server.stop()  # unloading reports the repeats still counted
    log = server.log()
    assert log.count("Traceback (most recent call last)") == 1
    assert "model 'broken' version 1 raised in infer again: 20 more times in the last 60 s" in log


def test_an_exception_in_init_is_logged_with_its_traceback(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    model = "class Model:\n    def __init__(self, context):\n        raise RuntimeError('no weights in ' + str(context.model_dir))\n"
    folder = repo.add("broken", IDENTITY_CONFIG, model=model + "    def infer(self, inputs):\n        return inputs\n")
    server = serve(repo.root, wait_ready=False)
    log = wait_for_log(server, "failed to load 'broken'")
    assert "model 'broken' version 1 raised in __init__ (logged once; repeats are counted):\nTraceback" in log
    assert f'File "{folder / "model.py"}", line 3, in __init__\n' in log
    assert f"RuntimeError: no weights in {folder}\n" in log


def test_an_import_error_is_logged_with_the_users_line(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    folder = repo.add("broken", IDENTITY_CONFIG, model="import math\n\nvalue = math.sqrt('four')\n")
    server = serve(repo.root, wait_ready=False)
    log = wait_for_log(server, "failed to load 'broken'")
    assert "model 'broken' version 1 failed to import (logged once; repeats are counted):\nTraceback" in log
    assert f'File "{folder / "model.py"}", line 3, in <module>\n' in log
    assert "TypeError: must be real number, not str" in log


def test_an_exception_in_batch_size_is_logged_with_its_traceback(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    model = """
    class Model:
        def infer(self, inputs):
            return {"OUTPUT0": inputs["INPUT0"]}

        def batch_size(self, inputs):
            return inputs["TOKENS"].size
    """
    folder = repo.add("broken", IDENTITY_CONFIG, model=model)
    server = serve(repo.root)
    assert failure(server, "broken") == "model \"broken\", Model.batch_size(inputs) raised KeyError: 'TOKENS'"
    log = wait_for_log(server, "KeyError: 'TOKENS'\n")
    assert "model 'broken' version 1 raised in batch_size (logged once; repeats are counted):" in log
    assert f'File "{folder / "model.py"}", line 7, in batch_size\n' in log


def test_an_output_of_the_wrong_shape_fails_the_request_and_is_logged_once(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    model = """
    class Model:
        def infer(self, inputs):
            return {"OUTPUT0": inputs["INPUT0"][:, :2]}
    """
    repo.add("halves", IDENTITY_CONFIG + "[dynamic_batching]\n", model=model)
    server = serve(repo.root)
    message = 'model "halves", output "OUTPUT0": expected shape [3, 4] ([batch 3] + dims [4]), got [3, 2]'
    assert failure(server, "halves", rows=3) == message
    assert failure(server, "halves", rows=3) == message
    log = wait_for_log(server, message)
    assert log.count(message) == 1
    assert f"model 'halves' version 1 returned outputs that do not match its config (logged once; repeats are counted): {message}" in log


STRINGS = """
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "TEXT"
data_type = "TYPE_STRING"
dims = [1]
"""


def test_a_flat_list_for_a_string_output_of_dims_1_says_how_to_return_it(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    flat = 'class Model:\n    def infer(self, inputs):\n        return {"TEXT": ["row"] * len(inputs["INPUT0"])}\n'
    nested = 'class Model:\n    def infer(self, inputs):\n        return {"TEXT": [["row"] for _ in inputs["INPUT0"]]}\n'
    repo.add("flat", STRINGS, model=flat)
    repo.add("nested", STRINGS, model=nested)
    server = serve(repo.root)
    assert failure(server, "flat", rows=2) == (
        'model "flat", output "TEXT": expected shape [2, 1] ([batch 2] + dims [1]), got [2] '
        "(a STRING output is a nested list or object array of that shape, e.g. [[s] for s in texts] for dims [1])"
    )
    assert infer(server, "nested", rows=2).as_numpy("TEXT").tolist() == [[b"row"], [b"row"]]
