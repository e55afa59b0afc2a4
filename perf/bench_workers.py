#!/usr/bin/env python3
"""Benchmark nereid's front-end workers (``--http-workers``): the same model served with
N = 1, 2, ... front-end processes, measured interleaved with the stock perf_analyzer.

Two models (``--model``):
  identity  FP32 [16] in, the same out (bench_identity.py's model), max_batch_size 64
  bert      the do-nothing model with BERT-sized tensors of issue #30: INT64 [128] in,
            FP32 [768] out (zeros), max_batch_size 64 -- the front end's cost alone

For every repeat, level and worker count (the order of the counts flipped every other
repeat) perf_analyzer runs ``-i http -b 1 --concurrency-range C`` against a server with
``--http-workers N``; the medians, the ratios of each N to N = 1 and each server's CPU
time per inference (all its processes, from /proc) are printed, every run goes to --csv
and the medians to --plot; each run's CPU is split between the main process and the
workers (the CSV's last columns, and a table at the end), with perf_analyzer's own CPU per
inference and the host's busy share (is the load generator, or the host, the limit?).
Runs unchanged on a many-core machine (say ``--workers 1,4,8,16 --concurrency 64,256
--model bert``); on a 2-core machine perf_analyzer takes about a core itself.
``--clients K`` splits each level over K perf_analyzer processes started together
(throughput: the server's count of answers while all of them ran), to tell the server's limit from one perf_analyzer's.

    PYTHONPATH=$PWD/server python perf/bench_workers.py --workers 1,2 --concurrency 64 --repeats 3 \
        --csv perf/plots/workers.csv --plot perf/plots/workers.png

Exit status: 0 all runs succeeded; 1 a server did not start or a run failed; 2
perf_analyzer is not installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_identity import (  # the identity benchmark's servers, perf_analyzer runs and reports
    CONFIG_TOML, MODEL_PY, PERF_ANALYZER, REPO, Run, Server, free_port, log, print_table, run_level, summarize,
    write_csv,
)

BERT_CONFIG = """\
# written by perf/bench_workers.py: BERT-sized tensors, no work (issue #30)
name = "bert"
max_batch_size = 64

[[input]]
name = "INPUT_IDS"
data_type = "TYPE_INT64"
dims = [128]

[[output]]
name = "HIDDEN"
data_type = "TYPE_FP32"
dims = [768]

[dynamic_batching]
max_queue_delay_microseconds = 0

[[instance_group]]
count = 1
kind = "KIND_CPU"
"""

BERT_MODEL = '''\
# written by perf/bench_workers.py: answers zeros of the output's shape, no work.
import numpy as np


class Model:
    def __init__(self, context):
        self.zeros = np.zeros((64, 768), dtype=np.float32)

    def infer(self, inputs):
        return {"HIDDEN": self.zeros[: len(inputs["INPUT_IDS"])]}
'''


class WorkersNereid(Server):
    """This build with ``--http-workers N`` serving the chosen model."""

    def __init__(self, log_dir: Path, args: argparse.Namespace, workers: int, baseline: bool = False) -> None:
        self.name = f"base-w{workers}" if baseline else f"w{workers}"
        #: another build's command (``--baseline-cmd``) in place of this one's ``python -m nereid``
        self.base_command = args.baseline_cmd.split() if baseline else [sys.executable, "-m", "nereid"]
        self.model = args.model
        super().__init__(log_dir)
        self.args = args
        self.workers = workers
        self.metrics_port = free_port()
        self.grpc_port = free_port()
        self.model_repo = log_dir / f"model_repository_{self.name}"
        folder = self.model_repo / args.model
        folder.mkdir(parents=True)
        if args.model == "bert":
            (folder / "config.toml").write_text(BERT_CONFIG)
            (folder / "model.py").write_text(BERT_MODEL)
        else:
            (folder / "config.toml").write_text(CONFIG_TOML.format(queue_delay_us=0))
            (folder / "model.py").write_text(MODEL_PY)

    def command(self) -> list[str]:
        return [
            *self.base_command, "serve", "--model-repository", str(self.model_repo),
            "--http-port", str(self.port), "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port), "--http-workers", str(self.workers), *self.args.nereid_arg,
        ]


def plot(path: Path, rows: list[dict[str, object]], names: list[str], levels: list[int], args: argparse.Namespace) -> None:
    """Throughput and server CPU per inference (medians) for each worker count, a group of
    bars per concurrency level."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("--plot needs matplotlib; no plot drawn")
        return
    by = {(row["server"], row["concurrency"]): row for row in rows}
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        xs = [level_index + index * width for level_index in range(len(levels))]
        left.bar(xs, [float(by[(name, level)]["throughput"]) for level in levels], width, label=name)  # type: ignore[arg-type]
        right.bar(xs, [float(by[(name, level)]["cpu_us"]) for level in levels], width, label=name)  # type: ignore[arg-type]
    for axes, label in ((left, "infer/s"), (right, "server CPU us per inference")):
        axes.set_xticks([level_index + width * (len(names) - 1) / 2 for level_index in range(len(levels))])
        axes.set_xticklabels([f"c={level}" for level in levels])
        axes.set_ylabel(label)
        axes.grid(True, axis="y", alpha=0.3)
        axes.legend()
    figure.suptitle(f"--http-workers N: {args.model} model over {args.protocol.upper()} (perf_analyzer, medians)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    log(f"plot written to {path}")


def _add_main_cpu(path: Path, runs: list[Run]) -> None:
    """Columns for the main process's and perf_analyzer's CPU per inference and the host's
    busy share in write_csv's file."""
    lines = path.read_text().splitlines()
    lines[0] += ",main_cpu_us_per_infer,perf_analyzer_cpu_us_per_infer,host_busy"
    nan = float("nan")
    for index, run in enumerate(runs, start=1):
        lines[index] += (f",{run.extra.get('main_cpu_us', nan):.1f},{run.extra.get('client_cpu_us', nan):.1f}"
                         f",{run.extra.get('host_busy', nan):.3f}")
    path.write_text("\n".join(lines) + "\n")


def break_even_us(reference_throughput: float, host_busy: float, cores: int, client_cpu_us: float) -> float:
    """The server CPU per inference (us) at which a server would serve
    ``reference_throughput`` infer/s on a host ``host_busy`` busy (a share of ``cores``
    cores) beside a load generator spending ``client_cpu_us`` per inference: above it,
    that server runs out of host before it matches the reference."""
    return host_busy * cores * 1e6 / reference_throughput - client_cpu_us


def _medians(runs: list[Run], name: str, level: int) -> dict[str, float] | None:
    """The medians of ``name``'s good runs at ``level``: infer/s, server CPU per inference
    (all processes, the main process), perf_analyzer's CPU per inference, the host's busy
    share (NaN where a run has none); None without a good run."""
    ok = [run for run in runs if run.server == name and run.concurrency == level and run.ok]
    if not ok:
        return None
    nan = float("nan")
    return {
        "throughput": statistics.median(run.throughput for run in ok),
        "server": statistics.median(run.cpu_us for run in ok),
        "main": statistics.median(run.extra.get("main_cpu_us", math.nan) for run in ok),
        "client": statistics.median(run.extra.get("client_cpu_us", nan) for run in ok),
        "busy": statistics.median(run.extra.get("host_busy", nan) for run in ok),
    }


def _print_break_even(medians: dict[str, dict[str, float]], names: list[str], level: int) -> None:
    """For each count after the first: the server CPU per inference it could spend and
    still match the first count's throughput, with the host as busy as it was and
    perf_analyzer's CPU per inference what it was (both medians, ``_medians``), beside
    what it spent. Where the host was not the limit (a server short of both), what holds
    it back is elsewhere: its processes' own pace, or the load generator's."""
    reference = medians.get(names[0]) if names else None
    if reference is None:
        return
    cores = os.cpu_count() or 1
    for name in names[1:]:
        figures = medians.get(name)
        if figures is None or math.isnan(figures["client"]) or math.isnan(figures["busy"]):
            continue
        budget = break_even_us(reference["throughput"], figures["busy"], cores, figures["client"])
        print(f"{name:<7} c={level:<4} to match {names[0]}'s {reference['throughput']:,.0f} infer/s with the host "
              f"{figures['busy']:.0%} busy ({cores} cores) and perf_analyzer at {figures['client']:.1f} us/infer, "
              f"the server may spend {budget:.1f} us/infer; it spends {figures['server']:.1f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workers", default="1,2", help="comma-separated --http-workers counts (the first is the reference)")
    p.add_argument("--model", choices=("identity", "bert"), default="identity")
    p.add_argument("--concurrency", default="64", help="comma-separated levels")
    p.add_argument("--repeats", type=int, default=3, help="runs per worker count and level")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--measurement-interval", type=int, default=3000, help="perf_analyzer -p (ms)")
    p.add_argument("--stability-percentage", type=float, default=10, help="perf_analyzer -s")
    p.add_argument("--max-trials", type=int, default=10, help="perf_analyzer --max-trials")
    p.add_argument("--retries", type=int, default=2, help="reruns with a doubled -s when unstable")
    p.add_argument("--perf-analyzer", default=str(PERF_ANALYZER), help="perf_analyzer to run")
    p.add_argument("--pa-arg", action="append", default=[], help="extra perf_analyzer argument")
    p.add_argument("--clients", type=int, default=1,
                   help="perf_analyzer processes started together, the concurrency split between them "
                        "(is one perf_analyzer the limit?)")
    p.add_argument("--nereid-arg", action="append", default=[], help="extra `nereid serve` argument")
    p.add_argument("--baseline-cmd", default=None,
                   help="another build's nereid command (e.g. 'env PYTHONPATH=/tmp/old/server python -m nereid'): "
                        "each worker count is run with it too, interleaved, and compared with this build")
    p.add_argument("--start-timeout", type=float, default=120, help="seconds to become ready")
    p.add_argument("--csv", default=None, help="write every run here as CSV")
    p.add_argument("--plot", default=None, help="write the medians' plot here (PNG; needs matplotlib)")
    p.add_argument("--json", default=None, help="write every run and the summary here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path(args.perf_analyzer).exists():
        log(f"perf_analyzer not found at {args.perf_analyzer} (make perf-analyzer)")
        return 2
    counts = [int(x) for x in args.workers.split(",")]
    levels = [int(x) for x in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="nereid-bench-workers-"))
    servers = [WorkersNereid(work, args, count) for count in counts]
    baselines = [WorkersNereid(work, args, count, baseline=True) for count in counts] if args.baseline_cmd else []
    if baselines:  # each baseline run beside this build's with the same count
        servers = [server for pair in zip(baselines, servers) for server in pair]
    runs: list[Run] = []
    failed = False
    try:
        for repeat in range(args.repeats):
            order = servers if repeat % 2 == 0 else list(reversed(servers))
            for server in order:  # one server up at a time: each has the machine to itself
                try:
                    server.start(args.start_timeout)
                except RuntimeError as exc:
                    log(str(exc))
                    return 1
                try:
                    for level in levels:
                        run = run_level(args, server, level, repeat, work)
                        log(f"{server.name} c={level} r={repeat}: "
                            + (f"{run.throughput:,.0f} infer/s, {run.cpu_us:.0f} us CPU/infer "
                               f"(main process {run.extra.get('main_cpu_us', math.nan):.0f}); perf_analyzer "
                               f"{run.extra.get('client_cpu_us', float('nan')):.0f} us/infer; host "
                               f"{run.extra.get('host_busy', float('nan')):.0%} busy" if run.ok else run.error))
                        failed |= not run.ok
                        runs.append(run)
                finally:
                    server.stop()
    except KeyboardInterrupt:
        return 130
    names = [server.name for server in servers]
    rows = summarize(runs, names, levels, args.stability_percentage)
    ours = [name for name in names if not name.startswith("base-")]
    for name in ours[1:]:  # each count against the first
        print(f"\n{name} against {ours[0]} ({args.model} model, {args.protocol.upper()}):")
        print_table(rows, [name, ours[0]], levels)
    for name in ours if baselines else []:  # each count against the baseline build's
        print(f"\n{name} against base-{name} ({args.model} model, {args.protocol.upper()}):")
        print_table(rows, [name, f"base-{name}"], levels)
    print("\nCPU per inference, medians (us): server (all processes / main process / workers), perf_analyzer;"
          " the host's busy share")
    for level in levels:
        medians = {name: figures for name in names if (figures := _medians(runs, name, level)) is not None}
        for name, m in medians.items():
            print(f"{name:<7} c={level:<4} {m['server']:6.1f} / {m['main']:6.1f} / {m['server'] - m['main']:6.1f}, "
                  f"{m['client']:6.1f}; {m['busy']:4.0%}")
        _print_break_even(medians, ours, level)
    if args.csv:
        write_csv(Path(args.csv), runs, args.protocol)
        _add_main_cpu(Path(args.csv), runs)
    if args.plot:
        plot(Path(args.plot), rows, names, levels, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": [vars(run) for run in runs], "summary": rows}, indent=1))
    log(f"logs in {work} (repository root {REPO})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
