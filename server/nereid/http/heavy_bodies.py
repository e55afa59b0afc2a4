"""HeavyBodies: infer bodies too costly to decode on the event loop, decoded beside it.

Two costs can stall every client of the loop for seconds: inflating a large compressed
body, and parsing a large JSON request (orjson holds the GIL for the whole document:
100 MB of JSON numbers took 1.6 s here, during which no other request moved).

- Inflation goes to a thread: zlib lets go of the GIL while it inflates, and
  ``compression.decode_body`` stops at the size limit as it goes.
- A JSON header over ``JSON_OFF_LOOP_BYTES`` is parsed in a decode process of its own
  (started on first use, one parse at a time, restarted if it dies): its whole parse,
  checks included, runs there (``infer_request.parse_infer_body``, the same code as on
  the loop), and the request comes back pickled (arrays as one copy each). A thread
  would not do: the parser never releases the GIL. Requests naming shared memory are parsed on the loop (the regions
  are mapped in this process).

Everything smaller takes the loop's path untouched: the infer endpoint compares the body's
size with these thresholds (inline, no call) and calls this module only past them.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
import subprocess
import sys
import threading
from typing import IO, Any

from nereid.config.schema import ModelConfig
from nereid.errors import InternalError, NereidError
from nereid.http.compression import decode_body
from nereid.http.infer_request import parse_infer_body
from nereid.http.infer_memo import HttpModelTables
from nereid.http.request_json import parse_header_length
from nereid.inference import InferRequest

__all__ = ["HeavyBodies", "JSON_OFF_LOOP_BYTES", "INFLATE_OFF_LOOP_BYTES"]

#: JSON headers larger than this are parsed in the decode process (about 5-15 ms of
#: parsing on the loop at this size).
JSON_OFF_LOOP_BYTES = 1 << 20
#: compressed bodies larger than this are inflated on a thread.
INFLATE_OFF_LOOP_BYTES = 64 << 10


class HeavyBodies:
    """Decodes the heavy infer bodies of one server off its event loop."""

    def __init__(self) -> None:
        self._process: _DecodeProcess | None = None

    async def decode(
        self, body: bytes, content_encoding: str | None, header_length: str | None, tables: HttpModelTables,
        name: str, version: int | None, max_request_size: int, max_json_size: int,
    ) -> InferRequest | bytes:
        """The body inflated (off the loop); then, when its JSON header is heavy and it
        uses no shared memory, the parsed request (in the decode process). Returns the
        inflated body when the loop should parse it itself. Raises what the loop's
        parser would raise."""
        if content_encoding:
            body = await asyncio.to_thread(decode_body, body, content_encoding, max_size=max_request_size)
        try:
            json_length = len(body) if header_length is None else parse_header_length(header_length, len(body))
        except NereidError:
            return body  # the loop's parser reports it
        if json_length <= JSON_OFF_LOOP_BYTES or body.find(b"shared_memory_region", 0, json_length) != -1:
            return body
        if self._process is None:
            self._process = _DecodeProcess()
        outcome = await asyncio.to_thread(
            self._process.call, (header_length, tables.config, name, version, max_json_size), body
        )
        if isinstance(outcome, InferRequest):
            return outcome
        kind, message = outcome  # a NereidError, rebuilt here (its own __init__ may want more than a message)
        error: NereidError = kind.__new__(kind)
        NereidError.__init__(error, message)
        try:
            raise error
        finally:
            del error  # else error -> traceback -> this frame -> error: a cycle holding the body

    def close(self) -> None:
        if self._process is not None:
            self._process.close()
            self._process = None


class _DecodeProcess:
    """``python -m nereid.http.heavy_bodies``: parses what it is sent, one at a time.
    Frames on its stdin/stdout: an 8-byte length, then that many bytes (a pickle, or
    the raw body). A plain subprocess, not multiprocessing: that would import the
    program's main module again in the child (a user's script that starts a server)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._popen = self._start()

    @staticmethod
    def _start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "nereid.http.heavy_bodies"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )

    def call(self, arguments: tuple[Any, ...], body: bytes) -> Any:
        """Send one body to parse and wait for the outcome (on a thread: it blocks)."""
        with self._lock:
            if self._popen.poll() is not None:  # died (killed, out of memory): a new one
                self._popen = self._start()
            popen = self._popen
            assert popen.stdin is not None and popen.stdout is not None
            try:
                _write_frame(popen.stdin, pickle.dumps(arguments, protocol=5))
                _write_frame(popen.stdin, body)
                popen.stdin.flush()
                return pickle.loads(_read_frame(popen.stdout))
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                popen.kill()
                raise InternalError(f"the decode process for large requests failed: {exc!r}") from exc

    def close(self) -> None:
        popen = self._popen
        if popen.poll() is None:
            popen.kill()
        popen.wait()
        for pipe in (popen.stdin, popen.stdout):
            if pipe is not None:
                pipe.close()


def _write_frame(pipe: IO[bytes], data: bytes) -> None:
    pipe.write(struct.pack("<Q", len(data)))
    pipe.write(data)


def _read_frame(pipe: IO[bytes]) -> bytes:
    size = struct.unpack("<Q", _read_exactly(pipe, 8))[0]
    return _read_exactly(pipe, size)


def _read_exactly(pipe: IO[bytes], size: int) -> bytes:
    data = pipe.read(size)
    if data is None or len(data) != size:
        raise EOFError("the decode process closed its output")
    return data


def _parse(
    body: bytes, header_length: str | None, config: ModelConfig, name: str, version: int | None, max_json_size: int
) -> InferRequest | tuple[type[NereidError], str]:
    """In the decode process: the loop's parser, on its own copy of the body. A refusal
    comes back as (its class, its message)."""
    try:
        return parse_infer_body(body, header_length, HttpModelTables.for_config(config), name, version, max_json_size).request
    except NereidError as exc:
        return type(exc), exc.message


def _serve() -> None:
    """The decode process: frames in, outcomes out, until its input closes."""
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            arguments = pickle.loads(_read_frame(source))
            body = _read_frame(source)
        except EOFError:
            return
        header_length, config, name, version, max_json_size = arguments
        try:
            outcome: Any = _parse(body, header_length, config, name, version, max_json_size)
        except Exception as exc:  # a bug: the server reports it as an internal error
            outcome = InternalError, f"parsing in the decode process failed: {type(exc).__name__}: {exc}"
        del body
        _write_frame(sink, pickle.dumps(outcome, protocol=5))
        sink.flush()


if __name__ == "__main__":
    _serve()
