#!/usr/bin/env bash
# Table 4 protocol on a GPU host: starts vLLM with the given reader, waits until it serves, and runs the batch
# evaluation with the reader stage on MMLongBench-Doc (configs/mmlongbench.py): cosine, the default selector,
# the paper's CDS, the no-retrieval control (none) and the full-document control (full), budget 10, answer
# extraction and format scoring (cdsjax/eval/reading.py, cdsjax/eval/answer_scoring.py).
#
#   bash experiments/table4_gpu.sh Qwen/Qwen3-VL-32B-Instruct            # TP=4 by default
#   TP=1 bash experiments/table4_gpu.sh Qwen/Qwen2.5-VL-7B-Instruct
#   TP=1 MAX_MODEL_LEN=65536 bash experiments/table4_gpu.sh zai-org/GLM-4.1V-9B-Thinking
#   SEEDS="(0, 1, 2)" OUT=runs/eval/table4-qwen32b bash experiments/table4_gpu.sh Qwen/Qwen3-VL-32B-Instruct
#   bash experiments/table4_gpu.sh Qwen/Qwen2.5-VL-7B-Instruct --config.max_queries=20   # a short trial run
#
# Arguments after the model go to run_eval.py as they are (config overrides, e.g. --config.data_root=DIR).
# Environment: TP (tensor parallel, 4), MAX_MODEL_LEN (32768), MAX_IMAGES (20: images per request, the
# server's --limit-mm-per-prompt and the full-document control's limit), PORT (8000), SEEDS ("(0,)"), SELECTORS,
# CONCURRENCY (16), OUT (runs/eval/table4-<model>), WAIT_S (1800: how long to wait for the server). The
# server's log goes to $OUT/vllm.log; the server is stopped when the evaluation ends. Rerunning resumes: the
# selections from records.jsonl, the replies from $OUT/replies/replies.jsonl.
#
# EXPECTED COST (estimates, not measured; no GPU was available where this script was written):
#   Qwen3-VL-32B-Instruct, bf16, TP=4: about 65 GB of weights, so 4 x 80 GB GPUs at 80% memory use;
#     7B/9B readers: one 80 GB GPU.
#   Requests: 324 questions x 5 selectors x 2 calls (answer, extraction) x seeds, fewer where selections
#     agree (one cached reply); at 16 in flight and a few seconds each, roughly 1-3 hours for one seed on
#     the 32B reader, plus 10-30 minutes of model loading and PDF indexing on a cold cache.
set -euo pipefail

MODEL="${1:?usage: table4_gpu.sh MODEL [--config.FIELD=VALUE ...] (e.g. Qwen/Qwen3-VL-32B-Instruct)}"
shift
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
PORT="${PORT:-8000}"
SEEDS="${SEEDS:-(0,)}"
SELECTORS="${SELECTORS:-cosine,cds_learned_pages,cds,none,full}"
CONCURRENCY="${CONCURRENCY:-16}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-32768}"
MAX_IMAGES="${MAX_IMAGES:-20}"
WAIT_S="${WAIT_S:-1800}"
OUT="${OUT:-runs/eval/table4-$(basename "$MODEL")}"
URL="http://127.0.0.1:${PORT}/v1"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"  # the log and the evaluation write to one place, wherever this is run from

PORT="$PORT" MAX_MODEL_LEN="$MAX_MODEL_LEN" MAX_IMAGES="$MAX_IMAGES" MODEL="$MODEL" bash "$HERE/serve_reader.sh" >"$OUT/vllm.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT

echo "table4_gpu.sh: waiting for $MODEL at $URL (log: $OUT/vllm.log)" >&2
start=$(date +%s)
until curl -sf "$URL/models" >/dev/null 2>&1; do
  if ! kill -0 "$SERVER" 2>/dev/null; then
    echo "table4_gpu.sh: the vLLM server exited; see $OUT/vllm.log" >&2
    tail -20 "$OUT/vllm.log" >&2
    exit 1
  fi
  if (( $(date +%s) - start > WAIT_S )); then
    echo "table4_gpu.sh: the server did not come up within ${WAIT_S} s; see $OUT/vllm.log" >&2
    exit 1
  fi
  sleep 10
done
echo "table4_gpu.sh: server up after $(( $(date +%s) - start )) s" >&2

cd "$ROOT"
python experiments/run_eval.py --config configs/mmlongbench.py \
  --config.output_dir="$OUT" \
  --config.selectors="$SELECTORS" \
  --config.budgets="(10,)" \
  --config.reader.url="$URL" \
  --config.reader.model="$MODEL" \
  --config.reader.concurrency="$CONCURRENCY" \
  --config.reader.max_context="$MAX_MODEL_LEN" \
  --config.reader.max_images="$MAX_IMAGES" \
  --config.reader.seeds="$SEEDS" \
  "$@"
echo "table4_gpu.sh: tables in $OUT/summary.md, answers in $OUT/answers.jsonl" >&2
