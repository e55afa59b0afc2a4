#!/usr/bin/env python3
"""gRPC engines side by side on the identity model: nereid's own HTTP/2 framing, the same
server on h2's state machine (perf/serve_h2.py), grpcio's server, and real Triton's gRPC.

For issue 27 item 4 (perf/README.md, "gRPC transport: h2's state machine vs nereid's own
framing"). perf_analyzer runs ``-i grpc -b 1`` at each concurrency level against every
engine in turn, interleaved (the order flips every repeat), and each run records
throughput, p50/p99 latency and the server's CPU time per inference (its process group's
user + system time from /proc over the model's success count), which a shared machine
disturbs far less than throughput. Medians per engine and level are printed with the
ratios to Triton and to the native engine; every run goes to a CSV, the medians to a PNG.

    .venv/bin/python perf/bench_h2_engine.py --repeats 3
    .venv/bin/python perf/bench_h2_engine.py --engines native,h2 --concurrency 16
    .venv/bin/python perf/bench_h2_engine.py --repeats 3 --with-server native-main=/path/to/other/server

Engines: ``native`` (``--grpc-server native`` of this checkout's server/), ``h2`` (the
same with H2GrpcConnection), ``grpcio`` (``--grpc-server grpcio``), ``triton``
(tritonserver 2.51 through ../shared/tools/triton-anchor). ``--with-server LABEL=DIR``
adds the native engine of another source tree (DIR is put first on PYTHONPATH).

Uses bench_identity's servers, perf_analyzer runner and CPU measurement. Exit status as
bench_identity's.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_identity as bench  # noqa: E402

HERE = Path(__file__).resolve().parent
PLOTS = HERE / "plots"


class Engine(bench.Nereid):
    """nereid serving the identity model, its gRPC on one engine."""

    def __init__(self, log_dir: Path, args: argparse.Namespace, name: str, engine: str, source: Path,
                 serve_h2: bool = False) -> None:
        self.name = name
        super().__init__(log_dir, args)
        self.engine = engine
        self.source = source
        self.serve_h2 = serve_h2

    def command(self) -> list[str]:
        program = [str(HERE / "serve_h2.py")] if self.serve_h2 else ["-m", "nereid"]
        return ["env", f"PYTHONPATH={self.source}", sys.executable, *program, "serve",
                "--model-repository", str(self.model_repo), "--http-port", str(self.port),
                "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port),
                "--grpc-server", self.engine]


def make_servers(args: argparse.Namespace, work: Path) -> list[bench.Server]:
    own = bench.REPO / "server"
    servers: list[bench.Server] = []
    for name in args.engines:
        if name == "native":
            servers.append(Engine(work, args, "native", "native", own))
        elif name == "h2":
            servers.append(Engine(work, args, "h2", "native", own, serve_h2=True))
        elif name == "grpcio":
            servers.append(Engine(work, args, "grpcio", "grpcio", own))
        elif name == "triton":
            servers.append(bench.Triton(work, args))
        else:
            raise SystemExit(f"unknown engine {name!r} (native, h2, grpcio, triton)")
    for spec in args.with_server:
        label, _, directory = spec.partition("=")
        servers.append(Engine(work, args, label, "native", Path(directory).resolve()))
    return servers


def ratio(a: float, b: float) -> float:
    return a / b if b and a == a and b == b else float("nan")


def summarize(runs: list[bench.Run], names: list[str], levels: list[int], stability: float) -> list[dict[str, object]]:
    """bench_identity's medians, except CPU per inference: it counts every run that served
    inferences, also those perf_analyzer could not call stable (its time and the model's
    success count are read around the run either way; ``cpu_runs`` says how many)."""
    rows = bench.summarize(runs, names, levels, stability)
    for row in rows:
        cpu = [r.cpu_us for r in runs
               if r.server == row["server"] and r.concurrency == row["concurrency"] and r.cpu_us == r.cpu_us]
        row["cpu_us"] = bench.median(cpu)
        row["cpu_runs"] = len(cpu)
    return rows


def read_csv(path: Path) -> tuple[list[bench.Run], str]:
    """The runs of an earlier CSV of this script (to print and plot them again)."""
    runs = []
    commit = ""
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            runs.append(bench.Run(
                row["engine"], int(row["concurrency"]), int(row["repeat"]), row["ok"] == "True",
                float(row["infer_per_s"]), float(row["p50_us"]), float(row["p99_us"]),
                stability=float(row["stability"]), load1=float(row["load1"]), cpu_us=float(row["cpu_us_per_infer"]),
                error=row["error"],
            ))
            commit = row["commit"]
    return runs, commit


def print_table(rows: list[dict[str, object]], names: list[str], levels: list[int]) -> None:
    """Medians per level and engine, with CPU and throughput ratios to Triton and to native."""
    by = {(r["server"], r["concurrency"]): r for r in rows}
    head = (f"{'engine':<12} {'conc':>4} {'infer/s':>9} {'p50 us':>8} {'p99 us':>8} {'cpu us':>7} {'runs':>5}"
            f"  {'cpu/triton':>10} {'thr/triton':>10} {'cpu/native':>10} {'thr/native':>10}")
    print(head)
    print("-" * len(head))
    for c in levels:
        triton = by.get(("triton", c))
        native = by.get(("native", c))
        for name in names:
            r = by[(name, c)]
            cells = []
            for ref in (triton, native):
                if ref is None:
                    cells += ["-", "-"]
                else:
                    cells.append(bench.fmt(ratio(float(r["cpu_us"]), float(ref["cpu_us"])), 2))  # type: ignore[arg-type]
                    cells.append(bench.fmt(ratio(float(r["throughput"]), float(ref["throughput"])), 2))  # type: ignore[arg-type]
            print(f"{name:<12} {c:>4} {bench.fmt(r['throughput'], 1):>9} {bench.fmt(r['p50_us']):>8} "  # type: ignore[arg-type]
                  f"{bench.fmt(r['p99_us']):>8} {bench.fmt(r['cpu_us']):>7} {r['runs_ok']:>2}/{r['runs']:<2}"  # type: ignore[arg-type]
                  + "".join(f" {cell:>10}" for cell in cells))
    print("cpu us: the server's CPU time per inference (all its processes; median of every run that served, "
          "stable or not); runs: stable perf_analyzer runs / runs (throughput and latency are their medians); "
          "ratios < 1 (cpu), > 1 (thr) favour the engine of the row")
    sys.stdout.flush()


def write_csv(path: Path, runs: list[bench.Run], commit: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["engine", "concurrency", "repeat", "ok", "infer_per_s", "p50_us", "p99_us",
                         "cpu_us_per_infer", "stability", "load1", "commit", "error"])
        for r in runs:
            writer.writerow([r.server, r.concurrency, r.repeat, r.ok, f"{r.throughput:.1f}", f"{r.p50_us:.0f}",
                             f"{r.p99_us:.0f}", f"{r.cpu_us:.1f}", r.stability, f"{r.load1:.2f}", commit, r.error])
    bench.log(f"runs written to {path}")


def plot(path: Path, rows: list[dict[str, object]], names: list[str], levels: list[int], title: str) -> None:
    """Two panels, medians per level: CPU µs per inference (bars) and throughput (bars)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        bench.log("no matplotlib: no plot drawn")
        return
    by = {(r["server"], r["concurrency"]): r for r in rows}
    figure, (cpu_axes, thr_axes) = plt.subplots(1, 2, figsize=(11, 4.5))
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        xs = [level_index + (index - (len(names) - 1) / 2) * width for level_index in range(len(levels))]
        cpu = [float(by[(name, c)]["cpu_us"]) for c in levels]  # type: ignore[arg-type]
        thr = [float(by[(name, c)]["throughput"]) for c in levels]  # type: ignore[arg-type]
        cpu_axes.bar(xs, cpu, width, label=name, color=f"C{index}")
        thr_axes.bar(xs, thr, width, label=name, color=f"C{index}")
        for x, y in zip(xs, cpu):
            if y == y:
                cpu_axes.annotate(f"{y:.0f}", (x, y), ha="center", va="bottom", fontsize=7)
    for axes, label in ((cpu_axes, "server CPU µs per inference (lower is better)"),
                        (thr_axes, "throughput, infer/s (higher is better)")):
        axes.set_xticks(range(len(levels)))
        axes.set_xticklabels([f"c={c}" for c in levels])
        axes.set_ylabel(label)
        axes.grid(True, axis="y", alpha=0.3)
    cpu_axes.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    bench.log(f"plot written to {path}")


def report(args: argparse.Namespace, runs: list[bench.Run], names: list[str], levels: list[int], commit: str) -> None:
    rows = summarize(runs, names, levels, float(args.stability_percentage))
    print_table(rows, names, levels)
    title = "identity model over gRPC, perf_analyzer -b 1, medians" + (f"\n{commit}" if commit else "")
    plot(Path(args.plot), rows, names, levels, title)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--engines", default="native,h2,grpcio,triton", help="comma-separated: native,h2,grpcio,triton")
    p.add_argument("--with-server", action="append", default=[],
                   help="LABEL=DIR: also the native engine of the source tree DIR (its server/ folder)")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--measurement-interval", type=int, default=3000, help="perf_analyzer -p, ms")
    p.add_argument("--stability-percentage", type=float, default=10)
    p.add_argument("--max-trials", type=int, default=10)
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--queue-delay-us", type=int, default=0)
    p.add_argument("--triton-anchor", default=str(bench.ANCHOR))
    p.add_argument("--triton-repo", default=str(bench.TRITON_REPO))
    p.add_argument("--perf-analyzer", default=str(bench.PERF_ANALYZER))
    p.add_argument("--start-timeout", type=float, default=120)
    p.add_argument("--csv", default=str(PLOTS / "h2_engine.csv"))
    p.add_argument("--plot", default=str(PLOTS / "h2_engine.png"))
    p.add_argument("--commit", default="", help="the commit(s) measured, written into the CSV and the plot title")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--from-csv", default=None, help="measure nothing: print and plot the runs of this CSV again")
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    # what bench_identity's runner reads
    args.protocol = "grpc"
    args.pa_arg = []
    args.http_server = None
    args.nereid_cmd = None
    args.nereid_arg = []
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_csv:
        earlier, commit = read_csv(Path(args.from_csv))
        names = list(dict.fromkeys(r.server for r in earlier))
        levels = sorted({r.concurrency for r in earlier})
        report(args, earlier, names, levels, commit)
        return 0
    if not Path(args.perf_analyzer).exists():
        bench.log(f"{args.perf_analyzer} not found; install with `make perf-analyzer`")
        return 2
    work = Path(tempfile.mkdtemp(prefix="nereid-h2-bench-"))
    servers = make_servers(args, work)
    names = [s.name for s in servers]
    runs: list[bench.Run] = []

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    status = 0
    try:
        for server in servers:
            server.start(args.start_timeout)
        for rep in range(args.repeats):
            for c in args.levels:
                for server in (servers if rep % 2 == 0 else servers[::-1]):
                    r = bench.run_level(args, server, c, rep, work)
                    runs.append(r)
                    if r.ok:
                        bench.log(f"rep {rep + 1} {server.name:<12} c={c:<3} {r.throughput:9.1f} infer/s  "
                                  f"p50 {r.p50_us:7.0f} us  p99 {r.p99_us:7.0f} us  cpu {r.cpu_us:6.0f} us/infer  "
                                  f"(load {r.load1:.1f})")
                    else:
                        bench.log(f"rep {rep + 1} {server.name:<12} c={c:<3} FAILED: {r.error}")
                        status = 1
                        if server.proc is not None and server.proc.poll() is not None:
                            raise RuntimeError(f"{server.name} died; log:\n{server.log_tail()}")
    except KeyboardInterrupt:
        bench.log("interrupted")
        status = 130
    except RuntimeError as exc:
        bench.log(str(exc))
        status = 1
    finally:
        for server in servers:
            server.stop()
    if runs:
        write_csv(Path(args.csv), runs, args.commit)
        report(args, runs, names, args.levels, args.commit)
    if args.keep or status not in (0, 130):
        bench.log(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
