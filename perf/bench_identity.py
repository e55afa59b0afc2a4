#!/usr/bin/env python3
"""Benchmark nereid (and optionally real Triton) on the identity model with perf_analyzer.

The identity model: FP32 [16] in, the same out, max_batch_size 64, dynamic batching, one
instance. For every concurrency level the project's stock perf_analyzer (perf/perf_analyzer,
installed by ``make perf-analyzer``) runs ``-m identity -i http -b 1 --concurrency-range N``
and the throughput (infer/sec) and p50/p99 latency (microseconds) are read from its CSV.

    .venv/bin/python perf/bench_identity.py                      # nereid, levels 1,16,64
    .venv/bin/python perf/bench_identity.py --triton --repeats 3 # nereid vs Triton, interleaved
    .venv/bin/python perf/bench_identity.py --only-triton        # Triton alone
    .venv/bin/python perf/bench_identity.py --smoke              # concurrency 4, a few seconds
    .venv/bin/python perf/bench_identity.py --baseline-cmd CMD   # this build vs another, interleaved
    .venv/bin/python perf/bench_identity.py --protocol grpc --baseline-arg='--grpc-server grpcio'  # vs other flags
    .venv/bin/python perf/bench_identity.py --tls --protocol grpc  # over TLS vs plain, interleaved

Triton is real tritonserver 2.51 (Python backend) started by
../shared/tools/triton-anchor serve ../shared/tools/triton_repo (run
``triton-anchor setup`` once first). With --triton the runs are interleaved (for each repeat
and level: nereid, then Triton, the order flipped every other repeat), and the medians and
nereid/Triton ratios are printed, with each server's CPU time per inference (read from
/proc for its process group, over the model's success count), which a busy machine
disturbs far less than throughput. --baseline-cmd compares two nereid builds the same way.
--tls compares this build serving HTTPS and gRPC over TLS (certificates made with the
openssl command in the work directory; perf_analyzer's --ssl-https-* / --ssl-grpc-* options
trust them) with the same build in plaintext.

Standard library only. Exit status: 0 all runs succeeded; 1 a server did not start or a run
failed; 2 perf_analyzer is not installed (the test suite skips on 2); 130 interrupted.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
PERF_ANALYZER = REPO / "perf" / "perf_analyzer"
ANCHOR = REPO.parent / "shared" / "tools" / "triton-anchor"
TRITON_REPO = REPO.parent / "shared" / "tools" / "triton_repo"

MODEL = "identity"

CONFIG_TOML = """\
# written by perf/bench_identity.py: the benchmark identity model
name = "identity"
backend = "python"
max_batch_size = 64

[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [16]

[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [16]

[dynamic_batching]
max_queue_delay_microseconds = {queue_delay_us}

[[instance_group]]
count = 1
kind = "KIND_CPU"
"""

MODEL_PY = '''\
# written by perf/bench_identity.py: OUTPUT0 = INPUT0 for the whole batch.


class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
'''


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


#: (what a process's command line holds, its role) for a server's processes other than
#: the one started (``Server.cpu_by_role``)
PROCESS_ROLES = (("nereid.frontends.worker", "workers"), ("nereid.instances.worker", "instances"))


def _role_of(pid: str) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        command = f.read().decode(errors="replace")
    return next((role for marker, role in PROCESS_ROLES if marker in command), "other")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------
# servers


#: Popen arguments that start a child in a process group of its own (same session).
_OWN_PROCESS_GROUP: dict[str, Any] = (
    {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
)


class Server:
    """A server process in its own process group, serving the identity model over HTTP."""

    name = "server"
    #: the model perf_analyzer loads and whose statistics are read
    model = MODEL
    #: how HTTP is reached: "https" with ``ssl_context`` for a TLS server
    scheme = "http"
    ssl_context: Any = None

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = log_dir / f"{self.name}.log"
        self._log_file: io.BufferedWriter | None = None
        #: CPU seconds by role at each cpu_seconds call
        self.cpu_marks: list[dict[str, float]] = []

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{getattr(self, 'grpc_port', 0)}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float, own_session: bool = False) -> None:
        """Start the server and wait until it is ready. It gets a process group of its own
        (so stop() reaches its children) in the benchmark's session, unless
        ``own_session``: with Linux's autogroup scheduling (on by default) each session is
        one CPU-share group, so a server in a session of its own gets about half of the
        two cores against perf_analyzer whatever either needs, as when both are started
        from separate terminals. Real Triton's runs at concurrency 64 stall for minutes
        that way here."""
        cmd = self.command()
        log(f"starting {self.name}: {' '.join(cmd)}")
        self._log_file = open(self.log_path, "wb")
        grouping: dict[str, Any] = {"start_new_session": True} if own_session else _OWN_PROCESS_GROUP
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            **grouping,
        )
        deadline = time.monotonic() + timeout
        ready_url = f"{self.scheme}://{self.url}/v2/health/ready"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with status {self.proc.returncode} before it was "
                    f"ready; its log ({self.log_path}) ends with:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(ready_url, timeout=2, context=self.ssl_context) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{self.name} was not ready within {timeout:.0f}s; its log "
                    f"({self.log_path}) ends with:\n{self.log_tail()}"
                )
            time.sleep(0.2)
        log(f"{self.name} ready on {self.url}")

    def stop(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    log(f"{self.name} did not stop on {sig.name}")
        if p is not None:
            # the group may outlive its leader (e.g. model worker processes)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by every process of the server's process
        group (the server, and Triton's backend stubs or nereid's worker processes). Each
        call also notes the time by role (``cpu_by_role``) for ``cpu_split``."""
        if self.proc is None:
            return float("nan")
        by_role = self.cpu_by_role()
        self.cpu_marks.append(by_role)
        return sum(by_role.values())

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of the server's process group by role (``PROCESS_ROLES``,
        told by each process's command line): "main" (the process started), "workers"
        (nereid's front-end workers), "instances" (nereid's instance processes), "other"
        (e.g. Triton's Python backend stubs)."""
        assert self.proc is not None
        tick = os.sysconf("SC_CLK_TCK")
        ticks = dict.fromkeys(("main", *(role for _, role in PROCESS_ROLES), "other"), 0)
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
                fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) "
                if int(fields[2]) != self.proc.pid:  # pgrp
                    continue
                role = "main" if int(entry) == self.proc.pid else _role_of(entry)
            except OSError:  # gone meanwhile
                continue
            ticks[role] += int(fields[11]) + int(fields[12])  # utime + stime
        return {role: count / tick for role, count in ticks.items()}

    def cpu_split(self) -> dict[str, float]:
        """Each role's share of the server's CPU time between the last two
        ``cpu_seconds`` calls (none before two calls)."""
        if len(self.cpu_marks) < 2:
            return {}
        before, after = self.cpu_marks[-2:]
        total = sum(after.values()) - sum(before.values())
        return {role: (after[role] - before[role]) / total if total > 0 else float("nan") for role in after}

    def success_count(self) -> float:
        """The model's successful inferences so far, from the statistics extension."""
        url = f"{self.scheme}://{self.url}/v2/models/{self.model}/stats"
        try:
            with urllib.request.urlopen(url, timeout=5, context=self.ssl_context) as r:
                body = json.load(r)
            return float(body["model_stats"][0]["inference_stats"]["success"]["count"])
        except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError):
            return float("nan")

    def perf_analyzer_args(self, protocol: str) -> list[str]:
        """``-u`` and whatever else perf_analyzer needs to reach this server."""
        return ["-u", self.grpc_url if protocol == "grpc" else self.url]

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class Nereid(Server):
    name = "nereid"

    def __init__(self, log_dir: Path, args: argparse.Namespace, cmd: str | None = None) -> None:
        super().__init__(log_dir)
        self.args = args
        self.cmd = cmd if cmd is not None else args.nereid_cmd
        self.metrics_port = free_port()
        self.grpc_port = free_port()
        self.model_repo = log_dir / f"model_repository_{self.name}"
        model_dir = self.model_repo / MODEL
        model_dir.mkdir(parents=True)
        (model_dir / "config.toml").write_text(
            CONFIG_TOML.format(queue_delay_us=int(args.queue_delay_us))
        )
        (model_dir / "model.py").write_text(MODEL_PY)

    def command(self) -> list[str]:
        if self.cmd:
            base = self.cmd.split()
        elif (REPO / ".venv" / "bin" / "nereid").exists():
            base = [str(REPO / ".venv" / "bin" / "nereid")]
        else:
            base = [sys.executable, "-m", "nereid"]
        cmd = base + [
            "serve",
            "--model-repository", str(self.model_repo),
            "--http-port", str(self.port),
            "--metrics-port", str(self.metrics_port),
        ]
        if not self.cmd or self.args.protocol == "grpc":  # a build from before gRPC may not know the flag
            cmd += ["--grpc-port", str(self.grpc_port)]
        if self.args.http_server:
            cmd += ["--http-server", self.args.http_server]
        for extra in self.extra_args():
            cmd += extra.split()
        return cmd

    def extra_args(self) -> list[str]:
        return list(self.args.nereid_arg)


class Baseline(Nereid):
    """Another nereid build (``--baseline-cmd``), or this one with other flags
    (``--baseline-arg``), measured interleaved with this one."""

    name = "baseline"

    def __init__(self, log_dir: Path, args: argparse.Namespace) -> None:
        super().__init__(log_dir, args, cmd=args.baseline_cmd)

    def extra_args(self) -> list[str]:
        return list(self.args.baseline_arg) if self.args.baseline_arg else list(self.args.nereid_arg)


class TlsNereid(Nereid):
    """This build serving HTTPS and gRPC over TLS (``--tls``), with certificates made in
    the work directory by the openssl command."""

    name = "tls"
    scheme = "https"

    def __init__(self, log_dir: Path, args: argparse.Namespace) -> None:
        super().__init__(log_dir, args)
        import ssl

        self.ca, self.cert, self.key = make_certificates(log_dir / "certificates")
        self.ssl_context = ssl.create_default_context(cafile=str(self.ca))

    def extra_args(self) -> list[str]:
        return list(self.args.nereid_arg) + [
            f"--http-use-ssl true --http-server-cert {self.cert} --http-server-key {self.key}",
            f"--grpc-use-ssl true --grpc-server-cert {self.cert} --grpc-server-key {self.key}",
        ]

    def perf_analyzer_args(self, protocol: str) -> list[str]:
        if protocol == "grpc":
            return ["-u", self.grpc_url, "--ssl-grpc-use-ssl", "true",
                    "--ssl-grpc-root-certifications-file", str(self.ca)]
        return ["-u", f"https://{self.url}", "--ssl-https-verify-peer", "1", "--ssl-https-verify-host", "2",
                "--ssl-https-ca-certificates-file", str(self.ca)]


class PlainNereid(Nereid):
    """The same build in plaintext, measured interleaved with ``TlsNereid``."""

    name = "plain"


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(CA, server certificate, server key) for 127.0.0.1, made with the openssl command."""
    folder.mkdir(parents=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, csr = folder / "server.pem", folder / "server.key", folder / "server.csr"
    ext = folder / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for cmd in (
        ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
         "-subj", "/CN=bench-ca", "-keyout", ca_key, "-out", ca],
        ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=127.0.0.1",
         "-keyout", key, "-out", csr],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
         "-extfile", ext, "-out", cert],
    ):
        subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True)
    return ca, cert, key


class Triton(Server):
    name = "triton"

    def __init__(self, log_dir: Path, args: argparse.Namespace) -> None:
        super().__init__(log_dir)
        self.args = args
        self.grpc_port = free_port()
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        anchor = Path(self.args.triton_anchor)
        repo = Path(self.args.triton_repo)
        if not anchor.exists() or not (repo / MODEL).is_dir():
            raise RuntimeError(f"--triton needs {anchor} and {repo / MODEL}")
        # the anchor's fixed ports come first; tritonserver keeps the last value of a flag
        return [
            str(anchor), "serve", str(repo),
            f"--http-port={self.port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--model-control-mode=explicit", f"--load-model={MODEL}",
        ]


# ---------------------------------------------------------------------------------------
# perf_analyzer


@dataclass
class Run:
    server: str
    concurrency: int
    repeat: int
    ok: bool
    throughput: float = float("nan")  # infer/sec
    p50_us: float = float("nan")
    p99_us: float = float("nan")
    avg_us: float = float("nan")
    seconds: float = 0.0
    stability: float = float("nan")  # the -s that was used
    load1: float = float("nan")  # the machine's 1-minute load average when the run began
    cpu_us: float = float("nan")  # the server's CPU time per successful inference, microseconds
    error: str = ""
    extra: dict[str, float] = field(default_factory=dict)


_STDOUT_PATTERNS = {
    "throughput": r"Throughput:\s*([0-9.]+)\s*infer/sec",
    "avg_us": r"Avg latency:\s*([0-9.]+)\s*usec",
    "p50_us": r"p50 latency:\s*([0-9.]+)\s*usec",
    "p99_us": r"p99 latency:\s*([0-9.]+)\s*usec",
}


def parse_stdout(text: str) -> dict[str, float]:
    """The numbers of the last level printed in perf_analyzer's report (a CSV fallback)."""
    out: dict[str, float] = {}
    for key, pat in _STDOUT_PATTERNS.items():
        found = re.findall(pat, text)
        if found:
            out[key] = float(found[-1])
    return out


def parse_csv(path: Path) -> dict[str, float]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}
    row = rows[-1]
    return {
        "throughput": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p99_us": float(row["p99 latency"]),
        **{
            k: float(v)
            for k, v in row.items()
            if k not in ("Concurrency", "Inferences/Second") and v not in (None, "")
            and re.fullmatch(r"-?[0-9.]+", v)
        },
    }


def client_cpu_seconds() -> float:
    """The CPU time of this process's children that have ended (perf_analyzer's runs: the
    servers are still running, so theirs is not in it)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def host_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every core since boot (/proc/stat's first line; (0, 0)
    where there is none): the host's busy share over a run is their difference's ratio."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def run_level(
    args: argparse.Namespace, server: Server, concurrency: int, repeat: int, work: Path
) -> Run:
    """One perf_analyzer run at one level. When perf_analyzer cannot stabilise (3 windows
    within -s percent; likely on a busy machine) it is retried --retries times, each time
    with twice the -s tolerance; the Run records the tolerance that was used."""
    stability = float(args.stability_percentage)
    for attempt in range(args.retries + 1):
        load1 = os.getloadavg()[0]
        cpu0, count0 = server.cpu_seconds(), server.success_count()
        client0, host0 = client_cpu_seconds(), host_ticks()
        r = run_perf_analyzer(args, server, concurrency, repeat, work, stability, attempt)
        cpu1, count1 = server.cpu_seconds(), server.success_count()
        client1, host1 = client_cpu_seconds(), host_ticks()
        r.load1 = load1
        if count1 > count0:
            r.cpu_us = (cpu1 - cpu0) / (count1 - count0) * 1e6
            r.extra["client_cpu_us"] = (client1 - client0) / (count1 - count0) * 1e6
            for role, share in server.cpu_split().items():
                r.extra[f"{role}_cpu_us"] = r.cpu_us * share
        busy, total = host1[0] - host0[0], host1[1] - host0[1]
        if total > 0:
            r.extra["host_busy"] = busy / total
        if r.ok or "stable measurement" not in r.error or attempt == args.retries:
            return r
        log(f"{server.name} c={concurrency}: no stable measurement within -s {stability:g}; "
            f"retrying with -s {stability * 2:g}")
        stability *= 2
    raise AssertionError("unreachable")


def run_perf_analyzer(
    args: argparse.Namespace, server: Server, concurrency: int, repeat: int, work: Path,
    stability: float, attempt: int = 0,
) -> Run:
    stem = f"pa-{server.name}-c{concurrency}-r{repeat}" + (f"-a{attempt}" if attempt else "")
    clients = getattr(args, "clients", 1)
    if clients > 1:
        return _run_clients(args, server, concurrency, repeat, work, stability, stem, clients)
    csv_path = work / f"{stem}.csv"
    cmd = _perf_analyzer_command(args, server, concurrency, stability, csv_path)
    # generous: every trial window, plus start-up and the final report
    timeout = 60 + args.max_trials * args.measurement_interval / 1000 * 3
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        partial = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                   for x in (e.stdout, e.stderr)]
        (work / f"{stem}.log").write_text("".join(partial) + "\n[bench] timed out\n")
        return Run(server.name, concurrency, repeat, False, seconds=time.monotonic() - t0,
                   stability=stability, error=f"perf_analyzer timed out after {timeout:.0f}s")
    seconds = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    (work / f"{stem}.log").write_text(text)
    nums: dict[str, float] = {}
    if proc.returncode == 0 and csv_path.exists():
        try:
            nums = parse_csv(csv_path)
        except (KeyError, ValueError, OSError):
            nums = {}
    if not nums and proc.returncode == 0:
        nums = parse_stdout(text)
    if proc.returncode != 0 or "throughput" not in nums:
        tail = "\n".join(text.strip().splitlines()[-8:])
        return Run(server.name, concurrency, repeat, False, seconds=seconds,
                   stability=stability, error=f"perf_analyzer exited {proc.returncode}: {tail}")
    extra = {k: v for k, v in nums.items() if k not in ("throughput", "p50_us", "p99_us", "avg_us")}
    avg = parse_stdout(text).get("avg_us", float("nan"))
    return Run(server.name, concurrency, repeat, True, nums["throughput"], nums["p50_us"],
               nums["p99_us"], avg, seconds, stability, extra=extra)


def _perf_analyzer_command(args: argparse.Namespace, server: Server, concurrency: int, stability: float,
                           csv_path: Path) -> list[str]:
    return [
        str(args.perf_analyzer),
        "-m", server.model,
        *server.perf_analyzer_args(args.protocol),
        "-i", args.protocol,
        "-b", "1",
        "--concurrency-range", str(concurrency),
        "-p", str(args.measurement_interval),
        "-s", f"{stability:g}",
        "--max-trials", str(args.max_trials),
        "-f", str(csv_path),
    ] + args.pa_arg


def _run_clients(
    args: argparse.Namespace, server: Server, concurrency: int, repeat: int, work: Path, stability: float,
    stem: str, clients: int,
) -> Run:
    """``concurrency`` split over ``clients`` perf_analyzer processes started together (is one
    perf_analyzer the limit?). Throughput is the server's: the answers it counted per second
    from the end of the clients' first window until the first client ended, while all of
    them were loading it (``overlap_rate``). The sum of the clients' own figures, kept as
    ``client_sum``, overstates it: each stabilises on its own, and once one has stopped the
    others' last windows have the server to themselves. p50 is the median of the clients',
    p99 the highest."""
    levels = [concurrency // clients + (1 if index < concurrency % clients else 0) for index in range(clients)]
    timeout = 60 + args.max_trials * args.measurement_interval / 1000 * 3
    t0 = time.monotonic()
    procs = []
    for index, level in enumerate(levels):
        csv_path = work / f"{stem}-k{index}.csv"
        log_file = open(work / f"{stem}-k{index}.log", "w")
        procs.append((subprocess.Popen(_perf_analyzer_command(args, server, level, stability, csv_path),
                                       stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT),
                      csv_path, log_file))
    overlap = overlap_rate(server.success_count, [proc for proc, _, _ in procs],
                           args.measurement_interval / 1000, t0 + timeout)
    results: list[dict[str, float]] = []
    error = ""
    for proc, csv_path, log_file in procs:
        try:
            code = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = -9
        log_file.close()
        nums: dict[str, float] = {}
        if code == 0 and csv_path.exists():
            try:
                nums = parse_csv(csv_path)
            except (KeyError, ValueError, OSError):
                nums = {}
        if code != 0 or "throughput" not in nums:
            error = error or f"perf_analyzer {csv_path.stem} exited {code}"
        else:
            results.append(nums)
    seconds = time.monotonic() - t0
    if error:
        return Run(server.name, concurrency, repeat, False, seconds=seconds, stability=stability, error=error)
    client_sum = sum(r["throughput"] for r in results)
    if overlap is None:
        return Run(server.name, concurrency, repeat, False, seconds=seconds, stability=stability,
                   error=f"the {clients} perf_analyzer clients did not all run past their first window together "
                         f"(their own figures sum to {client_sum:,.0f} infer/s)")
    return Run(server.name, concurrency, repeat, True, overlap,
               statistics.median(r["p50_us"] for r in results), max(r["p99_us"] for r in results),
               float("nan"), seconds, stability, extra={"clients": float(clients), "client_sum": client_sum})


def overlap_rate(
    count: Callable[[], float], procs: list[Any], warm_up_s: float, deadline: float,
    clock: Callable[[], float] = time.monotonic, wait: Callable[[float], None] = time.sleep,
) -> float | None:
    """The rate at which ``count`` (the server's answers so far) grew from ``warm_up_s``
    after now until the first of ``procs`` ended (or ``deadline``): what the server did
    while every client loaded it. None when one ended before the warm-up was over, or the
    overlap was under a second or could not be counted."""
    start = clock() + warm_up_s
    while clock() < start:
        if any(proc.poll() is not None for proc in procs):
            return None
        wait(0.05)
    count0, time0 = count(), clock()
    while clock() < deadline and all(proc.poll() is None for proc in procs):
        wait(0.05)
    count1, time1 = count(), clock()
    if time1 - time0 < 1.0 or not count1 >= count0:  # also false for NaN: the statistics did not answer
        return None
    return (count1 - count0) / (time1 - time0)


# ---------------------------------------------------------------------------------------
# reporting


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt(x: float, digits: int = 0) -> str:
    return "-" if x != x else f"{x:,.{digits}f}"


def summarize(
    runs: list[Run], servers: list[str], levels: list[int], args_stability: float
) -> list[dict[str, object]]:
    """Medians per server and level; ``relaxed``: a run needed a wider -s to stabilise."""
    rows: list[dict[str, object]] = []
    for c in levels:
        for s in servers:
            ok = [r for r in runs if r.server == s and r.concurrency == c and r.ok]
            n = len([r for r in runs if r.server == s and r.concurrency == c])
            rows.append({
                "server": s, "concurrency": c, "runs_ok": len(ok), "runs": n,
                "throughput": median([r.throughput for r in ok]),
                "p50_us": median([r.p50_us for r in ok]),
                "p99_us": median([r.p99_us for r in ok]),
                "cpu_us": median([r.cpu_us for r in ok]),
                "throughput_all": [round(r.throughput, 1) for r in ok],
                "relaxed": any(r.stability > args_stability for r in ok),
            })
    return rows


def print_table(rows: list[dict[str, object]], servers: list[str], levels: list[int]) -> None:
    """One line per server and level; the ratios compare the first server (nereid, or with
    --tls nereid over TLS) with the other one run (Triton, another nereid build with
    --baseline-cmd, plaintext with --tls). ``cpu us``: the server's CPU time per successful
    inference, less sensitive to a busy machine than throughput."""
    head = (f"{'server':<8} {'conc':>5} {'infer/s':>10} {'p50 us':>9} {'p99 us':>9} "
            f"{'cpu us':>7} {'runs':>5}")
    subject = servers[0] if servers else None
    reference = servers[1] if len(servers) > 1 else None
    if reference:
        head += f"  {'thr ratio':>9} {'p50 ratio':>9} {'p99 ratio':>9} {'cpu ratio':>9}"
    print(head)
    print("-" * len(head))
    by = {(r["server"], r["concurrency"]): r for r in rows}
    keys = ("throughput", "p50_us", "p99_us", "cpu_us")
    for c in levels:
        for s in servers:
            r = by[(s, c)]
            line = (f"{s:<8} {c:>5} {fmt(r['throughput'], 1):>10} {fmt(r['p50_us']):>9} "  # type: ignore[arg-type]
                    f"{fmt(r['p99_us']):>9} {fmt(r['cpu_us']):>7} "  # type: ignore[arg-type]
                    f"{r['runs_ok']:>2}/{r['runs']:<1}{'~' if r['relaxed'] else ' '}")
            if reference and s == subject:
                t = by[(reference, c)]
                ratios = [
                    float(r[k]) / float(t[k]) if float(t[k]) else float("nan")  # type: ignore[arg-type]
                    for k in keys
                ]
                line += "  " + " ".join(f"{fmt(x, 2):>9}" for x in ratios)
            print(line)
    if any(r["relaxed"] for r in rows):
        print("~: some runs only stabilised with a wider perf_analyzer -s (see --retries)")
    if reference:
        print(f"ratios are {subject} / {reference}: throughput > 1 and latency, cpu < 1 favour {subject}")
    sys.stdout.flush()


def write_csv(path: Path, runs: list[Run], protocol: str) -> None:
    """Every run, one row each (failed runs too, with their error)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["protocol", "server", "concurrency", "repeat", "ok", "infer_per_s", "p50_us", "p99_us",
                         "cpu_us_per_infer", "stability", "load1", "error"])
        for r in runs:
            writer.writerow([protocol, r.server, r.concurrency, r.repeat, r.ok, f"{r.throughput:.1f}",
                             f"{r.p50_us:.0f}", f"{r.p99_us:.0f}", f"{r.cpu_us:.1f}", r.stability,
                             f"{r.load1:.2f}", r.error])
    log(f"runs written to {path}")


def plot(path: Path, rows: list[dict[str, object]], servers: list[str], levels: list[int], protocol: str) -> None:
    """Throughput (x) against p50 and p99 latency (y) per server, one point per
    concurrency level (medians), every server on the same axes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("--plot needs matplotlib (pip install matplotlib); no plot drawn")
        return
    by = {(r["server"], r["concurrency"]): r for r in rows}
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for index, server in enumerate(servers):
        color = f"C{index}"
        xs = [float(by[(server, c)]["throughput"]) for c in levels]  # type: ignore[arg-type]
        for key, style in (("p50_us", "-o"), ("p99_us", "--^")):
            ys = [float(by[(server, c)][key]) / 1000 for c in levels]  # type: ignore[arg-type]
            axes.plot(xs, ys, style, color=color, label=f"{server} {key[:3]}")
            if key == "p50_us":
                for x, y, c in zip(xs, ys, levels):
                    axes.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes.set_xlabel("throughput (infer/s)")
    axes.set_ylabel("latency (ms)")
    axes.set_title(f"identity model over {protocol.upper()} (perf_analyzer, medians)")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    log(f"plot written to {path}")


# ---------------------------------------------------------------------------------------
# main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated levels")
    p.add_argument("--repeats", type=int, default=1, help="runs per server and level")
    p.add_argument("--measurement-interval", type=int, default=3000,
                   help="perf_analyzer -p: window length, ms")
    p.add_argument("--stability-percentage", type=float, default=10,
                   help="perf_analyzer -s: 3 windows within this %% count as stable")
    p.add_argument("--max-trials", type=int, default=10, help="perf_analyzer --max-trials")
    p.add_argument("--retries", type=int, default=2,
                   help="reruns of a level that did not stabilise, each with twice the -s")
    p.add_argument("--queue-delay-us", type=int, default=0,
                   help="nereid's max_queue_delay_microseconds (default 0: opportunistic batching, "
                        "nereid's best setting here; Triton's identity config uses 100)")
    p.add_argument("--http-server", default=None,
                   help="nereid serve --http-server ENGINE (native, uvicorn, granian, hypercorn)")
    p.add_argument("--nereid-cmd", default=None,
                   help="command that runs nereid (unset: .venv/bin/nereid, else python -m nereid)")
    p.add_argument("--nereid-arg", action="append", default=[],
                   help="extra argument(s) for `nereid serve` (repeatable)")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http",
                   help="perf_analyzer -i: HTTP, or gRPC (nereid's --grpc-port, Triton's gRPC port)")
    p.add_argument("--csv", default=None, help="write every run here as CSV")
    p.add_argument("--plot", default=None,
                   help="draw throughput against p50 and p99 latency per server here (PNG, needs matplotlib)")
    p.add_argument("--baseline-cmd", default=None,
                   help="command that runs another nereid build, measured interleaved with this "
                        "one (e.g. 'env PYTHONPATH=/tmp/old/server .venv/bin/python -m nereid')")
    p.add_argument("--baseline-arg", action="append", default=[],
                   help="the baseline's own `nereid serve` argument(s) instead of --nereid-arg (repeatable); "
                        "without --baseline-cmd the baseline is this build, e.g. --baseline-arg='--grpc-server grpcio'")
    p.add_argument("--triton", action="store_true",
                   help="also measure real Triton, interleaved with nereid")
    p.add_argument("--only-triton", action="store_true", help="measure Triton only")
    p.add_argument("--tls", action="store_true",
                   help="measure this build over TLS (HTTPS, or gRPC over TLS) against itself in plaintext")
    p.add_argument("--triton-anchor", default=str(ANCHOR), help="the triton-anchor script")
    p.add_argument("--triton-repo", default=str(TRITON_REPO),
                   help="Triton-format repository holding identity/")
    p.add_argument("--perf-analyzer", default=str(PERF_ANALYZER), help="perf_analyzer to run")
    p.add_argument("--own-session", action="store_true",
                   help="start each server in a session of its own (its own autogroup CPU share; "
                        "see Server.start)")
    p.add_argument("--pa-arg", action="append", default=[],
                   help="extra argument for perf_analyzer (repeatable, e.g. --pa-arg=--async)")
    p.add_argument("--start-timeout", type=float, default=120, help="seconds to become ready")
    p.add_argument("--json", default=None, help="write every run and the summary here")
    p.add_argument("--keep", action="store_true",
                   help="keep the work directory (server logs, perf_analyzer CSVs and logs)")
    p.add_argument("--smoke", action="store_true",
                   help="quick check: concurrency 4, 1 s windows, at most 3 trials, any "
                        "stability; fails unless every run succeeds")
    args = p.parse_args(argv)
    if args.smoke:
        args.concurrency = "4"
        args.repeats = 1
        args.measurement_interval = 1000
        args.stability_percentage = 1000
        args.max_trials = 3
        args.retries = 0
    try:
        args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        p.error("--concurrency takes integers, e.g. 1,16,64")
    if not args.levels or min(args.levels) < 1 or args.repeats < 1:
        p.error("need at least one level >= 1 and --repeats >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pa = Path(args.perf_analyzer)
    if not pa.exists():
        log(f"{pa} not found; install with `make perf-analyzer`")
        return 2
    check = subprocess.run([str(pa), "--version"], capture_output=True, text=True)
    if check.returncode != 0:
        log(f"perf_analyzer does not run: {(check.stderr or check.stdout).strip()}")
        return 2

    work = Path(tempfile.mkdtemp(prefix="nereid-bench-"))
    servers: list[Server] = []
    if args.tls:
        servers += [TlsNereid(work, args), PlainNereid(work, args)]
    elif not args.only_triton:
        servers.append(Nereid(work, args))
    if args.baseline_cmd or args.baseline_arg:
        servers.append(Baseline(work, args))
    if args.triton or args.only_triton:
        servers.append(Triton(work, args))
    names = [s.name for s in servers]
    runs: list[Run] = []

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    status = 0
    try:
        for s in servers:
            s.start(args.start_timeout, args.own_session)
        log(f"perf_analyzer: {(check.stdout + check.stderr).strip()}; levels {args.levels}; "
            f"{args.repeats} repeat(s); window {args.measurement_interval} ms; work dir {work}")
        for rep in range(args.repeats):
            for c in args.levels:
                # interleaved: nereid, Triton, next level ...; the order flips every repeat
                # (whoever runs first at a level has been seen to fare differently)
                for s in (servers if rep % 2 == 0 else servers[::-1]):
                    r = run_level(args, s, c, rep, work)
                    runs.append(r)
                    if r.ok:
                        log(f"rep {rep + 1} {s.name:<6} c={c:<3} {r.throughput:10.1f} infer/s  "
                            f"p50 {r.p50_us:7.0f} us  p99 {r.p99_us:7.0f} us  ({r.seconds:.0f}s, "
                            f"load {r.load1:.1f})")
                    else:
                        log(f"rep {rep + 1} {s.name:<6} c={c:<3} FAILED: {r.error}")
                        status = 1
                        if s.proc is not None and s.proc.poll() is not None:
                            raise RuntimeError(f"{s.name} died; log:\n{s.log_tail()}")
    except KeyboardInterrupt:
        log("interrupted")
        status = 130
    except RuntimeError as e:
        log(str(e))
        status = 1
    finally:
        for s in servers:
            s.stop()

    rows = summarize(runs, names, args.levels, float(args.stability_percentage))
    if runs:
        print_table(rows, names, args.levels)
    if args.csv and runs:
        write_csv(Path(args.csv), runs, args.protocol)
    if args.plot and runs:
        plot(Path(args.plot), rows, names, args.levels, args.protocol)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"levels": args.levels, "repeats": args.repeats,
             "measurement_interval_ms": args.measurement_interval,
             "queue_delay_us": args.queue_delay_us, "http_server": args.http_server,
             "runs": [asdict(r) for r in runs], "summary": rows},
            indent=2, default=str))
    if args.keep or status not in (0, 130):
        log(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
