"""The instance's own threads (nereid.instances.thread.InstanceThreads): calls, and stopping."""

from __future__ import annotations

import asyncio
import threading

from nereid.instances.thread import InstanceThreads


def test_calls_run_on_the_instance_threads_and_stop_ends_every_thread() -> None:
    async def scenario() -> None:
        threads = InstanceThreads(2, "inst")
        names = await asyncio.gather(*(threads.call(lambda: threading.current_thread().name) for _ in range(4)))
        assert set(names) <= {"inst-0", "inst-1"}
        assert await threads.stop(5.0)
        for thread in threads._threads:
            thread.join(5.0)
            assert not thread.is_alive()

    asyncio.run(scenario())


def test_a_second_stop_does_not_wait_for_threads_already_gone() -> None:
    # A load that fails in Model.__init__ stops the instance's threads, and then the
    # loader closes the instance, which stops them again: that must succeed, not time out.
    async def scenario() -> None:
        threads = InstanceThreads(1, "inst")
        assert await threads.stop(5.0)
        assert await threads.stop(0.5)

    asyncio.run(scenario())


def test_stop_reports_a_thread_still_busy_in_model_code() -> None:
    async def scenario() -> None:
        release = threading.Event()
        threads = InstanceThreads(1, "inst")
        busy = threads.call(release.wait)
        assert not await threads.stop(0.2)
        release.set()
        assert await busy is True
        assert await threads.stop(5.0)

    asyncio.run(scenario())
