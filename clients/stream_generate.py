#!/usr/bin/env python3
"""Streams text_generator's tokens as they arrive (POST .../generate_stream, server-sent
events), the way Ray Serve's streaming tutorial prints them.

    python clients/stream_generate.py --url 127.0.0.1:8000 --prompt "Once upon a time"
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _generate import generate_stream  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="server host:port (default 127.0.0.1:8000)")
    parser.add_argument("--model", default="text_generator")
    parser.add_argument("--prompt", default="Once upon a time,")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()

    print(f"prompt: {args.prompt!r}")
    print("tokens: ", end="", flush=True)
    start = time.monotonic()
    first = None
    pieces = []
    for event in generate_stream(args.url, args.model, {"text_input": args.prompt, "max_tokens": args.max_tokens}):
        if first is None:
            first = time.monotonic() - start
        piece = str(event["text_output"])
        pieces.append(piece)
        print(piece, end="|", flush=True)  # "|" marks where one streamed piece ends
    print()
    total = time.monotonic() - start
    print(f"received {len(pieces)} events; first after {1000 * (first or 0):.0f} ms, all after {1000 * total:.0f} ms")
    print(f"text: {''.join(pieces)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
