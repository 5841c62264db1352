#!/usr/bin/env bash
# #33 on a stand-in for a CPU without AVX-512: this AVX-512 BF16 machine with torch, oneDNN, MKL and FBGEMM held to
# AVX2 (dynvocab.precision.native_bf16 then answers False, so "auto" picks float32 as on an AVX2 CPU).
# Usage: bash results/request-path/avx2-standin/run.sh [output folder] [probes]   (about 10 min on 2 cores once the demo's index is
# built; "probes": only the kernel probes, without the stand-in and with it)
set -euo pipefail
OUT=${1:-runs/avx2-standin}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
PY=${PYTHON:-.venv/bin/python}

probes() {  # what "auto" picks here, and whether bf16 is emulated: a dense layer, and one query's shortlist scores
  $PY - <<'PY'
import time

import torch

from dynvocab.precision import encode_autocast_dtype, native_bf16

torch.set_num_threads(2)
cpu = torch.device("cpu")
print("torch", torch.__version__, "ATen capability", torch.backends.cpu.get_cpu_capability())
print("hardware AVX-512 BF16", torch.cpu._is_avx512_bf16_supported(), "native_bf16", native_bf16(cpu),
      "encode dtype 'auto' ->", encode_autocast_dtype("auto", cpu))


def ms(call, repeats: int = 50) -> float:
    for _ in range(5):
        call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e3


x, w = torch.randn(256, 384), torch.randn(1536, 384)  # MiniLM's widest layer over a batch of 256 tokens
for dtype in (torch.float32, torch.bfloat16):
    a, b = x.to(dtype), w.to(dtype)
    print(f"(256 x 384) @ (384 x 1536) in {dtype}: {ms(lambda: a @ b.T):.2f} ms")
table = torch.randn(100_000, 576).to(torch.bfloat16)  # a 1e5 bf16 phrase table, 4,400 candidates of one query
ids, query = torch.randint(0, 100_000, (4400,)), torch.randn(1, 1, 576).to(torch.bfloat16)
rows = table.index_select(0, ids)[None]
print(f"gather 4,400 rows of a 1e5 bf16 table: {ms(lambda: table.index_select(0, ids), 200):.3f} ms; "
      f"their scores for one query: {ms(lambda: torch.bmm(query, rows.transpose(1, 2)), 200):.3f} ms")
PY
}

probes | tee "$OUT/capability-native.txt"
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2
probes | tee "$OUT/capability.txt"
[ "${2:-all}" = probes ] && exit 0
$PY examples/benchmark_retrieval.py --num-docs 2048 2>&1 | tee "$OUT/retrieval.log"
$PY -m dynvocab demo 2>&1 | tee "$OUT/demo.log"
$PY examples/benchmark_shortlist.py --vectors-cache .cache/shortlist/vectors-1e6.safetensors --repeats 9 \
    --output "$OUT/shortlist.json" 2>&1 | tee "$OUT/shortlist.log"
