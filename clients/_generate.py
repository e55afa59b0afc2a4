"""Shared by the text_generator clients: POST a generate request with the standard library."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any


def generate(url: str, model: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    """POST /v2/models/{model}/generate and return the response object (raises on an error)."""
    host, port = _split(url)
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("POST", f"/v2/models/{model}/generate", json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"[{response.status}] {payload.get('error', payload)}")
        return payload  # type: ignore[no-any-return]
    finally:
        connection.close()


def generate_stream(url: str, model: str, body: dict[str, Any], timeout: float = 120.0) -> Iterator[dict[str, Any]]:
    """POST /v2/models/{model}/generate_stream and yield each server-sent event's object
    as it arrives (an ``{"error": ...}`` event raises)."""
    host, port = _split(url)
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("POST", f"/v2/models/{model}/generate_stream", json.dumps(body),
                           {"Content-Type": "application/json", "Accept": "text/event-stream"})
        response = connection.getresponse()
        if response.status != 200:
            payload = json.loads(response.read())
            raise RuntimeError(f"[{response.status}] {payload.get('error', payload)}")
        for line in response:  # chunked transfer: lines come as the server flushes them
            if not line.startswith(b"data:"):
                continue  # the blank line that ends each event
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(event["error"])
            yield event
    finally:
        connection.close()


def _split(url: str) -> tuple[str, int]:
    url = url.removeprefix("http://")
    host, _, port = url.partition(":")
    return host, int(port or 8000)
