#!/bin/bash
# the server with the LM's document states beside its index, then without them reading them, in turn
set -e
export HF_HUB_OFFLINE=1
.venv/bin/python examples/benchmark_serving.py --num-prompts 16 --max-tokens 32 --concurrency 1 --state-threshold 0.97 --output results/request-path/document-states/serving-with
.venv/bin/python examples/benchmark_serving.py --num-prompts 16 --max-tokens 32 --concurrency 1 --state-threshold 0.97 --without-document-states --output results/request-path/document-states/serving-without
