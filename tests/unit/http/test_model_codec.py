"""The HTTP endpoints keep one ModelCodec (lookup tables, header and answer memos) per
served model version: the same one for every request to it, a new one for a reloaded
version, and none that outlives its model."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from nereid.config.schema import ModelConfig
from nereid.http.model_codec import CodecCache


class Served:
    """What the codec lookup reads of a ServingModel: its config (and its identity)."""

    def __init__(self) -> None:
        self.config = ModelConfig(name="m", max_batch_size=0)


def endpoints() -> Any:
    """What the tests below call ``ep._codec``: the endpoints' CodecCache lookup."""
    cache = CodecCache()

    class _Endpoints:
        _codec = staticmethod(cache.get)

    return _Endpoints()


def test_each_served_version_keeps_its_own_codec() -> None:
    ep = endpoints()
    first, second = Served(), Served()
    codec_first = ep._codec(first)  # type: ignore[arg-type]
    assert ep._codec(first) is codec_first  # type: ignore[arg-type]
    codec_second = ep._codec(second)  # type: ignore[arg-type]
    assert codec_second is not codec_first
    assert ep._codec(first) is codec_first  # type: ignore[arg-type]  # after another one was asked for
    assert ep._codec(second) is codec_second  # type: ignore[arg-type]


def test_a_codec_does_not_keep_its_model_alive() -> None:
    ep = endpoints()
    served: Any = Served()
    ep._codec(served)
    ep._codec(served)  # now also the last one asked for
    gone = weakref.ref(served)
    del served
    gc.collect()
    assert gone() is None
    replacement: Any = Served()  # may reuse the freed address: still a codec of its own
    assert ep._codec(replacement).config is replacement.config
