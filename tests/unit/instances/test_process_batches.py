"""nereid.instances.process: a batch run in a process instance is timed by the process,
so the batcher's busy and idle figures (and the pipelining's expected end of a batch)
are the instance's own, not the event loop's, which may read the reply late."""

from __future__ import annotations

import asyncio
import select
import time
from pathlib import Path

import numpy as np

from nereid.inference import InferRequest
from nereid.instances.process import ProcessInstance
from tests.unit.instances.model_folder import model_folder
from tests.waiting import MODEL_GATE, WAIT_TIMEOUT_S, wait_until_async

CONFIG = """
name = "m"
max_batch_size = 8
[[input]]
name = "X"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "TIMES"
data_type = "TYPE_INT64"
dims = [2]
"""

#: each row: when infer began and when it returned, by the process's monotonic clock; it
#: returns once the test creates the file "open" beside its model.py
TIMED_MODEL = """
import time

import numpy as np


class Model:
    def __init__(self, context):
        self.folder = context.model_dir

    def infer(self, inputs):
        began = time.monotonic_ns()
        wait_for_file(self.folder / "open")
        rows = len(inputs["X"])
        return {"TIMES": np.array([[began, time.monotonic_ns()]] * rows, dtype=np.int64)}
""" + MODEL_GATE


def instance(tmp_path: Path) -> ProcessInstance:
    return ProcessInstance(*model_folder(tmp_path, TIMED_MODEL, CONFIG))


def test_a_batch_is_timed_by_its_process_not_by_the_loop_that_reads_its_reply(tmp_path: Path) -> None:
    async def main() -> None:
        running = instance(tmp_path)
        await running.start()
        try:
            assert running.worker.member is not None
            slots = running.worker.member.slots
            request = InferRequest(model_name="m", inputs={"X": np.array([[1], [2]], dtype=np.int32)}, rows=2)
            batch = asyncio.ensure_future(running.run_batch([request]))
            await wait_until_async(lambda: any(slot.busy for slot in slots), "the batch sent to the process")
            # The model returns, and the loop is held (a blocking wait) until its reply is
            # there to read: it reads it late, as a busy loop would.
            (tmp_path / "m" / "1" / "open").touch()
            readable, _, _ = select.select([slot.channel.sock for slot in slots], [], [], WAIT_TIMEOUT_S)
            assert readable, "no reply from the process"
            held_until = time.monotonic_ns()
            outcome = await batch
        finally:
            await running.close()
        assert outcome.error is None and outcome.outputs is not None
        began, ended = (int(t) for t in outcome.outputs[0]["TIMES"][0])
        assert outcome.began_ns <= began <= ended <= outcome.ended_ns
        assert outcome.ended_ns <= held_until  # the process's end, not when the loop came to the reply

    asyncio.run(main())
