#!/usr/bin/env python3
"""The 2-core stand-in for a GPU model: does nereid keep a fixed-time, GIL-free model busy?

The stand-in's batch of up to 128 rows takes a fixed time (``time.sleep``: the GIL is
released, as a GPU kernel's wait does) whatever its size, with BERT-sized tensors
(``INPUT_IDS``: 128 INT64 in, ``EMBEDDING``: 768 FP32 out, max_batch_size 128). Its offline
limit is therefore known: 128 rows per batch time (2,560 rows/s at 50 ms, 6,400 at 20 ms).
nereid serves it (one thread instance, or a process with ``--isolation process``;
``max_queue_delay_microseconds = 0``; ``--nereid-arg`` adds to both builds' command line) and the stock
perf_analyzer (``-b 1``, binary tensors) drives it: 50 ms at concurrency 256 and 20 ms at
concurrency 64 by default. Served throughput is printed against the limit, with the mean
batch the server formed and, where the build reports it (``scheduling`` in the statistics),
the share of wall time the instance was busy.

    .venv/bin/python perf/bench_pipeline.py
    .venv/bin/python perf/bench_pipeline.py --repeats 3 \\
        --baseline-cmd 'env PYTHONPATH=/tmp/nereid-before/server .venv/bin/python -m nereid'
    .venv/bin/python perf/bench_pipeline.py --csv perf/plots/pipeline.csv --plot perf/plots/pipeline.png

With --baseline-cmd another build serves the same models, interleaved with this one (for
each repeat and scenario: this build, then the baseline, the order flipped every repeat).
Reuses bench_identity's server and perf_analyzer runner. Exit status as bench_identity's.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_identity  # noqa: E402  (a sibling script: perf/ is not a package)

ROWS = 128  # max_batch_size: a batch of up to this many rows takes the fixed time

CONFIG_TOML = """\
# written by perf/bench_pipeline.py: a stand-in for a GPU model ({ms} ms per batch)
name = "{name}"
max_batch_size = {rows}

[[input]]
name = "INPUT_IDS"
data_type = "TYPE_INT64"
dims = [128]
{mask}
[[output]]
name = "EMBEDDING"
data_type = "TYPE_FP32"
dims = [768]

[dynamic_batching]
max_queue_delay_microseconds = 0

[[instance_group]]
count = {instances}
kind = "KIND_CPU"
isolation = "{isolation}"
"""

MODEL_PY = '''\
# written by perf/bench_pipeline.py: every batch takes {seconds} s with the GIL released.
import time

import numpy as np


class Model:
    def infer(self, inputs):
        rows = len(inputs["INPUT_IDS"])
        time.sleep({seconds})
        return {{"EMBEDDING": np.zeros((rows, 768), np.float32)}}
'''


@dataclass(frozen=True)
class Scenario:
    batch_ms: int
    concurrency: int
    #: thread instances, each taking the fixed time per batch (as instances sharing a GPU
    #: whose batches overlap would at best)
    instances: int = 1

    @property
    def model(self) -> str:
        return f"standin_{self.batch_ms}ms" + (f"_x{self.instances}" if self.instances > 1 else "")

    @property
    def limit(self) -> float:
        """The offline limit, rows/s: full batches back to back on every instance."""
        return self.instances * ROWS / (self.batch_ms / 1000)

    @property
    def cohort_bound(self) -> float:
        """rows/s if the clients split into two cohorts per instance taking turns (a batch
        of c/2 per batch time on one instance), which a free instance taking whatever is
        queued (queue delay 0) gets below 2 x max_batch_size clients per instance."""
        return self.instances * min(ROWS, self.concurrency // (2 * self.instances)) / (self.batch_ms / 1000)

    @property
    def label(self) -> str:
        return f"{self.batch_ms} ms, c={self.concurrency}" + (f", {self.instances} inst" if self.instances > 1 else "")


#: the second input of ``--inputs 2`` (BERT's attention mask)
MASK_INPUT = """
[[input]]
name = "ATTENTION_MASK"
data_type = "TYPE_INT64"
dims = [128]
"""


def write_repo(root: Path, scenarios: list[Scenario], isolation: str = "thread", inputs: int = 1) -> None:
    for batch_ms, instances in sorted({(s.batch_ms, s.instances) for s in scenarios}):
        name = Scenario(batch_ms, 0, instances).model
        folder = root / name / "1"
        folder.mkdir(parents=True)
        (root / name / "config.toml").write_text(
            CONFIG_TOML.format(name=name, ms=batch_ms, rows=ROWS, instances=instances, isolation=isolation,
                               mask=MASK_INPUT if inputs == 2 else ""))
        (folder / "model.py").write_text(MODEL_PY.format(seconds=batch_ms / 1000))


class StandInServer(bench_identity.Nereid):
    """nereid (this checkout, or ``cmd``) serving the stand-in models."""

    def __init__(self, log_dir: Path, args: argparse.Namespace, name: str, cmd: str | None) -> None:
        self.name = name
        bench_identity.Server.__init__(self, log_dir)
        self.args = args
        self.cmd = cmd
        self.metrics_port = bench_identity.free_port()
        self.grpc_port = bench_identity.free_port()
        self.model_repo = log_dir / f"model_repository_{name}"
        write_repo(self.model_repo, args.scenarios, args.isolation, args.inputs)

    def command(self) -> list[str]:
        base = self.cmd.split() if self.cmd else [sys.executable, "-m", "nereid"]
        return base + ["serve", "--model-repository", str(self.model_repo), "--http-port", str(self.port),
                       "--metrics-port", str(self.metrics_port), "--grpc-port", str(self.grpc_port),
                       *self.args.nereid_arg]

    def stats(self) -> dict[str, Any]:
        url = f"http://{self.url}/v2/models/{self.model}/stats"
        with urllib.request.urlopen(url, timeout=5) as r:
            entry: dict[str, Any] = json.load(r)["model_stats"][0]
        return entry


@dataclass
class Result:
    server: str
    scenario: Scenario
    repeat: int
    run: bench_identity.Run
    mean_batch: float
    busy_share: float  # of wall time, from the build's own statistics (nan if it has none)


def measure(args: argparse.Namespace, server: StandInServer, scenario: Scenario, repeat: int, work: Path) -> Result:
    server.model = scenario.model
    before, t0 = server.stats(), time.monotonic_ns()
    run = bench_identity.run_level(args, server, scenario.concurrency, repeat, work)
    after, t1 = server.stats(), time.monotonic_ns()
    batches = after["execution_count"] - before["execution_count"]
    rows = after["inference_count"] - before["inference_count"]
    busy = float("nan")
    if "scheduling" in after:
        busy_ns = after["scheduling"]["instance_busy"]["ns"] - before["scheduling"]["instance_busy"]["ns"]
        busy = busy_ns / (t1 - t0)
    return Result(server.name, scenario, repeat, run, rows / batches if batches else float("nan"), busy)


def median(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def summarize(results: list[Result], names: list[str], scenarios: list[Scenario]) -> list[dict[str, Any]]:
    rows = []
    for scenario in scenarios:
        for name in names:
            ok = [r for r in results if r.server == name and r.scenario == scenario and r.run.ok]
            served = median([r.run.throughput for r in ok])
            rows.append({
                "server": name, "scenario": scenario.label, "batch_ms": scenario.batch_ms,
                "concurrency": scenario.concurrency, "limit": scenario.limit, "served": served,
                "share_of_limit": served / scenario.limit, "share_of_cohorts": served / scenario.cohort_bound,
                "mean_batch": median([r.mean_batch for r in ok]),
                "busy_share": median([r.busy_share for r in ok]), "p50_us": median([r.run.p50_us for r in ok]),
                "p99_us": median([r.run.p99_us for r in ok]), "cpu_us": median([r.run.cpu_us for r in ok]),
                "runs": len(ok), "all_served": [round(r.run.throughput) for r in ok],
            })
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'server':<9} {'scenario':<14} {'limit/s':>8} {'served/s':>9} {'of limit':>8} {'of c/2':>7} {'batch':>6} "
            f"{'busy':>6} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>7}  runs")
    print(head)
    print("-" * len(head))
    for r in rows:
        fmt = bench_identity.fmt
        busy = "-" if r["busy_share"] != r["busy_share"] else f"{r['busy_share']:.0%}"
        print(f"{r['server']:<9} {r['scenario']:<14} {r['limit']:>8,.0f} {fmt(r['served'], 0):>9} "
              f"{r['share_of_limit']:>8.1%} {r['share_of_cohorts']:>7.1%} {fmt(r['mean_batch'], 1):>6} {busy:>6} {fmt(r['p50_us'] / 1000, 1):>7} "
              f"{fmt(r['p99_us'] / 1000, 1):>7} {fmt(r['cpu_us'], 0):>7}  {r['all_served']}")
    print("limit: 128 rows per batch time; of limit: served / limit (target >= 95% at 50 ms, c=256); of c/2: "
          "served / (min(c/2, 128) rows per batch time: two cohorts of clients taking turns); "
          "batch: mean rows per batch; busy: the instance's busy share of wall time (its statistics)")
    sys.stdout.flush()


def write_csv(path: Path, results: list[Result]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["server", "batch_ms", "concurrency", "repeat", "ok", "limit_rows_per_s", "infer_per_s",
                         "share_of_limit", "share_of_cohort_bound", "mean_batch", "busy_share", "p50_us", "p99_us", "cpu_us_per_infer",
                         "load1", "error"])
        for r in results:
            s = r.scenario
            writer.writerow([r.server, s.batch_ms, s.concurrency, r.repeat, r.run.ok, f"{s.limit:.0f}",
                             f"{r.run.throughput:.1f}", f"{r.run.throughput / s.limit:.3f}",
                             f"{r.run.throughput / s.cohort_bound:.3f}", f"{r.mean_batch:.1f}",
                             f"{r.busy_share:.3f}", f"{r.run.p50_us:.0f}", f"{r.run.p99_us:.0f}",
                             f"{r.run.cpu_us:.1f}", f"{r.run.load1:.2f}", r.run.error])
    bench_identity.log(f"runs written to {path}")


def plot(path: Path, rows: list[dict[str, Any]], names: list[str], scenarios: list[Scenario]) -> None:
    """Served throughput as a share of the offline limit, per scenario and server."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        bench_identity.log("--plot needs matplotlib; no plot drawn")
        return
    by = {(r["server"], r["scenario"]): r for r in rows}
    figure, axes = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        xs = [i + index * width for i in range(len(scenarios))]
        ys = [100 * by[(name, s.label)]["share_of_cohorts"] for s in scenarios]
        bars = axes.bar(xs, ys, width, label=name, color=f"C{index}")
        axes.bar_label(bars, fmt="%.0f%%", fontsize=8)
    axes.axhline(95, color="grey", linestyle="--", linewidth=1)
    axes.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(scenarios))],
                    [f"{s.label}\nbound {s.cohort_bound:,.0f}/s" for s in scenarios])
    axes.set_ylabel("served / bound (%): min(c/2, 128) rows per batch time")
    axes.set_ylim(0, 110)
    axes.set_title("fixed-time GIL-free stand-in, batch <= 128 (perf_analyzer, medians)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    bench_identity.log(f"plot written to {path}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--scenarios", default="50:256,20:64",
                   help="comma-separated BATCH_MS:CONCURRENCY[:INSTANCES] (instances default 1)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--measurement-interval", type=int, default=5000, help="perf_analyzer -p, ms")
    p.add_argument("--stability-percentage", type=float, default=25,
                   help="perf_analyzer -s (this 2-core host is shared: 10 rarely holds)")
    p.add_argument("--max-trials", type=int, default=10)
    p.add_argument("--retries", type=int, default=2, help="reruns of a level that did not stabilise, -s doubled")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--baseline-cmd", default=None,
                   help="another nereid build, measured interleaved (e.g. 'env PYTHONPATH=/tmp/old/server "
                        ".venv/bin/python -m nereid')")
    p.add_argument("--nereid-cmd", default=None, help="command that runs this build (unset: python -m nereid)")
    p.add_argument("--perf-analyzer", default=str(bench_identity.PERF_ANALYZER))
    p.add_argument("--pa-arg", action="append", default=[])
    p.add_argument("--isolation", choices=("thread", "process"), default="thread",
                   help="the stand-in's instances: threads of the server's process, or processes of their own")
    p.add_argument("--inputs", type=int, choices=(1, 2), default=1,
                   help="2: an ATTENTION_MASK beside INPUT_IDS (BERT's two inputs: a worker's hand-over is then "
                        "copied into one array per input)")
    p.add_argument("--nereid-arg", action="append", default=[],
                   help="extra `nereid serve` argument, for both builds (e.g. --nereid-arg=--http-workers=2)")
    p.add_argument("--start-timeout", type=float, default=120)
    p.add_argument("--csv", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    try:
        args.scenarios = [Scenario(*(int(part) for part in x.split(":"))) for x in args.scenarios.split(",")]
    except ValueError:
        p.error("--scenarios takes BATCH_MS:CONCURRENCY pairs, e.g. 50:256,20:64")
    args.http_server = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check = subprocess.run([args.perf_analyzer, "--version"], capture_output=True, text=True)
    if check.returncode != 0:
        bench_identity.log(f"perf_analyzer does not run: {(check.stderr or check.stdout).strip()}")
        return 2
    work = Path(tempfile.mkdtemp(prefix="nereid-pipeline-"))
    servers = [StandInServer(work, args, "nereid", args.nereid_cmd)]
    if args.baseline_cmd:
        servers.append(StandInServer(work, args, "baseline", args.baseline_cmd))
    names = [s.name for s in servers]
    results: list[Result] = []

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    status = 0
    try:
        for server in servers:
            server.start(args.start_timeout)
        for repeat in range(args.repeats):
            for scenario in args.scenarios:
                for server in servers if repeat % 2 == 0 else servers[::-1]:
                    result = measure(args, server, scenario, repeat, work)
                    results.append(result)
                    run = result.run
                    if run.ok:
                        bench_identity.log(
                            f"rep {repeat + 1} {server.name:<8} {scenario.label:<14} {run.throughput:8.1f} infer/s "
                            f"= {run.throughput / scenario.limit:6.1%} of {scenario.limit:,.0f}; mean batch "
                            f"{result.mean_batch:5.1f}; p50 {run.p50_us / 1000:6.1f} ms p99 {run.p99_us / 1000:6.1f} ms")
                    else:
                        bench_identity.log(f"rep {repeat + 1} {server.name} {scenario.label} FAILED: {run.error}")
                        status = 1
    except KeyboardInterrupt:
        status = 130
    except (RuntimeError, OSError) as exc:
        bench_identity.log(str(exc))
        status = 1
    finally:
        for server in servers:
            server.stop()
    rows = summarize(results, names, args.scenarios)
    if results:
        print_table(rows)
    if args.csv and results:
        write_csv(Path(args.csv), results)
    if args.plot and results:
        plot(Path(args.plot), rows, names, args.scenarios)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    if status == 0:
        shutil.rmtree(work, ignore_errors=True)
    else:
        bench_identity.log(f"work directory kept: {work}")
    return status


if __name__ == "__main__":
    sys.exit(main())
