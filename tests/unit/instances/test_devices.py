"""Instance groups made concrete: KIND_AUTO/KIND_GPU/KIND_CPU and one device per instance,
with the GPU count stood in (so the GPU rules are checked on any host)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import nereid.instances.devices
from nereid.config.schema import InstanceGroup, ModelConfig
from nereid.instances.devices import (
    GpuInventory, isolation_of, placements, process_hosts, processes_of, resolve_instance_groups,
)
from nereid.errors import ModelLoadError

CONFIG_PATH = Path("/models/m/config.toml")


def config(*groups: InstanceGroup) -> ModelConfig:
    return ModelConfig(name="m", instance_group=groups)


def resolve(cfg: ModelConfig, visible: int, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelConfig, int]:
    """The resolved config, and how many times the GPUs were counted."""
    probes = []

    def probe() -> int:
        probes.append(1)
        return visible

    monkeypatch.setattr(nereid.instances.devices, "_visible_gpus", probe)
    return asyncio.run(resolve_instance_groups(cfg, CONFIG_PATH, GpuInventory())), len(probes)


def test_no_instance_group_is_one_instance_on_every_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    resolved, probes = resolve(config(), 2, monkeypatch)
    assert resolved.instance_group == (InstanceGroup(name="m", kind="KIND_GPU", count=1, gpus=(0, 1)),)
    assert placements(resolved) == [(resolved.instance_group[0], "cuda:0"), (resolved.instance_group[0], "cuda:1")]
    assert probes == 1


def test_isolation_not_set_is_a_process_on_a_gpu_and_a_thread_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = (InstanceGroup(name="g", kind="KIND_AUTO"), InstanceGroup(name="c", kind="KIND_CPU"),
              InstanceGroup(name="t", kind="KIND_GPU", isolation="thread"))
    resolved, _ = resolve(config(*groups), 1, monkeypatch)
    assert [isolation_of(group) for group in resolved.instance_group] == ["process", "thread", "thread"]


def test_kind_auto_without_a_gpu_is_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    resolved, _ = resolve(config(InstanceGroup(kind="KIND_AUTO", count=3)), 0, monkeypatch)
    group = resolved.instance_group[0]
    assert (group.kind, group.gpus, group.name) == ("KIND_CPU", (), "m")
    assert [device for _, device in placements(resolved)] == ["cpu"] * 3


def test_kind_gpu_places_count_instances_on_each_listed_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    resolved, _ = resolve(config(InstanceGroup(name="g", kind="KIND_GPU", count=2, gpus=(1,))), 2, monkeypatch)
    assert [device for _, device in placements(resolved)] == ["cuda:1", "cuda:1"]


def test_cpu_only_configs_never_count_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    _, probes = resolve(config(InstanceGroup(kind="KIND_CPU", count=2)), 1, monkeypatch)
    assert probes == 0


def test_kind_gpu_without_a_gpu_fails_naming_the_file_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelLoadError) as raised:
        resolve(config(InstanceGroup(kind="KIND_CPU"), InstanceGroup(kind="KIND_GPU")), 0, monkeypatch)
    assert raised.value.message == (
        f"{CONFIG_PATH}: instance_group[1].kind: KIND_GPU requested but no GPU is visible "
        f"({nereid.instances.devices._why_no_gpu()})"
    )


@pytest.mark.parametrize(
    ("devices", "torch", "why"),
    [
        ([], True, "no NVIDIA device on this host"),
        (["/dev/nvidia0"], False, "torch is not installed, and nereid sees GPUs through torch: install torch, "
                                  "or nereid's examples extra"),
        (["/dev/nvidia0"], True, "torch.cuda.is_available() is False"),
    ],
    ids=["no-device", "device-without-torch", "device-with-torch"],
)
def test_why_no_gpu_is_visible_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, devices: list[str], torch: bool, why: str
) -> None:
    """A core install (no torch) on a GPU host is told that torch is what it lacks."""
    monkeypatch.setattr(nereid.instances.devices.glob, "glob", lambda pattern: devices)
    real_find_spec = nereid.instances.devices.importlib.util.find_spec
    monkeypatch.setattr(nereid.instances.devices.importlib.util, "find_spec",
                        lambda name: (real_find_spec("json") if torch else None) if name == "torch" else real_find_spec(name))
    assert nereid.instances.devices._why_no_gpu() == why


def test_a_gpu_index_beyond_the_visible_ones_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelLoadError) as raised:
        resolve(config(InstanceGroup(kind="KIND_GPU", gpus=(0, 2))), 2, monkeypatch)
    assert raised.value.message == (
        f"{CONFIG_PATH}: instance_group[0].gpus: GPU 2 does not exist (visible GPUs: [0, 1])"
    )


def test_processes_not_set_share_one_per_gpu_and_give_one_each_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = (InstanceGroup(name="g", kind="KIND_GPU", count=2), InstanceGroup(name="c", kind="KIND_CPU", isolation="process"))
    resolved, _ = resolve(config(*groups), 2, monkeypatch)
    assert [processes_of(group) for group in resolved.instance_group] == ["per_device", "per_instance"]
    # g: 2 on cuda:0, 2 on cuda:1; c: 1 on the CPU
    assert process_hosts(placements(resolved)) == [0, 0, 1, 1, 2]


def test_per_device_instances_share_a_process_across_groups_and_threads_have_none() -> None:
    on_gpu = InstanceGroup(name="a", kind="KIND_GPU", count=1, gpus=(0,))
    also_on_gpu = InstanceGroup(name="b", kind="KIND_GPU", count=2, gpus=(0,))
    split = InstanceGroup(name="s", kind="KIND_GPU", count=2, gpus=(0,), processes="per_instance")
    threads = InstanceGroup(name="t", kind="KIND_GPU", count=1, gpus=(0,), isolation="thread")
    cpu_shared = InstanceGroup(name="c", kind="KIND_CPU", count=2, isolation="process", processes="per_device")
    resolved = config(on_gpu, threads, split, also_on_gpu, cpu_shared)
    assert process_hosts(placements(resolved)) == [0, None, 1, 2, 0, 0, 3, 3]


def test_processes_on_a_group_of_threads_is_a_load_error_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    group = InstanceGroup(name="c", kind="KIND_CPU", processes="per_device")
    with pytest.raises(ModelLoadError) as caught:
        resolve(config(InstanceGroup(name="g", kind="KIND_CPU"), group), 0, monkeypatch)
    assert caught.value.reason == (
        f"{CONFIG_PATH}: instance_group[1].processes: only for process instances, and this group's instances are "
        'threads (kind KIND_CPU, no isolation set): set isolation = "process"'
    )
