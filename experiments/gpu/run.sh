# The GPU figures of the indexing, shortlist and PIXAR work, in one command on a lent H100/H200 (device tool `run`,
# from the repository root; what it writes under $OUT comes back). Not run yet: written on a CPU-only machine.
#
#   STAGES="tests index shortlist" bash experiments/gpu/run.sh      # about 8 min; then STAGES="pseudo pixar"
#
# The machine is bare and offline: carry what pip would fetch (see experiments/gpu/README.md).
set -uo pipefail
T0=$(date +%s)
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export DYNVOCAB_ASSETS=${DYNVOCAB_ASSETS:-$PWD/.cache/assets}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
[ -d .xfer ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site .xfer/*.whl && export PYTHONPATH=.:/tmp/site
STAGES=${STAGES:-"tests index shortlist"}
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; lscpu | grep -i "model name"
  python3 -c "import torch, faiss; print('torch', torch.__version__, 'faiss', faiss.__version__, 'faiss GPUs', faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0)"
} > "$OUT/machine.txt" 2>&1
stage() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
for name in $STAGES; do
  case $name in
    tests)  # the core's GPU paths and faiss-gpu against faiss-cpu
      stage tests
      python3 -m pytest -q -m "gpu or not slow" tests/dynvocab/test_cuda.py tests/dynvocab/scoring/test_shortlist.py \
        tests/retrieval/index/test_faiss_gpu.py > "$OUT/tests.txt" 2>&1; tail -3 "$OUT/tests.txt";;
    index)  # 1M passages encoded on the GPU, then flat / IVF / IVF-PQ memory and recall@10 against flat
      stage index
      python3 examples/benchmark_index_build.py --passages 1000000 --words 50 --processes 1 \
        --workdir /tmp/index-build --output "$OUT/index-build-gpu.json" > "$OUT/index-build-gpu.log" 2>&1
      tail -12 "$OUT/index-build-gpu.log";;
    shortlist)  # the shortlist head at 5M phrases in DynamicVocabLM on the GPU: step ratio, memory, agreement
      stage shortlist
      python3 examples/benchmark_shortlist.py --device cuda --sizes 1000000,5000000 --repeats 7 \
        --output "$OUT/shortlist-gpu.json" > "$OUT/shortlist-gpu.log" 2>&1; tail -8 "$OUT/shortlist-gpu.log";;
    pseudo)  # PIXAR's docids: four pseudo-queries a lead from SmolLM2-135M-Instruct
      stage pseudo
      python3 -m dynvocab pseudo-queries --data wikipedia --output "$OUT/pseudo-queries.jsonl" --batch-size 256 \
        > "$OUT/pseudo-queries.log" 2>&1; tail -2 "$OUT/pseudo-queries.log";;
    pixar)  # the PIXAR layout on pseudo-query docids: phrase vocabulary against BPE, shortlist against full softmax
      stage pixar
      python3 examples/nar_experiment.py --variant pixar --pseudo-queries "$OUT/pseudo-queries.jsonl" \
        --kinds phrase,bpe --steps 2000 --batch-size 256 --output "$OUT/nar-pixar" --runs /tmp/nar-runs \
        > "$OUT/nar-pixar.log" 2>&1; tail -6 "$OUT/nar-pixar.log";;
    *) echo "unknown stage $name (tests, index, shortlist, pseudo, pixar)";;
  esac
done
stage done
