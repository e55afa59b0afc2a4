"""System shared-memory regions registered by clients: open, map, bounds-check, lease.

Owns the bookkeeping of Triton's ``systemsharedmemory`` extension: which region name maps
which POSIX shared-memory object (``/dev/shm/<key>``), and which requests still use it.
Knows nothing about HTTP or JSON; errors are NereidErrors that name the region.

Lifetime rules (the reason this module exists):

* A request takes a :class:`RegionLease` and resolves its regions through it. Each region
  it touches is *pinned* until ``lease.release()``, so an output is written to the region
  that was resolved when the request was parsed, even if it was unregistered meanwhile.
* ``unregister`` of a pinned region is deferred, not refused (Triton's behaviour): the
  region stays listed and usable until its last lease is released, then it leaves.
* The mapping itself is never closed explicitly. numpy arrays made from a view keep a
  reference to the ``mmap`` object but no buffer export, so ``mmap.close()`` would
  succeed under them and leave dangling pointers. Instead the manager just drops its
  reference: CPython unmaps when the last view or array made from the region dies.
"""

from __future__ import annotations

import logging
import mmap
import os
import stat
from dataclasses import dataclass
from typing import Any

from nereid.errors import InternalError, InvalidInputError, ModelNotFoundError

__all__ = ["SharedMemoryManager", "RegionLease", "RegionStatus", "RESERVED_KEY_PREFIX", "SHM_ROOT"]

_log = logging.getLogger("nereid.tensors.shared_memory")

#: Where POSIX shared-memory objects live on Linux; keys are opened here and only here.
SHM_ROOT = "/dev/shm"
#: Keys Triton's Python backend uses for its own regions; clients may not register them.
RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"
_U64_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """One registered region as ``.../status`` lists it."""

    name: str
    key: str
    offset: int
    byte_size: int


class _Region:
    """A mapped region: ``mapping[base : base + byte_size]`` is the registered part."""

    __slots__ = ("name", "key", "offset", "byte_size", "mapping", "base", "pins", "retiring")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, mapping: mmap.mmap, base: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.mapping: mmap.mmap | None = mapping
        self.base = base
        self.pins = 0
        self.retiring = False

    def check(self, offset: int, byte_size: int) -> int:
        """The absolute start in ``mapping`` of ``[offset, offset + byte_size)``, or an
        InvalidInputError naming the region, the request and the region's size."""
        size = self.byte_size
        if offset >= size:
            raise InvalidInputError(
                f"Invalid offset for shared memory region: '{self.name}' "
                f"(offset {offset} is beyond the region's {size} bytes)"
            )
        if byte_size > _U64_MAX - offset:
            raise InvalidInputError(
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds maximum "
                f"value ({_U64_MAX}) for region '{self.name}'"
            )
        if offset + byte_size > size:
            raise InvalidInputError(
                f"Invalid offset + byte size for shared memory region: '{self.name}' "
                f"(offset {offset} + byte size {byte_size} > region size {size})"
            )
        return self.base + offset


class RegionLease:
    """The regions one request uses, pinned until :meth:`release`.

    ``resolve`` and ``write`` have the shapes the HTTP codec expects
    (``ShmResolver``/``ShmWriter``). ``resolve`` raises KeyError for an unknown region.
    A lease is single-use and lives on the event loop, like the manager.
    """

    __slots__ = ("_manager", "_pinned")

    def __init__(self, manager: SharedMemoryManager) -> None:
        self._manager = manager
        self._pinned: dict[str, _Region] | None = None

    def _pin(self, name: str) -> _Region:
        pinned = self._pinned
        if pinned is not None:
            region = pinned.get(name)
            if region is not None:
                return region
        region = self._manager._regions[name]  # KeyError: unknown region
        region.pins += 1
        if pinned is None:
            pinned = self._pinned = {}
        pinned[name] = region
        return region

    def resolve(self, name: str, offset: int, byte_size: int) -> memoryview:
        """A read-only view of ``byte_size`` bytes at ``offset`` in region ``name``."""
        region = self._pin(name)
        start = region.check(offset, byte_size)
        assert region.mapping is not None  # pinned regions keep their mapping
        return memoryview(region.mapping)[start : start + byte_size].toreadonly()

    def write(self, name: str, offset: int, data: Any) -> None:
        """Copy ``data`` (any C-contiguous buffer) to ``offset`` in region ``name``."""
        try:
            region = self._pin(name)
        except KeyError:
            raise ModelNotFoundError(f"Unable to find shared memory region: '{name}'") from None
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        start = region.check(offset, view.nbytes)
        assert region.mapping is not None
        region.mapping[start : start + view.nbytes] = view

    def release(self) -> None:
        """Unpin every region this lease touched (idempotent)."""
        pinned, self._pinned = self._pinned, None
        if pinned:
            for region in pinned.values():
                self._manager._unpin(region)


class SharedMemoryManager:
    """Client-registered system shared-memory regions, by name.

    Used from the event loop only (no locks). ``root`` is where keys are opened
    (``/dev/shm``; tests may point it elsewhere).
    """

    def __init__(self, root: str = SHM_ROOT) -> None:
        self._root = root
        self._regions: dict[str, _Region] = {}
        #: whether any region is registered: with none, a request's lease has nothing to
        #: pin (a caller may skip it: a plain attribute, read without a call)
        self.in_use = False

    # -- registration ------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the shared-memory object ``key`` as
        region ``name``. Errors: reserved or malformed key, name taken, out of bounds
        (400); the object cannot be opened (500, as Triton)."""
        if RESERVED_KEY_PREFIX in key:
            raise InvalidInputError(
                f"cannot register shared memory region '{name}' with key '{key}' as the key contains the "
                f"reserved prefix '{RESERVED_KEY_PREFIX}'"
            )
        if name in self._regions:
            raise InvalidInputError(f"shared memory region '{name}' already in manager")
        path = self._path_of(name, key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InternalError(
                f"Unable to open shared memory region: '{key}' ({path}: {exc.strerror or exc})"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInputError(
                    f"failed to register shared memory region '{name}': key '{key}' is not a shared memory object"
                )
            if offset + byte_size > info.st_size:
                raise InvalidInputError(
                    f"failed to register shared memory region '{name}': invalid args (offset {offset} + "
                    f"byte_size {byte_size} > {info.st_size} bytes in '{key}')"
                )
            if byte_size == 0:
                raise InvalidInputError(
                    f"failed to register shared memory region '{name}': invalid args (byte_size must be "
                    "greater than 0)"
                )
            # mmap offsets must be page-aligned: map from the page holding `offset`.
            base = offset % mmap.ALLOCATIONGRANULARITY
            try:
                mapping = mmap.mmap(
                    fd, base + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset - base
                )
            except (OSError, ValueError, OverflowError) as exc:
                raise InvalidInputError(
                    f"failed to register shared memory region '{name}': unable to process address space: {exc}"
                ) from None
        finally:
            os.close(fd)
        self._regions[name] = _Region(name, key, offset, byte_size, mapping, base)
        self.in_use = True
        _log.debug(
            "system shared memory region '%s' registered: key '%s', offset %d, byte_size %d",
            name, key, offset, byte_size,
        )

    def _path_of(self, name: str, key: str) -> str:
        """``<root>/<key without its one leading '/'>``; anything that could leave the
        root (more slashes, '..', NUL) is refused."""
        bare = key[1:] if key.startswith("/") else key
        if not bare or "/" in bare or "\0" in bare or ".." in bare or bare == ".":
            raise InvalidInputError(
                f"failed to register shared memory region '{name}': invalid key '{key}': expected a POSIX "
                "shared memory name such as '/my_region' (one leading '/', no other '/', no '..', no NUL)"
            )
        return os.path.join(self._root, bare)

    def unregister(self, name: str) -> None:
        """Forget region ``name`` (unknown names are fine). A region pinned by in-flight
        requests leaves when the last of them releases it."""
        region = self._regions.get(name)
        if region is None:
            return
        if region.pins:
            region.retiring = True
            _log.debug(
                "shared memory region '%s' will be unregistered after in-flight requests complete", name
            )
            return
        self._drop(region)

    def unregister_all(self) -> None:
        for name in list(self._regions):
            self.unregister(name)

    def close(self) -> None:
        """Unregister everything (server shutdown)."""
        self.unregister_all()

    # -- queries -----------------------------------------------------------------------

    def status(self, name: str | None = None) -> list[RegionStatus]:
        """Every region sorted by name, or just ``name`` (ModelNotFoundError if unknown)."""
        if name:
            region = self._regions.get(name)
            if region is None:
                raise ModelNotFoundError(f"Unable to find system shared memory region: '{name}'")
            regions = [region]
        else:
            regions = [self._regions[n] for n in sorted(self._regions)]
        return [RegionStatus(r.name, r.key, r.offset, r.byte_size) for r in regions]

    def __contains__(self, name: object) -> bool:
        return name in self._regions

    def __len__(self) -> int:
        return len(self._regions)

    def lease(self) -> RegionLease:
        """A new lease for one request; release it when the request is done."""
        return RegionLease(self)

    # -- internals ---------------------------------------------------------------------

    def _unpin(self, region: _Region) -> None:
        region.pins -= 1
        if region.pins == 0 and region.retiring:
            self._drop(region)

    def _drop(self, region: _Region) -> None:
        if self._regions.get(region.name) is region:
            del self._regions[region.name]
            self.in_use = bool(self._regions)
        # No mapping.close(): arrays built on views keep the mmap object alive without a
        # buffer export; CPython unmaps once the last of them is gone.
        region.mapping = None
        _log.debug("system shared memory region '%s' unregistered", region.name)
