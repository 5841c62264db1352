# the #32 grid on the GPU: the state cache once, then four objectives side by side, each ~12 epochs of batch 64
export DYNVOCAB_ASSETS=/tmp/assets HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=.:/tmp/site:/tmp/stub
DV="python3 -m dynvocab.cli"
STEPS=${STEPS:-1900}; BUDGET=${BUDGET:-420}
[ -f /tmp/cache/cache_config.json ] && grep -q '"complete": true' /tmp/cache/cache_config.json || \
  $DV cache-states --output-dir /tmp/cache --batch-size 64 2>&1 | grep -v "it/s\]" | tail -3
common="--state-cache /tmp/cache --batch-size 64 --max-steps $STEPS --learning-rate 1e-3 --warmup-steps 100 \
  --log-every 50 --eval-every 250 --validation-chunks 256 --save-every 250"
neg=in-batch,pre-batch,prefix,self-retrieval,same-text
run() { name=$1; shift; resume=""; ls /tmp/runs/$name/checkpoint-* >/dev/null 2>&1 && resume="--resume";
  OMP_NUM_THREADS=3 timeout $BUDGET $DV train $common --output-dir /tmp/runs/$name $resume "$@" > /tmp/runs/$name.log 2>&1; }
mkdir -p /tmp/runs
run d1 --negatives $neg --distill-weight 1.0 &
run d4 --negatives $neg --distill-weight 4.0 &
run d1-corpus --negatives $neg,corpus-retrieval --distill-weight 1.0 &
run d1-spell --negatives $neg --distill-weight 1.0 --spelling-negatives true &
wait
for n in d1 d4 d1-corpus d1-spell; do echo "== $n"; tail -c 600 /tmp/runs/$n.log | tr '\r' '\n' | tail -2; ls /tmp/runs/$n;
  python3 -c "import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l)
    if 'val_accuracy' in r: print(r['step'], round(r['seconds']), *(f'{k[4:]}={r[k]:.4f}' for k in r if k.startswith('val_')))" /tmp/runs/$n/log.jsonl; done
mkdir -p $OUT/logs; for n in d1 d4 d1-corpus d1-spell; do cp /tmp/runs/$n/log.jsonl $OUT/logs/$n.jsonl 2>/dev/null; done
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
