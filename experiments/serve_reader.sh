#!/usr/bin/env bash
# Starts the paper's reader as an OpenAI-compatible server with vLLM (needs GPUs and the model weights;
# never run by the tests, which use a local fake server).
#
#   bash experiments/serve_reader.sh                      # Qwen3-VL-32B on 4 GPUs, port 8000
#   MODEL=Qwen/Qwen2.5-VL-7B-Instruct TP=1 bash experiments/serve_reader.sh
#   MODEL=zai-org/GLM-4.1V-9B-Thinking TP=1 MAX_MODEL_LEN=65536 bash experiments/serve_reader.sh
#
# Then point cdsjax at it:
#   export CDSJAX_READER_URL=http://localhost:8000/v1
#   export CDSJAX_READER_MODEL=$MODEL          # optional: a one-model server is picked automatically
#   cdsjax ask INDEX_DIR "question"  (or --reader-url / --reader-model)
#
# Settings follow the paper (Table 5): tensor parallel 4 for Qwen3-VL-32B, a 32768-token window (65536 for
# GLM-4.1V), 80% GPU memory, bfloat16, multimodal processor cache off. Up to 20 images per request covers
# the budget of 10 notes and the no-retrieval control's 10 visual elements. Extra arguments are passed on
# to `vllm serve` unchanged (for example --api-key KEY, then set CDSJAX_READER_API_KEY=KEY).
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen3-VL-32B-Instruct}"
TP="${TP:-4}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-32768}"
PORT="${PORT:-8000}"
MAX_IMAGES="${MAX_IMAGES:-20}"

if ! command -v vllm >/dev/null 2>&1; then
  echo "serve_reader.sh: vllm is not installed (pip install vllm on a GPU machine)" >&2
  exit 1
fi

exec vllm serve "$MODEL" \
  --host 0.0.0.0 --port "$PORT" \
  --tensor-parallel-size "$TP" \
  --max-model-len "$MAX_MODEL_LEN" \
  --gpu-memory-utilization 0.8 \
  --dtype bfloat16 \
  --mm-processor-cache-gb 0 \
  --limit-mm-per-prompt "{\"image\": ${MAX_IMAGES}}" \
  "$@"
