"""Where a model's instances run: the GPUs torch can see, and instance groups made concrete.

Turns a config's ``[[instance_group]]`` entries (KIND_AUTO, KIND_GPU, KIND_CPU, ``gpus``)
into resolved groups and one device string per instance (``"cpu"``, ``"cuda:N"``), with
load errors that name the config file and key. torch is imported lazily, only on a host
with NVIDIA device nodes, and never on the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import importlib.util
from pathlib import Path

from nereid.config.schema import InstanceGroup, ModelConfig
from nereid.errors import ModelLoadError

__all__ = ["GpuInventory", "isolation_of", "placements", "process_hosts", "processes_of", "resolve_instance_groups"]


class GpuInventory:
    """The number of GPUs torch can see, counted once per server.

    The first count imports torch and initialises CUDA, which takes seconds on a GPU host
    (4.5 s measured on an H100 machine): it runs on a worker thread, so requests and other
    loads go on meanwhile."""

    def __init__(self) -> None:
        self._count: int | None = None

    async def count(self) -> int:
        if self._count is None:
            self._count = await asyncio.to_thread(_visible_gpus)
        return self._count


async def resolve_instance_groups(config: ModelConfig, config_path: Path, gpus: GpuInventory) -> ModelConfig:
    """``config`` with every instance group concrete: KIND_AUTO becomes KIND_GPU when a GPU
    is visible (else KIND_CPU), as Triton does for the Python backend; a KIND_GPU group
    without ``gpus`` gets all of them; no ``[[instance_group]]`` means one KIND_AUTO group.
    Raises ModelLoadError for KIND_GPU without a GPU, a GPU index that does not exist, or
    ``processes`` on a group whose instances are threads."""
    groups = config.instance_group or (InstanceGroup(name=config.name),)
    count = await gpus.count() if any(group.kind != "KIND_CPU" for group in groups) else 0
    resolved: list[InstanceGroup] = []
    for index, group in enumerate(groups):
        kind = group.kind
        if kind == "KIND_AUTO":
            kind = "KIND_GPU" if count > 0 else "KIND_CPU"
        if kind == "KIND_GPU":
            if count == 0:
                raise ModelLoadError(
                    config.name,
                    f"{config_path}: instance_group[{index}].kind: KIND_GPU requested but no GPU is visible "
                    f"({_why_no_gpu()})",
                )
            for gpu in group.gpus:
                if gpu >= count:
                    raise ModelLoadError(
                        config.name,
                        f"{config_path}: instance_group[{index}].gpus: GPU {gpu} does not exist "
                        f"(visible GPUs: {list(range(count))})",
                    )
            if not group.gpus:
                group = dataclasses.replace(group, gpus=tuple(range(count)))
        group = dataclasses.replace(group, kind=kind, name=group.name or config.name)
        if group.processes and isolation_of(group) == "thread":
            raise ModelLoadError(
                config.name,
                f"{config_path}: instance_group[{index}].processes: only for process instances, and this "
                f'group\'s instances are threads (kind {kind}, no isolation set): set isolation = "process"',
            )
        resolved.append(group)
    return dataclasses.replace(config, instance_group=tuple(resolved))


def placements(config: ModelConfig) -> list[tuple[InstanceGroup, str]]:
    """One (group, device) per instance of a resolved config: ``count`` instances on each
    of a KIND_GPU group's GPUs, ``count`` on the CPU otherwise."""
    found: list[tuple[InstanceGroup, str]] = []
    for group in config.instance_group:
        if group.kind == "KIND_GPU":
            for gpu in group.gpus:
                found.extend((group, f"cuda:{gpu}") for _ in range(group.count))
        else:
            found.extend((group, "cpu") for _ in range(group.count))
    return found


def isolation_of(group: InstanceGroup) -> str:
    """How a resolved group's instances run: its ``isolation``, or when not set a process
    on a GPU (the model's Python, torch's dispatch included, must not share a GIL with the
    server's parsing and answering) and a thread on the CPU."""
    return group.isolation or ("process" if group.kind == "KIND_GPU" else "thread")


def processes_of(group: InstanceGroup) -> str:
    """How a resolved group's process instances are laid out: its ``processes``, or when
    not set ``"per_device"`` on a GPU (one CUDA context, so the instances' kernels overlap
    instead of time-slicing the GPU) and ``"per_instance"`` on the CPU (a GIL each)."""
    return group.processes or ("per_device" if group.kind == "KIND_GPU" else "per_instance")


def process_hosts(placed: list[tuple[InstanceGroup, str]]) -> list[int | None]:
    """For each placement (``placements()``), the worker process its instance runs in,
    numbered from 0 in order of first use (instances with the same number share one
    process), or None for a thread instance. ``per_device`` instances on one device share
    a process, across the model's groups; ``per_instance`` ones have one each."""
    hosts: list[int | None] = []
    shared: dict[str, int] = {}
    count = 0
    for group, device in placed:
        if isolation_of(group) == "thread":
            hosts.append(None)
            continue
        if processes_of(group) == "per_device":
            if device not in shared:
                shared[device] = count
                count += 1
            hosts.append(shared[device])
        else:
            hosts.append(count)
            count += 1
    return hosts


def _visible_gpus() -> int:
    """GPUs torch can see; 0 without importing torch when no NVIDIA device node exists."""
    if not glob.glob("/dev/nvidia[0-9]*"):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # a broken driver counts as no GPU
        return 0


def _why_no_gpu() -> str:
    """Why no GPU counts, for KIND_GPU's load error. Cheap (torch is looked for, not
    imported): it runs on the event loop."""
    if not glob.glob("/dev/nvidia[0-9]*"):
        return "no NVIDIA device on this host"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed, and nereid sees GPUs through torch: install torch, or nereid's examples extra"
    return "torch.cuda.is_available() is False"
