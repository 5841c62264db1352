#!/usr/bin/env bash
# #33 on a stand-in for a CPU without AVX-512: this AVX-512 BF16 machine with torch, oneDNN, MKL and FBGEMM held to
# AVX2 (dynvocab.precision.native_bf16 then answers False, so "auto" picks float32 as on an AVX2 CPU).
# Usage: bash results/avx2-standin/run.sh [output folder]   (about 25 min on 2 cores)
set -euo pipefail
OUT=${1:-runs/avx2-standin}
mkdir -p "$OUT"
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
PY=${PYTHON:-.venv/bin/python}
$PY - <<'PY' | tee "$OUT/capability.txt"
import torch
from dynvocab.precision import encode_autocast_dtype, native_bf16
cpu = torch.device("cpu")
print("torch", torch.__version__, "ATen capability", torch.backends.cpu.get_cpu_capability())
print("hardware AVX-512 BF16", torch.cpu._is_avx512_bf16_supported(), "native_bf16", native_bf16(cpu),
      "encode dtype 'auto' ->", encode_autocast_dtype("auto", cpu))
import time  # is bf16 emulated here? MiniLM's widest layer over a batch of 256 tokens, in float32 and in bf16
x, w = torch.randn(256, 384), torch.randn(1536, 384)
for dtype in (torch.float32, torch.bfloat16):
    a, b = x.to(dtype), w.to(dtype)
    for _ in range(5):
        a @ b.T
    start = time.perf_counter()
    for _ in range(50):
        a @ b.T
    print(f"(256 x 384) @ (384 x 1536) in {dtype}: {(time.perf_counter() - start) / 50 * 1e3:.2f} ms")
PY
$PY examples/benchmark_retrieval.py --num-docs 2048 2>&1 | tee "$OUT/retrieval.log"
$PY -m dynvocab demo 2>&1 | tee "$OUT/demo.log"
$PY examples/benchmark_shortlist.py --vectors-cache .cache/shortlist/vectors-1e6.safetensors --repeats 9 \
    --output "$OUT/shortlist.json" 2>&1 | tee "$OUT/shortlist.log"
