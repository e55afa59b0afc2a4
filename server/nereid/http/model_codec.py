"""What the HTTP infer path needs from one served model version, made once: the config's
lookup tables (``ModelTables``) and its ``Repeats`` memo (together a ``ModelCodec``), kept per served model version by
``CodecCache`` and dropped with it."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

from nereid.config.schema import ModelConfig
from nereid.http.repeats import Repeats
from nereid.tensors.tables import ModelTables

__all__ = ["CodecCache", "ModelCodec"]


@dataclasses.dataclass(frozen=True, slots=True)
class ModelCodec(ModelTables):
    """A model version's tables (ModelTables) and the memo of its repeated requests and
    answers (``repeats``). The parser and encoder take a ModelCodec or a plain ModelConfig
    (a fresh ModelCodec per call)."""

    repeats: Repeats

    @classmethod
    def for_config(cls, config: ModelConfig) -> ModelCodec:
        return cls(**ModelTables.fields_for(config), repeats=Repeats())  # type: ignore[arg-type]

    @classmethod
    def of(cls, config: ModelConfig | ModelCodec) -> ModelCodec:
        """``config`` itself when it is a ModelCodec, else a fresh one."""
        return config if isinstance(config, ModelCodec) else cls.for_config(config)


class CodecCache:
    """One ModelCodec per served model version (any object that has a ``config``), held
    weakly: an unloaded model's codec goes with it. The one asked for last is found
    through one weak reference (most requests ask for the same model as the last one)."""

    __slots__ = ("_codecs", "_last")

    def __init__(self) -> None:
        self._codecs: weakref.WeakKeyDictionary[Any, ModelCodec] = weakref.WeakKeyDictionary()
        self._last: tuple[weakref.ref[Any], ModelCodec] | None = None

    def get(self, serving: Any) -> ModelCodec:
        last = self._last
        if last is not None and last[0]() is serving:
            return last[1]
        found = self._codecs.get(serving)
        if found is None:
            found = self._codecs[serving] = ModelCodec.for_config(serving.config)
        self._last = (weakref.ref(serving), found)
        return found
