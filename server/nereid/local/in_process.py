"""InProcessServer: a model repository loaded and served from Python (sync, on a private
loop thread, or async, on the caller's loop), through the same model manager, batchers
and instances as the HTTP server, which extends it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import queue
import threading
from types import TracebackType
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence

import numpy as np

from nereid.local.bls_target import ServerBls
from nereid.local.endpoint import LocalEndpoint
from nereid.models.manager import IndexEntry, ModelManager
from nereid.options import ServerOptions, repository_paths

__all__ = ["InProcessServer"]


class InProcessServer:
    """Load a model repository and infer on it from Python, through the same model
    manager, batchers and instances as the HTTP server (which extends this class).

    Sync use starts a private event loop on a background thread::

        with nereid.Server("model_repository") as server:
            outputs = server.infer("add_one", {"INPUT0": np.array([[41]])})
            for step in server.stream("text_generator", {"text_input": [["Hello"]]}):
                ...

    Async use runs on the caller's loop: ``async with nereid.Server(...) as server:
    await server.ainfer(...)``, ``async for step in server.astream(...)``. Calls from
    many threads (or tasks) at once are batched together like HTTP requests.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | ServerOptions = "model_repository",
        **options: Any,
    ) -> None:
        if isinstance(model_repository, ServerOptions):
            self.options = dataclasses.replace(model_repository, **options) if options else model_repository
        else:
            self.options = ServerOptions(model_repository=repository_paths(model_repository), **options)
        #: how this server's Triton models reach its other models (BLS)
        self.bls = ServerBls()
        self.manager = self._make_manager()
        self.local = LocalEndpoint(self.manager)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _make_manager(self) -> ModelManager:
        options = self.options
        return ModelManager(
            options.model_repositories,
            mode=options.model_control_mode,
            startup_models=options.load_model,
            poll_secs=options.repository_poll_secs,
            bls=self.bls,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the models (as the control mode says) on the running loop."""
        self.bind_bls()
        await self.manager.start()

    def bind_bls(self) -> None:
        """Let this server's Triton models call its other models, through the running loop."""
        self.bls.bind(self.local, asyncio.get_running_loop())

    async def aclose(self) -> None:
        """Drain and unload every model."""
        await self.manager.close()

    async def __aenter__(self) -> InProcessServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> InProcessServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="nereid-inprocess", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self._call(self.start())
        except BaseException:
            self._stop_thread()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self._call(self.aclose())
        finally:
            self._stop_thread()

    def _stop_thread(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
        self._loop = self._thread = None

    def _call(self, coro: Any) -> Any:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the server is not started: use `with nereid.Server(...) as server:` "
                               "(or `async with` and the a-prefixed methods)")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # -- inference -------------------------------------------------------------------------

    def infer(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> dict[str, np.ndarray]:
        """Blocking: one request's outputs. Keyword arguments: version, parameters,
        priority, timeout_us; sequence_id, sequence_start, sequence_end for a sequence model."""
        result: dict[str, np.ndarray] = self._call(self.local.infer(model, inputs, **kwargs))
        return result

    async def ainfer(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> dict[str, np.ndarray]:
        """One request's outputs, on the caller's loop (``async with`` use)."""
        return await self.local.infer(model, inputs, **kwargs)

    def stream(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> Iterator[dict[str, np.ndarray]]:
        """Blocking iterator over one request's streamed outputs (decoupled models)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the server is not started: use `with nereid.Server(...) as server:`")
        steps: queue.Queue[Any] = queue.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for step in self.local.stream(model, inputs, **kwargs):
                    steps.put(step)
            except BaseException as exc:  # handed to the caller's thread
                steps.put(exc)
            finally:
                steps.put(done)

        future: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(pump(), loop)
        try:
            while True:
                item = steps.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            future.cancel()  # the caller stopped early: stop the request

    async def astream(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> AsyncIterator[dict[str, np.ndarray]]:
        """One request's streamed outputs, on the caller's loop."""
        async for step in self.local.stream(model, inputs, **kwargs):
            yield step

    # -- state -----------------------------------------------------------------------------

    def is_ready(self) -> bool:
        return self.manager.is_ready(self.options.strict_readiness)

    def models(self) -> list[IndexEntry]:
        """Every model the server knows, with each version's state and reason."""
        return self.manager.states()
