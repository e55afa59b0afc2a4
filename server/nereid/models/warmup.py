"""Warmup: build a model's ``[[model_warmup]]`` samples and run them on every instance
before the model version turns READY.

Owns the sample data (zero, random, or read from ``input_data_file`` in Triton's raw
format) and running it. build_samples reads only the sample files; run_warmup calls the
instances' ``run_batch`` directly (no queue, no statistics). Knows nothing about HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Protocol, Sequence

import numpy as np

from nereid.config.schema import ModelConfig, ModelWarmup, WarmupInput
from nereid.errors import ModelLoadError, NereidError
from nereid.inference import InferRequest

__all__ = ["WarmupSample", "build_samples", "run_warmup", "WARMUP_FOLDER"]

#: Triton looks for ``input_data_file`` in this subfolder of the model folder; nereid
#: looks there first, then in the model folder itself.
WARMUP_FOLDER = "warmup"

_RANDOM_INT_HIGH = 100  # random integers are drawn from [0, 100): valid ids and counts
_RANDOM_STRING_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One ``[[model_warmup]]`` entry, ready to run: ``request`` holds the whole sample
    (``batch_size`` rows when the model batches), to be run ``count`` times per instance.
    ``label`` names it in reasons: ``'name' (model_warmup[i])``."""

    label: str
    request: InferRequest
    count: int


class _BatchResult(Protocol):
    @property
    def error(self) -> NereidError | None: ...


class _Instance(Protocol):
    name: str

    def run_batch(self, requests: Sequence[InferRequest], /) -> Awaitable[Any]: ...


def build_samples(
    config: ModelConfig,
    model_dir: Path,
    *,
    model_version: int | None = None,
    rng: np.random.Generator | None = None,
) -> list[WarmupSample]:
    """The warmup samples of ``config`` in order, with their data built.

    Each input's data has the sample's ``dims``; when ``max_batch_size > 0`` it is
    repeated ``batch_size`` times along a new first (batch) axis, as Triton does.
    ``zero_data`` is zeros (empty strings for STRING); ``random_data`` is uniform in
    [0, 1) for floats, integers in [0, 100) (clipped to the type) for integers, random
    booleans, and short random lowercase/digit strings for STRING. ``input_data_file``
    is read from ``<model_dir>/warmup/`` (Triton's place) or else ``<model_dir>``: raw
    little-endian bytes of the elements in row-major order, or for STRING each element
    as a 4-byte little-endian length and then its bytes; the file must hold at least the
    sample's elements (extra bytes are ignored, as in Triton).

    Raises ModelLoadError whose reason names the file and the key
    (``model_warmup[0].inputs.INPUT0.input_data_file``).
    """
    rng = rng if rng is not None else np.random.default_rng()
    samples: list[WarmupSample] = []
    for index, warmup in enumerate(config.model_warmup):
        label = f"'{warmup.name}' (model_warmup[{index}])" if warmup.name else f"model_warmup[{index}]"
        inputs = {
            name: _batched(
                _sample_data(config.name, model_dir, f"model_warmup[{index}].inputs.{name}", spec, rng),
                warmup,
                config,
            )
            for name, spec in warmup.inputs.items()
        }
        rows = warmup.batch_size if config.max_batch_size > 0 else 1
        request = InferRequest(
            model_name=config.name,
            inputs=inputs,
            rows=rows,
            id=f"warmup {label}",
            model_version=model_version,
        )
        samples.append(WarmupSample(label, request, warmup.count))
    return samples


async def run_warmup(samples: Sequence[WarmupSample], instances: Sequence[_Instance], model_name: str) -> None:
    """Run every sample ``count`` times on every instance (instances in parallel, samples
    in order on each; each run gets its own copy of the sample's arrays). Raises ModelLoadError naming the sample, the instance and the error
    of the first failure; the model must then not turn READY."""
    if not samples:
        return

    async def warm(instance: _Instance) -> None:
        for sample in samples:
            for _ in range(sample.count):
                # a fresh copy per run: a model may write into its input arrays
                request = dataclasses.replace(
                    sample.request, inputs={name: array.copy() for name, array in sample.request.inputs.items()}
                )
                try:
                    outcome: _BatchResult = await instance.run_batch([request])
                    error = outcome.error
                except NereidError as exc:
                    error = exc
                if error is not None:
                    raise ModelLoadError(
                        model_name,
                        f"warmup sample {sample.label} failed on instance {instance.name}: {error.message}",
                    )

    results = await asyncio.gather(*(warm(instance) for instance in instances), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def _batched(data: np.ndarray, warmup: ModelWarmup, config: ModelConfig) -> np.ndarray:
    if config.max_batch_size <= 0:
        return data
    return np.repeat(data[np.newaxis, ...], warmup.batch_size, axis=0)


def _sample_data(model: str, model_dir: Path, key: str, spec: WarmupInput, rng: np.random.Generator) -> np.ndarray:
    shape = tuple(spec.dims)
    count = math.prod(shape)
    dtype = spec.data_type
    if spec.input_data_file:
        return _from_file(model, model_dir, key, spec, count).reshape(shape)
    if dtype.is_bytes:
        if spec.random_data:
            lengths = rng.integers(1, 9, size=count)
            items = [bytes(rng.choice(_RANDOM_STRING_ALPHABET, size=int(n)).tobytes()) for n in lengths]
        else:
            items = [b""] * count
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    if spec.zero_data:
        return np.zeros(shape, dtype=dtype.numpy)
    kind = dtype.numpy.kind
    if kind == "b":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if kind in "iu":
        high = min(_RANDOM_INT_HIGH, int(np.iinfo(dtype.numpy).max) + 1)
        return rng.integers(0, high, size=shape).astype(dtype.numpy)
    # floats: FP16 / FP32 / FP64 and BF16 (an ml_dtypes type numpy can cast to)
    return rng.random(size=shape).astype(dtype.numpy)


def _from_file(model: str, model_dir: Path, key: str, spec: WarmupInput, count: int) -> np.ndarray:
    name = spec.input_data_file
    where = f"{model_dir / name}: {key}.input_data_file"
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ModelLoadError(
            model, f"{where}: expected a file name inside the model folder, got {name!r}", str(model_dir / name)
        )
    candidates = (model_dir / WARMUP_FOLDER / name, model_dir / name)
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise ModelLoadError(
            model,
            f"{where}: file not found (looked in {candidates[0].parent}/ and {candidates[1].parent}/)",
            str(candidates[0]),
        )
    where = f"{path}: {key}.input_data_file"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(model, f"{where}: cannot read: {exc.strerror or exc}", str(path)) from exc
    dtype = spec.data_type
    if dtype.is_bytes:
        return _strings_from(raw, count, model, where, str(path))
    needed = count * dtype.itemsize
    if len(raw) < needed:
        raise ModelLoadError(
            model,
            f"{where}: expected at least {needed} bytes ({count} x {dtype.wire_name} for dims "
            f"{list(spec.dims)}), got {len(raw)}",
            str(path),
        )
    if dtype.numpy.kind == "b":
        return np.not_equal(np.frombuffer(raw, dtype=np.uint8, count=count), 0)
    return np.frombuffer(raw, dtype=dtype.numpy, count=count).copy()


def _strings_from(raw: bytes, count: int, model: str, where: str, path: str) -> np.ndarray:
    items: list[bytes] = []
    offset = 0
    for index in range(count):
        if offset + 4 > len(raw):
            raise ModelLoadError(
                model,
                f"{where}: expected {count} length-prefixed STRING elements, the file ends "
                f"in element {index} (at byte {offset})",
                path,
            )
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise ModelLoadError(
                model,
                f"{where}: STRING element {index} declares {length} bytes at byte {offset - 4}, "
                f"but only {len(raw) - offset} remain",
                path,
            )
        items.append(raw[offset : offset + length])
        offset += length
    array = np.empty(count, dtype=object)
    array[:] = items
    return array
