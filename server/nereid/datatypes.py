"""One table of tensor datatypes: Triton's config name, the wire name, numpy dtype, size.

Owns the mapping only; parsing and validation of tensors live in their own modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Any, Mapping

import numpy as np

__all__ = ["BY_WIRE_NAME", "DataType", "DATATYPES", "by_config_name", "by_wire_name", "bfloat16_dtype"]


def bfloat16_dtype() -> np.dtype:
    """numpy's bfloat16 (from ml_dtypes, as tritonclient uses); uint16 when it is missing."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a core dependency
        return np.dtype(np.uint16)
    return np.dtype(ml_dtypes.bfloat16)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class DataType:
    """A tensor element type.

    ``config_name`` is the config.toml / Triton JSON spelling (``TYPE_FP32``), ``wire_name``
    the protocol's (``FP32``), ``itemsize`` the bytes per element on the wire (0 for the
    variable-length BYTES type), ``numpy`` the dtype the model sees (``object`` for BYTES).
    """

    config_name: str
    wire_name: str
    numpy: np.dtype
    itemsize: int
    #: the variable-length BYTES type (``itemsize`` 0); an attribute: read per tensor
    is_bytes: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_bytes", self.itemsize == 0)

    @property
    def json_allowed(self) -> bool:
        """FP16 and BF16 have no JSON form in Triton (binary only, both ways)."""
        return self.wire_name not in ("FP16", "BF16")

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Unpickled as the one DataType of its name (checks compare them by identity)."""
        return _by_wire_name_strict, (self.wire_name,)


def _table() -> tuple[DataType, ...]:
    rows = [
        ("BOOL", np.dtype(np.bool_), 1),
        ("UINT8", np.dtype(np.uint8), 1),
        ("UINT16", np.dtype("<u2"), 2),
        ("UINT32", np.dtype("<u4"), 4),
        ("UINT64", np.dtype("<u8"), 8),
        ("INT8", np.dtype(np.int8), 1),
        ("INT16", np.dtype("<i2"), 2),
        ("INT32", np.dtype("<i4"), 4),
        ("INT64", np.dtype("<i8"), 8),
        ("FP16", np.dtype("<f2"), 2),
        ("BF16", bfloat16_dtype(), 2),
        ("FP32", np.dtype("<f4"), 4),
        ("FP64", np.dtype("<f8"), 8),
    ]
    table = [DataType("TYPE_" + wire, wire, dtype, size) for wire, dtype, size in rows]
    table.append(DataType("TYPE_STRING", "BYTES", np.dtype(object), 0))
    return tuple(table)


DATATYPES: tuple[DataType, ...] = _table()
_BY_CONFIG = {dt.config_name: dt for dt in DATATYPES}
#: wire name (``FP32``, ``BYTES``: protocol names, exact case) -> DataType; read per
#: request tensor without a call (``by_wire_name`` is the same lookup)
BY_WIRE_NAME: Mapping[str, DataType] = {dt.wire_name: dt for dt in DATATYPES}
_BY_WIRE = BY_WIRE_NAME


def by_config_name(name: str) -> DataType | None:
    """``TYPE_FP32`` or ``FP32`` (either spelling) -> DataType; also accepts ``STRING``/``BYTES``."""
    key = name if name.startswith("TYPE_") else "TYPE_" + name
    if key == "TYPE_BYTES":
        key = "TYPE_STRING"
    return _BY_CONFIG.get(key)


def by_wire_name(name: str) -> DataType | None:
    """``FP32`` / ``BYTES`` (protocol names, exact case) -> DataType."""
    return _BY_WIRE.get(name)


def _by_wire_name_strict(name: str) -> DataType:
    return _BY_WIRE[name]
