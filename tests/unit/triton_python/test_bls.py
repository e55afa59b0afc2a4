"""nereid.triton_python.bls: the BLS target is the calling model's own, set around its
code in a context variable (seen by what it awaits and by asyncio.to_thread), never
shared between two targets at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Iterator

import pytest

from nereid.triton_python import pb_utils
from nereid.triton_python.bls import BlsTarget, NotToItself, calls_through, current_target


class Target:
    """A BLS target that answers with its own name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def infer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        return pb_utils.InferenceResponse(parameters={"server": self.name, "model": request.model_name()})

    def stream(self, request: pb_utils.InferenceRequest) -> Iterator[pb_utils.InferenceResponse]:
        yield self.infer(request)


def server_of(response: pb_utils.InferenceResponse) -> str:
    return str(__import__("json").loads(response.parameters())["server"])


def request() -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest(model_name="other", inputs=[], requested_output_names=[])


def test_exec_goes_to_the_target_set_around_the_call() -> None:
    one: BlsTarget = Target("one")
    with calls_through(one):
        assert server_of(request().exec()) == "one"
        assert [server_of(r) for r in request().exec(decoupled=True)] == ["one"]
    assert current_target() is None


def test_outside_any_target_bls_is_not_available() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="BLS is not available here"):
        request().exec()


def test_nested_targets_restore_the_outer_one() -> None:
    with calls_through(Target("outer")):
        with calls_through(Target("inner")):
            assert server_of(request().exec()) == "inner"
        assert server_of(request().exec()) == "outer"


def test_async_exec_runs_on_another_thread_with_the_callers_target() -> None:
    async def model() -> str:
        return server_of(await request().async_exec())

    with calls_through(Target("mine")):
        assert asyncio.run(model()) == "mine"


def test_two_threads_each_see_only_their_own_target() -> None:
    barrier = threading.Barrier(2)

    def model_thread(name: str) -> list[str]:
        with calls_through(Target(name)):
            barrier.wait(timeout=30)  # both targets set at once
            return [server_of(request().exec()) for _ in range(50)]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first, second = pool.map(model_thread, ["first", "second"])
    assert set(first) == {"first"} and set(second) == {"second"}


def test_a_single_instance_model_calling_itself_gets_an_error_not_a_wait() -> None:
    guarded = NotToItself(Target("server"), "me", "me_0")
    to_itself = pb_utils.InferenceRequest(model_name="me", inputs=[], requested_output_names=[])
    expected = ('BLS request from model "me" instance me_0 to its own model: "me" has no other instance to run it '
                "(it would wait for itself); give it a second instance")
    for response in (guarded.infer(to_itself), *guarded.stream(to_itself)):
        error = response.error()
        assert error is not None and (error.message(), error.code()) == (expected, pb_utils.TritonError.UNAVAILABLE)
    assert server_of(guarded.infer(request())) == "server"  # other models: as before
