#!/usr/bin/env bash
# The server's verified, drafted requests against the bare LM and the batched phrased requests, one request at a time.
set -euo pipefail
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
PY=${PYTHON:-.venv/bin/python}
$PY examples/benchmark_serving.py --num-prompts 16 --max-tokens 64 --concurrency 1 --draft-tokens 8 \
    --no-repeat-ngram-size 0 --output results/serving/drafted/no-repeat-0 2>&1 | tee results/serving/drafted/no-repeat-0.log
$PY examples/benchmark_serving.py --num-prompts 16 --max-tokens 64 --concurrency 1 --draft-tokens 8 \
    --no-repeat-ngram-size 4 --output results/serving/drafted/no-repeat-4 2>&1 | tee results/serving/drafted/no-repeat-4.log
$PY examples/benchmark_serving.py --num-prompts 16 --max-tokens 64 --concurrency 1 --draft-tokens 8 --retrieve 32 \
    --no-repeat-ngram-size 0 --output results/serving/drafted/no-repeat-0-retrieve-32 2>&1 \
    | tee results/serving/drafted/no-repeat-0-retrieve-32.log
