"""SharedMemoryManager: registration, bounds, key validation, and the lifetime rules
(deferred unregister while a request holds a lease, unmap only after the last view)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest

from nereid.errors import InternalError, InvalidInputError, ModelNotFoundError
from nereid.tensors.shared_memory import RESERVED_KEY_PREFIX, SHM_ROOT, RegionStatus, SharedMemoryManager

PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "shm"
    folder.mkdir()
    return folder


def make_object(root: Path, name: str, data: bytes) -> Path:
    path = root / name
    path.write_bytes(data)
    return path


def mapped(path: Path) -> bool:
    """Whether this process maps ``path`` (read from /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        return any(line.rstrip("\n").endswith(str(path)) or f"{path} (deleted)" in line for line in maps)


def test_registered_region_is_listed_with_its_key_offset_and_size(root: Path) -> None:
    make_object(root, "b", bytes(64))
    make_object(root, "a", bytes(64))
    shm = SharedMemoryManager(str(root))
    shm.register("second", "/b", 8, 32)
    shm.register("first", "a", 0, 64)  # a key without its leading '/' is accepted too
    assert shm.status() == [RegionStatus("first", "a", 0, 64), RegionStatus("second", "/b", 8, 32)]
    assert shm.status("second") == [RegionStatus("second", "/b", 8, 32)]


def test_resolve_reads_at_region_relative_offsets_past_an_unaligned_registration_offset(root: Path) -> None:
    data = bytes(range(256)) * (3 * PAGE // 256)
    make_object(root, "big", data)
    shm = SharedMemoryManager(str(root))
    shm.register("r", "/big", PAGE + 100, 1000)
    lease = shm.lease()
    view = lease.resolve("r", 10, 16)
    assert bytes(view) == data[PAGE + 110 : PAGE + 126]
    assert view.readonly
    lease.release()


def test_write_lands_in_the_shared_object(root: Path) -> None:
    path = make_object(root, "out", bytes(64))
    shm = SharedMemoryManager(str(root))
    shm.register("out", "/out", 16, 48)
    lease = shm.lease()
    lease.write("out", 4, memoryview(np.arange(4, dtype=np.float32)))
    lease.release()
    written = np.frombuffer(path.read_bytes()[20:36], dtype=np.float32)
    assert written.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("offset", "size", "message"),
    [
        pytest.param(64, 0, "Invalid offset for shared memory region: 'r' (offset 64 is beyond the region's 64 bytes)",
                     id="offset-at-end"),
        pytest.param(60, 8, "Invalid offset + byte size for shared memory region: 'r' "
                            "(offset 60 + byte size 8 > region size 64)", id="size-past-end"),
        pytest.param(32, 2**64 - 32, "Integer overflow detected: byte_size (18446744073709551584) + offset (32) "
                                     "exceeds maximum value (18446744073709551615) for region 'r'", id="overflow"),
    ],
)
def test_out_of_bounds_use_names_region_offset_size_and_region_size(
    root: Path, offset: int, size: int, message: str
) -> None:
    make_object(root, "r", bytes(64))
    shm = SharedMemoryManager(str(root))
    shm.register("r", "/r", 0, 64)
    lease = shm.lease()
    with pytest.raises(InvalidInputError) as resolved:
        lease.resolve("r", offset, size)
    assert resolved.value.message == message
    with pytest.raises(InvalidInputError):
        lease.write("r", 60, b"12345678")
    lease.release()


def test_unknown_region_is_a_key_error_to_resolve_and_not_found_to_write(root: Path) -> None:
    shm = SharedMemoryManager(str(root))
    lease = shm.lease()
    with pytest.raises(KeyError):
        lease.resolve("nope", 0, 4)
    with pytest.raises(ModelNotFoundError, match="Unable to find shared memory region: 'nope'"):
        lease.write("nope", 0, b"1234")
    with pytest.raises(ModelNotFoundError) as status:
        shm.status("nope")
    assert status.value.message == "Unable to find system shared memory region: 'nope'"


def test_registering_a_taken_name_is_refused(root: Path) -> None:
    make_object(root, "r", bytes(8))
    shm = SharedMemoryManager(str(root))
    shm.register("r", "/r", 0, 8)
    with pytest.raises(InvalidInputError) as error:
        shm.register("r", "/r", 0, 8)
    assert error.value.message == "shared memory region 'r' already in manager"


@pytest.mark.parametrize(
    "key", ["/a/b", "/../etc/passwd", "..", "/..", "/", "", "a\0b", "/.", "//a", "/x..y"],
    ids=["slash", "dotdot-path", "dotdot", "slash-dotdot", "bare-slash", "empty", "nul", "dot", "double-slash",
         "inner-dotdot"],
)
def test_keys_that_could_leave_the_shm_folder_are_refused(root: Path, key: str) -> None:
    shm = SharedMemoryManager(str(root))
    with pytest.raises(InvalidInputError, match="invalid key"):
        shm.register("r", key, 0, 8)
    assert len(shm) == 0


def test_reserved_python_backend_prefix_is_refused(root: Path) -> None:
    key = f"/{RESERVED_KEY_PREFIX}x"
    make_object(root, key[1:], bytes(8))
    shm = SharedMemoryManager(str(root))
    with pytest.raises(InvalidInputError) as error:
        shm.register("r", key, 0, 8)
    assert error.value.message == (
        f"cannot register shared memory region 'r' with key '{key}' as the key contains the reserved prefix "
        f"'{RESERVED_KEY_PREFIX}'"
    )


def test_a_symlink_in_the_shm_folder_is_not_followed(root: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(bytes(8))
    (root / "link").symlink_to(secret)
    shm = SharedMemoryManager(str(root))
    with pytest.raises(InternalError, match="Unable to open shared memory region: '/link'"):
        shm.register("r", "/link", 0, 8)


def test_missing_object_cannot_be_opened(root: Path) -> None:
    shm = SharedMemoryManager(str(root))
    with pytest.raises(InternalError) as error:
        shm.register("r", "/missing", 0, 8)
    assert error.value.message.startswith("Unable to open shared memory region: '/missing' (")
    assert "No such file or directory" in error.value.message


@pytest.mark.parametrize(("offset", "size"), [(0, 65), (1, 64), (64, 1), (65, 0)])
def test_registration_beyond_the_object_is_invalid_args(root: Path, offset: int, size: int) -> None:
    make_object(root, "r", bytes(64))
    shm = SharedMemoryManager(str(root))
    with pytest.raises(InvalidInputError, match=r"failed to register shared memory region 'r': invalid args \("):
        shm.register("r", "/r", offset, size)


def test_zero_byte_registration_is_invalid_args(root: Path) -> None:
    make_object(root, "r", bytes(64))
    with pytest.raises(InvalidInputError, match="byte_size must be greater than 0"):
        SharedMemoryManager(str(root)).register("r", "/r", 0, 0)


def test_unregistering_unknown_names_is_fine_and_all_clears_everything(root: Path) -> None:
    make_object(root, "r", bytes(8))
    shm = SharedMemoryManager(str(root))
    shm.unregister("never")
    shm.register("a", "/r", 0, 8)
    shm.register("b", "/r", 0, 8)
    shm.unregister_all()
    assert shm.status() == []


def test_unregister_of_a_leased_region_waits_for_the_lease(root: Path) -> None:
    path = make_object(root, "out", bytes(16))
    shm = SharedMemoryManager(str(root))
    shm.register("out", "/out", 0, 16)
    lease = shm.lease()
    lease.resolve("out", 0, 16)  # the codec resolves output regions when it parses
    shm.unregister("out")
    # Still listed and usable until the request is done (Triton's deferred unregister) ...
    assert [r.name for r in shm.status()] == ["out"]
    lease.write("out", 0, b"x" * 16)
    assert path.read_bytes() == b"x" * 16
    lease.release()
    # ... then gone without another unregister call.
    assert shm.status() == []
    assert "out" not in shm


def test_a_second_lease_keeps_a_retiring_region_until_it_is_released(root: Path) -> None:
    make_object(root, "r", bytes(8))
    shm = SharedMemoryManager(str(root))
    shm.register("r", "/r", 0, 8)
    first, second = shm.lease(), shm.lease()
    first.resolve("r", 0, 8)
    shm.unregister_all()
    second.resolve("r", 0, 8)
    first.release()
    assert "r" in shm
    second.release()
    second.release()  # idempotent
    assert "r" not in shm


def test_mapping_outlives_unregister_while_an_array_still_views_it(root: Path) -> None:
    path = make_object(root, "in", np.arange(4, dtype=np.int32).tobytes())
    shm = SharedMemoryManager(str(root))
    shm.register("in", "/in", 0, 16)
    lease = shm.lease()
    array = np.ndarray((4,), np.int32, lease.resolve("in", 0, 16), 0)  # as the codec builds inputs
    lease.release()
    shm.unregister("in")
    assert shm.status() == []
    assert mapped(path)  # the model may still hold its input: no unmap under it
    assert array.tolist() == [0, 1, 2, 3]
    del array
    gc.collect()
    assert not mapped(path)


def test_unregister_without_leases_unmaps_at_once(root: Path) -> None:
    path = make_object(root, "r", bytes(8))
    shm = SharedMemoryManager(str(root))
    shm.register("r", "/r", 0, 8)
    assert mapped(path)
    shm.unregister("r")
    gc.collect()
    assert not mapped(path)


def test_real_dev_shm_object_registers_by_posix_key() -> None:
    name = f"nereid_unit_{os.getpid()}"
    path = Path(SHM_ROOT) / name
    path.write_bytes(b"hello world!")
    try:
        shm = SharedMemoryManager()
        shm.register("r", "/" + name, 6, 6)
        lease = shm.lease()
        assert bytes(lease.resolve("r", 0, 5)) == b"world"
        lease.release()
        shm.close()
        assert shm.status() == []
    finally:
        path.unlink()
