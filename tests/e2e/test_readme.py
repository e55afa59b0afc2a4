"""Every fenced code block of README.md is run or checked, so the README cannot drift.

The blocks are read in order and grouped by section (the nearest ``##`` or ``###``
heading); each section is one test, and its blocks run in order in a scratch folder, the
way a reader would run them one after the other. A block is handled by its info string and
content, or by a marker, an HTML comment on the line(s) just before it:
``<!-- readme-test: KIND ARGS -->``. A block that none of the rules below recognises
fails the test: give it a handler (or, for a block that truly cannot run here, a
``<!-- readme-test: skip because REASON -->`` marker).

Blocks, by kind:

* **file**: a ``toml`` or ``python`` block whose first line is ``# PATH`` (``PATH`` ending
  in ``.py`` or ``.toml``, optionally followed by ``, words``) is that file, written into
  the section's folder. A ``config.toml`` is also validated with nereid's loader. Written
  into a repository that a poll-mode server is serving, the test waits for the reload
  (the next ``successfully loaded`` / ``failed to load`` line for that model).
* **toml** without a path: validated with nereid's loader (``load_model_config``).
* **python** without a path: run with the venv's Python (``sys.executable``); every
  ``print(...)  # -> TEXT`` comment must be a line of its output, in order.
* **console**: a block whose first line starts with ``$ ``: each ``$ command`` runs in
  bash, and the lines after it, up to the next ``$``, are its expected output (stdout and
  stderr together). Comparison is exact, except: a line ``...`` stands for any number of
  lines; on lines starting with a prefix named by a ``varies "PREFIX", ...`` marker only
  the text up to the first digit is compared (batch sizes and timings change between
  runs). A command must exit 0, unless its expected output shows a Python traceback or
  the next command is ``echo $?`` (which checks the status instead). A command with no
  output shown is checked by its exit status only.
* **serve**: a ``bash`` block that is one ``nereid serve`` command: started in the
  background (its own process group) with ``--http-port``, ``--grpc-port`` and
  ``--metrics-port`` of free ports appended; the section's later blocks talk to it. Or one
  ``.venv/bin/python SCRIPT.py`` command, the script a file of the section that calls
  ``nereid.serve(...)``: its ``http_port=8000`` becomes free HTTP, gRPC and metrics ports,
  and it runs in the section's folder (where ``model_repository`` is the README's).
* **commands**: a ``bash`` block of ``make ...`` and ``.venv/bin/python perf/...`` lines:
  each ``make`` line must dry-run (``make -n``; for ``make serve`` the dry run must show
  the HTTP port given, gRPC and metrics on the next two ports, and the ARGS given), each
  perf script must accept every flag shown (``--help``). Benchmarks and the whole suite are
  not run from here.
* markers: ``tree`` (the model_repository/ listing matches the folder), ``server-log``
  (each line begins a line of the section's server log, in order; ``...`` inside a line
  matches anything), ``synopsis`` (every flag exists in ``nereid serve --help``, with
  the same choices), ``config-errors`` (each message is what the loader says for the
  mutation of the named config in CONFIG_MUTATIONS below).

Addresses: ``127.0.0.1:8000`` and ``localhost:8000`` (and ``--http-port 8000``) are
rewritten to the port of the server the section uses, in commands, code and expected
output; scripts in ``clients/`` that take ``--url`` get it; ``.venv/bin/`` means the venv
this test runs in. Which server: the one a **serve** block started; else, if the section
wrote model folders, one started on them (``tests.conftest.start_server``); else the
README's own server, started the README's way: ``make serve PORT=... GRPC_PORT=...
METRICS_PORT=...`` from the repository root (shared by the module).

Every block that starts a server which keeps running (a **serve** block, ``make serve``)
must say in the prose just before it (since the previous block) what must be stopped
first: the README's steps reuse the same ports. A section that writes model
folders but never calls a server gets one started on them at the end, and every model is
called once with generated inputs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from nereid.config.load import load_model_config
from nereid.errors import ConfigError

from tests.conftest import ROOT, RunningServer, free_port, start_server
from tests.waiting import START_TIMEOUT_S, wait_until

README = ROOT / "README.md"
PERF_README = ROOT / "perf" / "README.md"
VENV_BIN = Path(sys.executable).parent

MARKER = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
FILE_LINE = re.compile(r"^#\s+([\w.-]+(?:/[\w.-]+)*\.(?:py|toml))(?:,.*)?$")
FENCE = re.compile(r"^(```+)\s*([\w+-]*)\s*$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
EXPECT_COMMENT = re.compile(r"#\s*->\s*(.+?)\s*$")
ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):8000\b")
HTTP_PORT_FLAG = re.compile(r"--http-port 8000\b")
HTTP_PORT_KEYWORD = re.compile(r"\bhttp_port=8000\b")
SCRIPT_COMMAND = re.compile(r"^\.venv/bin/python (?!perf/)[\w.-]+\.py$")
DIARY = re.compile(r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this|that|earlier|later)\s+session", re.IGNORECASE)

#: config-errors: the mutation of a shipped config that produces each documented message.
#: A message in the README without an entry here fails the test.
CONFIG_MUTATIONS: dict[str, Callable[[str], str]] = {
    'input[0].dims: expected a list of integers, got "16"':
        lambda text: re.sub(r"(?m)^dims = \[1\]$", 'dims = "16"', text, count=1),
    'unknown key "max_batch_sise" (did you mean "max_batch_size"?)':
        lambda text: re.sub(r"(?m)^max_batch_size =", "max_batch_sise =", text, count=1),
}

DEADLINE_S = 60.0
COMMAND_TIMEOUT_S = 300.0


# -- reading the README -------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    info: str
    text: str
    markers: tuple[str, ...]  # the readme-test markers right before the block
    section: str  # slug of the nearest ## or ### heading
    lead: str = ""  # the prose between the previous block (or heading) and this one

    @property
    def where(self) -> str:
        return f"README.md line {self.line}"

    def marker(self, kind: str) -> str | None:
        """The arguments of this block's ``kind`` marker ("" if it has none), or None."""
        for marker in self.markers:
            name, _, rest = marker.partition(" ")
            if name == kind:
                return rest
        return None


def slug(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading).lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def read_blocks(path: Path = README) -> list[Block]:
    lines = path.read_text().split("\n")
    blocks: list[Block] = []
    section = "top"
    pending: list[str] = []
    prose: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            start, body = i, []
            i += 1
            while i < len(lines) and lines[i].strip() != fence.group(1):
                body.append(lines[i])
                i += 1
            assert i < len(lines), f"README.md line {start + 1}: unclosed code block"
            blocks.append(Block(start + 1, fence.group(2), "\n".join(body), tuple(pending), section, " ".join(prose)))
            pending, prose = [], []
        elif (marker := MARKER.match(line)) is not None:
            pending.append(marker.group(1))
        elif (heading := HEADING.match(line)) is not None:
            if len(heading.group(1)) <= 3:
                section = slug(heading.group(2))
            pending, prose = [], []
        elif line.strip() and not line.lstrip().startswith("<!--"):
            pending = []  # a marker belongs to the block right after it
            prose.append(line.strip())
        i += 1
    return blocks


def file_path(block: Block) -> str | None:
    first = block.text.split("\n", 1)[0]
    match = FILE_LINE.match(first)
    return match.group(1) if match and block.info in ("toml", "python") else None


def is_serve_command(line: str) -> bool:
    return bool(re.match(r"^(\S*/)?nereid serve\b|^python -m nereid serve\b", line))


def command_lines(text: str) -> list[str]:
    """The commands of a bash block: comments and blank lines dropped, continuations joined."""
    joined = text.replace("\\\n", " ")
    return [line.split(" #", 1)[0].strip() for line in joined.split("\n") if line.strip() and not line.lstrip().startswith("#")]


def kind_of(block: Block) -> str:
    """What handles ``block`` (see the module docstring), or "unknown"."""
    for kind in ("skip", "tree", "server-log", "synopsis", "config-errors"):
        if block.marker(kind) is not None:
            return kind
    if file_path(block) is not None:
        return "file"
    if block.info == "toml":
        return "toml"
    if block.info == "python":
        return "python"
    if block.text.startswith("$ "):
        return "console"
    if block.info in ("bash", "sh", "shell"):
        commands = command_lines(block.text)
        if len(commands) == 1 and (is_serve_command(commands[0]) or SCRIPT_COMMAND.match(commands[0])):
            return "serve"
        if commands and all(c.startswith(("make ", ".venv/bin/python perf/")) for c in commands):
            return "commands"
    return "unknown"


BLOCKS = read_blocks()
SECTIONS: dict[str, list[Block]] = {}
for _block in BLOCKS:
    SECTIONS.setdefault(_block.section, []).append(_block)


# -- output comparison --------------------------------------------------------------------


def _line_pattern(line: str, varies: tuple[str, ...]) -> str:
    if any(line.startswith(prefix) for prefix in varies):
        digit = re.search(r"\d", line)
        return re.escape(line[: digit.start()] if digit else line) + r"[^\n]*"
    return re.escape(line)


def output_matches(expected: list[str], actual: str, varies: tuple[str, ...] = ()) -> bool:
    """``actual`` against the README's lines: exact, ``...`` lines match any lines, lines
    starting with a ``varies`` prefix are compared up to their first digit."""
    while expected and not expected[-1].strip():
        expected = expected[:-1]
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if line == "..." else _line_pattern(line, varies) + r"\n" for line in expected
    )
    text = actual.rstrip("\n")
    return re.fullmatch(pattern, text + "\n" if text else "") is not None


def log_matches(expected: list[str], log: str) -> bool:
    """Each expected line begins a line of ``log``, in order (other lines may come
    between); ``...`` inside an expected line matches anything."""
    patterns = [re.compile(".*?".join(re.escape(part) for part in line.split("..."))) for line in expected if line.strip()]
    lines = iter(log.split("\n"))
    return all(any(pattern.match(line) for line in lines) for pattern in patterns)


def test_output_matching_rules() -> None:
    assert output_matches(["a", "...", "z"], "a\nb\nc\nz\n")
    assert output_matches(["a", "...", "z"], "a\nz")
    assert not output_matches(["a", "z"], "a\nb\nz")
    assert output_matches(["took 12 ms"], "took 345 ms", ("took",))
    assert not output_matches(["took 12 ms"], "took 345 ms")
    assert output_matches(["x", ""], "x\n")
    assert log_matches(["E... nereid] boom", "  File"], "I1 x nereid] ok\nE1 2 3 nereid] boom here\n  File y")
    assert not log_matches(["second", "first"], "first\nsecond")


# -- servers ------------------------------------------------------------------------------


def wait_ready(server: RunningServer, timeout: float = START_TIMEOUT_S) -> None:
    def ready() -> bool:
        if server.process.poll() is not None:
            raise AssertionError(f"server exited with {server.process.returncode}:\n{server.log()}")
        try:
            with urllib.request.urlopen(server.http + "/v2/health/ready", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    wait_until(ready, lambda: f"server ready:\n{server.log()}", timeout=timeout, every=0.05)


def stop_group(server: RunningServer) -> None:
    """SIGTERM the server's process group (make and nereid), then wait for it. A server
    that does not lead a process group of its own (conftest's) is stopped by itself."""
    if server.stopped:
        return
    if server.process.poll() is None and os.getpgid(server.process.pid) != server.process.pid:
        server.stop()
        return
    server.stopped = True
    if server.process.poll() is None:
        try:
            os.killpg(server.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()
    try:  # make exits first; let nereid finish its shutdown too
        os.killpg(server.process.pid, 0)
    except ProcessLookupError:
        return
    def gone() -> bool:
        try:
            os.killpg(server.process.pid, 0)
        except ProcessLookupError:
            return True
        return False

    try:
        wait_until(gone, "the server's process group gone after SIGTERM", timeout=30, every=0.05)
    except pytest.fail.Exception:
        os.killpg(server.process.pid, signal.SIGKILL)


def spawn(command: list[str], cwd: Path, log_path: Path, port: int) -> RunningServer:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    return RunningServer(process, port, log_path)


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], RunningServer]]:
    """The README's server, started the README's way (``make serve``) on first use."""
    started: list[RunningServer] = []

    def get() -> RunningServer:
        if not started:
            stale = subprocess.run(["make", "-q", "install"], cwd=ROOT, capture_output=True, check=False)
            assert stale.returncode == 0, (
                ".venv is older than pyproject.toml: `make serve` would reinstall it inside this test; "
                "run `make install` first"
            )
            port = free_port()
            log_path = tmp_path_factory.mktemp("readme-server") / "make-serve.log"
            command = ["make", "serve", f"PORT={port}", f"GRPC_PORT={free_port()}", f"METRICS_PORT={free_port()}"]
            server = spawn(command, ROOT, log_path, port)
            started.append(server)
            wait_ready(server)
        return started[0]

    yield get
    for server in started:
        stop_group(server)


# -- a section's run ----------------------------------------------------------------------


@dataclass
class Section:
    name: str
    work: Path
    readme_server: Callable[[], RunningServer]
    own: RunningServer | None = None  # started by a serve block, or on the section's models
    own_repository: Path | None = None
    poll: bool = False
    used_server: bool = False
    wrote_files: bool = False
    models: dict[str, Path] = field(default_factory=dict)  # model name -> folder
    last_output: tuple[str, int] | None = None

    @property
    def cwd(self) -> Path:
        return self.work if self.wrote_files else ROOT

    def server(self) -> RunningServer:
        self.used_server = True
        if self.own is None and self.models:
            roots = {folder.parent for folder in self.models.values()}
            assert len(roots) == 1, f"{self.name}: the section's models are in several repositories: {roots}"
            self.own_repository = roots.pop()
            self.own = start_server(self.own_repository, log_dir=self.work.parent)
        return self.own if self.own is not None else self.readme_server()

    def rewrite(self, text: str) -> str:
        """Addresses of the README (port 8000) -> the section's server."""
        if ADDRESS.search(text) or HTTP_PORT_FLAG.search(text):
            server = self.server()
            text = ADDRESS.sub(server.url, text)
            text = HTTP_PORT_FLAG.sub(f"--http-port {server.port}", text)
        return text

    def close(self) -> None:
        if self.own is not None:
            stop_group(self.own)


def run_section(section: Section, blocks: list[Block]) -> None:
    for block in blocks:
        kind = kind_of(block)
        handler = HANDLERS.get(kind)
        assert handler is not None, f"{block.where}: no handler for this block ({block.info or 'no info string'}):\n{block.text}"
        handler(section, block)
    if section.models and not section.used_server:
        smoke_models(section)


# -- handlers -----------------------------------------------------------------------------


def handle_skip(section: Section, block: Block) -> None:
    reason = block.marker("skip") or ""
    assert reason.startswith("because ") and len(reason) > len("because "), (
        f"{block.where}: a skip marker needs a reason: <!-- readme-test: skip because ... -->"
    )


def handle_file(section: Section, block: Block) -> None:
    relative = file_path(block)
    assert relative is not None
    path = section.work / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    model_folder = None
    if path.name in ("config.toml", "model.py"):
        model_folder = path.parent.parent if path.parent.name.isdigit() else path.parent
    watched = (
        model_folder is not None and section.own is not None and section.poll
        and section.own_repository is not None and model_folder.parent.resolve() == section.own_repository.resolve()
    )
    before = reload_count(section.own, model_folder.name) if watched and section.own and model_folder else 0
    path.write_text(block.text + "\n")
    section.wrote_files = True
    if model_folder is not None:
        section.models[model_folder.name] = model_folder
    if path.name == "config.toml":
        assert model_folder is not None
        load_model_config(path, model_folder.name)  # raises ConfigError naming the key
    if watched and section.own is not None and model_folder is not None:
        server, name = section.own, model_folder.name
        poll_until(lambda: reload_count(server, name) > before,
                   f"{block.where}: the poll-mode server did not reload '{name}' after {relative} changed", server)


def reload_count(server: RunningServer | None, name: str) -> int:
    if server is None:
        return 0
    log = server.log()
    return log.count(f"successfully loaded '{name}'") + log.count(f"failed to load '{name}'")


def poll_until(condition: Callable[[], bool], message: str, server: RunningServer | None = None,
               timeout: float = DEADLINE_S) -> None:
    wait_until(condition, lambda: message + (f"\nserver log:\n{server.log()}" if server is not None else ""),
               timeout=timeout, every=0.05)


def handle_toml(section: Section, block: Block) -> None:
    data = tomllib.loads(block.text)
    folder = section.work / "toml-check" / f"block{block.line}"
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(block.text + "\n")
    load_model_config(folder / "config.toml", str(data.get("name", folder.name)))


def handle_python(section: Section, block: Block) -> None:
    code = section.rewrite(block.text)
    script = section.work.parent / f"block{block.line}.py"
    script.write_text(code + "\n")
    completed = subprocess.run([sys.executable, str(script)], cwd=section.cwd, capture_output=True, text=True,
                               check=False, timeout=COMMAND_TIMEOUT_S, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert completed.returncode == 0, (
        f"{block.where}: the block exited with {completed.returncode}\n"
        f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
    )
    expected = [m.group(1) for line in block.text.split("\n") if (m := EXPECT_COMMENT.search(line))]
    lines = iter(completed.stdout.split("\n"))
    for want in expected:
        assert any(line == want for line in lines), (
            f"{block.where}: expected a line {want!r} (from its `# -> ...` comments, in order) in:\n{completed.stdout}"
        )


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    for line in text.split("\n"):
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def handle_console(section: Section, block: Block) -> None:
    varies = tuple(re.findall(r'"([^"]*)"', block.marker("varies") or ""))
    steps = console_steps(block.text)
    for index, (command, expected) in enumerate(steps):
        if command.strip() == "echo $?":
            assert section.last_output is not None, f"{block.where}: `echo $?` with no command before it"
            output, status = section.last_output
            assert expected and str(status) == expected[0].strip(), (
                f"{block.where}: expected exit status {expected[0] if expected else '?'}, got {status}; output:\n{output}"
            )
            continue
        if re.match(r"\s*(mkdir|touch|cp|mv)\b", command):
            section.wrote_files = True  # files it makes go to the section's folder, never the checkout
            if not (section.cwd / "model_repository").exists():  # what later commands may name
                (section.cwd / "model_repository").symlink_to(ROOT / "model_repository")
        runnable = prepare_command(section, command)
        completed = subprocess.run(["bash", "-c", runnable], cwd=section.cwd, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, check=False, timeout=COMMAND_TIMEOUT_S,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"))
        output = completed.stdout
        section.last_output = (output, completed.returncode)
        status_checked = index + 1 < len(steps) and steps[index + 1][0].strip() == "echo $?"
        shows_traceback = any(line.startswith("Traceback (most recent call last)") for line in expected)
        if not status_checked and not shows_traceback:
            assert completed.returncode == 0, (
                f"{block.where}: `{command}` exited with {completed.returncode}:\n{output}"
            )
        want = [section.rewrite(line) if ADDRESS.search(line) else line for line in expected]
        if any(line.strip() for line in want):
            assert output_matches(want, output, varies), (
                f"{block.where}: `{command}` printed:\n{output}\n--- the README shows:\n" + "\n".join(want)
            )


def prepare_command(section: Section, command: str) -> str:
    """The README's command as this test runs it (see the module docstring)."""
    words = shlex.split(command)
    for word in words:
        if word.endswith(".py") and (section.work / word).is_file():
            script = section.work / word  # a file the section wrote: point it at the server
            script.write_text(section.rewrite(script.read_text()))
    runnable = command.replace(".venv/bin/", f"{VENV_BIN}/")
    match = re.search(r"(?<![\w/])clients/(\w+)\.py", runnable)
    if match is not None:
        source = ROOT / "clients" / f"{match.group(1)}.py"
        assert source.is_file(), f"no such client script: {source}"
        runnable = runnable.replace(match.group(0), shlex.quote(str(source)))
        if '"--url"' in source.read_text() and "--url" not in runnable:
            runnable += f" --url {section.server().url}"
    return section.rewrite(runnable)


def handle_serve(section: Section, block: Block) -> None:
    [command] = command_lines(block.text)
    assert section.own is None, f"{block.where}: the section already has a server"
    if SCRIPT_COMMAND.match(command):
        serve_script(section, block, command)
        return
    words = shlex.split(command)
    serve = words.index("serve")
    argv = [str(VENV_BIN / "nereid") if words[0].endswith("nereid") else words[0], *words[1:]]
    if words[0] == "python":
        argv[0] = sys.executable
    port = free_port()
    argv += ["--http-port", str(port), "--metrics-port", str(free_port()), "--grpc-port", str(free_port())]
    repository = words[words.index("--model-repository") + 1] if "--model-repository" in words else "model_repository"
    section.own_repository = section.cwd / repository
    section.poll = "--model-control-mode" in words and words[words.index("--model-control-mode") + 1] == "poll"
    assert serve > 0
    server = spawn(argv, section.cwd, section.work.parent / f"serve-{port}.log", port)
    section.own = server
    section.used_server = True
    wait_ready(server)


def serve_script(section: Section, block: Block, command: str) -> None:
    """``.venv/bin/python SCRIPT.py``: a script of the section that calls nereid.serve,
    run on free ports in the section's folder, as a reader runs it from the repository's."""
    script = section.cwd / command.split()[-1]
    assert script.is_file(), f"{block.where}: no file {script.name} written before this block"
    code = script.read_text()
    assert "nereid.serve(" in code and HTTP_PORT_KEYWORD.search(code), (
        f"{block.where}: {script.name} is not a script that calls nereid.serve(..., http_port=8000, ...)"
    )
    port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    script.write_text(HTTP_PORT_KEYWORD.sub(f"http_port={port}, grpc_port={grpc_port}, metrics_port={metrics_port}", code))
    if not (section.cwd / "model_repository").exists():
        (section.cwd / "model_repository").symlink_to(ROOT / "model_repository")
    section.own_repository = ROOT / "model_repository"
    server = spawn([sys.executable, str(script)], section.cwd, section.work.parent / f"serve-{port}.log", port)
    section.own = server
    section.used_server = True
    wait_ready(server)


def handle_commands(section: Section, block: Block) -> None:
    for command in command_lines(block.text):
        words = shlex.split(command)
        if words[0] == "make":
            dry = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, check=False, timeout=60)
            assert dry.returncode == 0, f"{block.where}: `make -n {' '.join(words[1:])}` failed:\n{dry.stderr}"
            if len(words) > 1 and words[1] == "serve":
                assigned = dict(word.split("=", 1) for word in words[2:] if "=" in word)
                port = int(assigned.get("PORT", "8000"))
                shown = (f"nereid serve --model-repository model_repository --http-port {port} "
                         f"--grpc-port {port + 1} --metrics-port {port + 2}")
                assert shown in dry.stdout, f"{block.where}: `{command}` would not run `{shown}`:\n{dry.stdout}"
                assert assigned.get("ARGS", "") in dry.stdout, f"{block.where}: `{command}` drops ARGS:\n{dry.stdout}"
        else:
            script = ROOT / words[1]
            helped = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True,
                                    text=True, check=False, timeout=60)
            assert helped.returncode == 0, f"{block.where}: `{words[1]} --help` failed:\n{helped.stderr}"
            for flag in (w.split("=", 1)[0] for w in words[2:] if w.startswith("--")):
                assert flag in helped.stdout, f"{block.where}: {words[1]} has no flag {flag}:\n{helped.stdout}"


def handle_tree(section: Section, block: Block) -> None:
    lines = [line for line in block.text.split("\n") if line.strip()]
    root = ROOT / lines[0].strip().rstrip("/")
    assert root.is_dir(), f"{block.where}: no folder {root}"
    listed = {}
    for line in lines[1:]:
        name, _, description = line.strip().partition(" ")
        listed[name.rstrip("/")] = description
    models = {p.name for p in root.iterdir() if p.is_dir() and (p / "config.toml").is_file() and p.name[0] not in "._"}
    assert set(listed) == models, f"{block.where}: the tree lists {sorted(listed)}, the folder has {sorted(models)}"
    for name, description in listed.items():
        for relative in re.findall(r"[\w/]+\.(?:toml|py|md)", description):
            assert (root / name / relative).is_file(), f"{block.where}: {root.name}/{name}/{relative} does not exist"
        versioned = any(p.is_dir() and p.name.isdigit() for p in (root / name).iterdir())
        if "versioned" in description:
            assert ("unversioned" not in description) == versioned, (
                f"{block.where}: {name} is {'versioned' if versioned else 'unversioned'}"
            )


def handle_server_log(section: Section, block: Block) -> None:
    server = section.server()
    expected = block.text.split("\n")
    if not log_matches(expected, server.log()):
        # The log line may land a moment after the client's answer: wait for it.
        poll_until(lambda: log_matches(expected, server.log()),
                   f"{block.where}: the server log does not show these lines in order:\n{block.text}", server,
                   timeout=10)
    if any("Traceback (most recent call last)" in line for line in expected):
        # The fault log of a model's exception: its traceback, naming the user's file.
        log = server.log()
        files = [name.split("...")[-1] for name in re.findall(r'File "([^"]+)"', block.text)]
        assert "Traceback (most recent call last)" in log, log
        assert files and all(name in log for name in files), (files, log)


def handle_synopsis(section: Section, block: Block) -> None:
    helped = subprocess.run([str(VENV_BIN / "nereid"), "serve", "--help"], capture_output=True, text=True, check=False, timeout=60)
    assert helped.returncode == 0, helped.stderr
    help_text = helped.stdout
    for flag, value in re.findall(r"(--[\w-]+)(?: ([^\]\s\\]+))?", block.text):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text), f"{block.where}: `nereid serve` has no flag {flag}"
        if value and "|" in value:
            choices = re.search(rf"{re.escape(flag)} \{{([^}}]*)\}}", help_text)
            documented = set(value.split("|"))
            if choices is not None:
                assert documented == set(choices.group(1).split(",")), f"{block.where}: {flag} takes {choices.group(1)}"
            else:
                assert documented == {"true", "false"}, f"{block.where}: {flag} {value}"


def handle_config_errors(section: Section, block: Block) -> None:
    for line in (line for line in block.text.split("\n") if line.strip()):
        relative, _, message = line.partition(": ")
        source = ROOT / relative
        assert source.is_file(), f"{block.where}: no such config {relative}"
        mutations = [mutate for key, mutate in CONFIG_MUTATIONS.items() if key == message]
        assert mutations, f"{block.where}: no mutation produces {message!r}: add one to CONFIG_MUTATIONS"
        target = section.work / "config-errors" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        mutated = mutations[0](source.read_text())
        assert mutated != source.read_text(), f"{block.where}: the mutation for {message!r} changed nothing in {relative}"
        target.write_text(mutated)
        with pytest.raises(ConfigError) as raised:
            load_model_config(target, target.parent.name)
        got = str(raised.value).replace(str(section.work / "config-errors") + os.sep, "")
        assert got == line, f"{block.where}: the loader says\n  {got}\nthe README shows\n  {line}"


HANDLERS: dict[str, Callable[[Section, Block], None]] = {
    "skip": handle_skip,
    "file": handle_file,
    "toml": handle_toml,
    "python": handle_python,
    "console": handle_console,
    "serve": handle_serve,
    "commands": handle_commands,
    "tree": handle_tree,
    "server-log": handle_server_log,
    "synopsis": handle_synopsis,
    "config-errors": handle_config_errors,
}


# -- calling a section's models when nothing else did ---------------------------------------


def smoke_models(section: Section) -> None:
    """Serve the section's model folders and call each once with generated inputs: it
    must be READY and answer with every configured output."""
    import tritonclient.http as httpclient

    server = section.server()
    client = httpclient.InferenceServerClient(server.url)
    try:
        for name, folder in section.models.items():
            config = client.get_model_config(name)
            batched = int(config.get("max_batch_size", 0)) > 0
            if config.get("model_transaction_policy", {}).get("decoupled"):
                body = {spec["name"]: sample(spec, batched).reshape(-1).tolist() for spec in config["input"]
                        if not spec.get("optional")}
                request = urllib.request.Request(f"{server.http}/v2/models/{name}/generate",
                                                 json.dumps(body, default=str).encode(), method="POST")
                with urllib.request.urlopen(request, timeout=60) as response:
                    answer = json.loads(response.read())
                missing = [o["name"] for o in config["output"] if o["name"] not in answer]
                assert not missing, f"{folder}: /generate answered {answer}"
                continue
            inputs = []
            for spec in config["input"]:
                if spec.get("optional"):
                    continue
                array = sample(spec, batched)
                tensor = httpclient.InferInput(spec["name"], list(array.shape), spec["data_type"].removeprefix("TYPE_").replace("STRING", "BYTES"))
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            result = client.infer(name, inputs)
            for spec in config["output"]:
                array = result.as_numpy(spec["name"])
                assert array is not None, f"{folder}: no output {spec['name']}"
                dims = [int(d) for d in spec.get("reshape", {}).get("shape", spec["dims"])] if "reshape" in spec else [int(d) for d in spec["dims"]]
                want = ([1] if batched else []) + dims
                assert len(array.shape) == len(want) and all(w in (-1, g) for w, g in zip(want, array.shape)), (
                    f"{folder}: output {spec['name']} has shape {list(array.shape)}, the config says {want}"
                )
    finally:
        client.close()


def sample(spec: dict[str, object], batched: bool) -> np.ndarray:
    dims = [3 if int(d) == -1 else int(d) for d in spec["dims"]]  # type: ignore[attr-defined]
    shape = ([1] if batched else []) + dims
    data_type = str(spec["data_type"]).removeprefix("TYPE_")
    if data_type == "STRING":
        return np.full(shape, b"text", dtype=object)
    if data_type == "BOOL":
        return np.ones(shape, dtype=bool)
    numpy_type = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(data_type)
    if numpy_type is None:
        numpy_type = np.dtype(data_type.lower()).type
    return np.ones(shape, dtype=numpy_type)


# -- the tests ------------------------------------------------------------------------------


def test_every_block_has_a_handler() -> None:
    unknown = [f"{b.where} ({b.info or 'no info string'}): {b.text.splitlines()[0] if b.text else ''}"
               for b in BLOCKS if kind_of(b) not in HANDLERS]
    assert not unknown, "blocks no handler recognises (see this file's docstring):\n" + "\n".join(unknown)
    assert BLOCKS, "no code blocks found in README.md"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(SECTIONS))
def test_section(name: str, tmp_path: Path, readme_server: Callable[[], RunningServer]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    section = Section(name, work, readme_server)
    try:
        run_section(section, SECTIONS[name])
    finally:
        section.close()


def starts_a_server(block: Block) -> bool:
    """Whether ``block`` starts a server that keeps running (and holds its ports)."""
    kind = kind_of(block)
    if kind == "serve":
        return True
    return kind == "commands" and any(shlex.split(c)[:2] == ["make", "serve"] for c in command_lines(block.text))


def test_every_step_that_starts_a_server_says_what_to_stop_first() -> None:
    steps = [block for block in BLOCKS if starts_a_server(block)]
    assert len(steps) >= 3, [block.where for block in steps]
    silent = [f"{block.where}: {block.text.splitlines()[0]}" for block in steps if "stop" not in block.lead.lower()]
    assert not silent, (
        "these README steps start a server without saying, just before, what must be stopped first:\n"
        + "\n".join(silent)
    )


def test_every_flag_of_nereid_serve_is_documented() -> None:
    helped = subprocess.run([str(VENV_BIN / "nereid"), "serve", "--help"], capture_output=True, text=True, check=False, timeout=60)
    flags = set(re.findall(r"(?m)^\s+(--[\w-]+)", helped.stdout)) - {"--help"}
    assert flags, helped.stdout
    text = README.read_text()
    missing = sorted(flag for flag in flags if f"`{flag}`" not in text)
    assert not missing, f"README.md's flag table lacks {missing}"


def test_no_session_diary() -> None:
    for path in (README, PERF_README):
        text = " ".join(path.read_text().split())  # a phrase may wrap across lines
        hits = [match.group(0) for match in DIARY.finditer(text)]
        assert not hits, f"{path.relative_to(ROOT)} reads like a diary of sessions: {hits}"


def test_the_request_flow_names_modules_and_names_that_exist() -> None:
    """"How a request flows through the code" names modules, classes and functions: each
    must still exist under server/nereid/ (a rename or a split must update the README)."""
    text = README.read_text()
    start = text.index("## How a request flows through the code")
    section = text[start : text.index("\n## ", start + 1)]
    package = ROOT / "server" / "nereid"
    sources = "\n".join(path.read_text() for path in package.rglob("*.py"))
    names = re.findall(r"`([^`]+)`", section)
    assert names
    for name in names:
        if name.endswith(".py"):
            assert (package / name).is_file(), f"README names server/nereid/{name}, which does not exist"
        elif re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", name):  # a module, class or function name
            last = name.split(".")[-1]
            assert re.search(rf"\b(?:def|class)\s+{re.escape(last)}\b|\b{re.escape(last)}\s*=[^=]", sources), (
                f"README names `{name}`: no def, class or assignment of {last} under server/nereid/"
            )
