#!/usr/bin/env bash
# #32, next step: the token read-back objective D (same-text negatives, distillation toward the LM's phrase
# log-probability) on the whole training split of the state cache (not the 30% of the first run); checkpoints every
# 200 steps, resumable (rerun this script); then the calibration report on the 200 reported leads.
set -e
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
until grep -q '"complete": true' .cache/states/smollm2-wikipedia-128/cache_config.json; do sleep 30; done
resume=""; ls runs/smollm2-tokens-full/checkpoint-* >/dev/null 2>&1 && resume="--resume"
[ -f runs/smollm2-tokens-full/final/dynvocab_manifest.json ] || .venv/bin/dynvocab train \
  --state-cache .cache/states/smollm2-wikipedia-128 \
  --negatives in-batch,pre-batch,prefix,self-retrieval,same-text --distill-weight 1.0 \
  --max-steps 1200 --batch-size 8 --learning-rate 1e-3 --warmup-steps 50 \
  --log-every 20 --eval-every 200 --validation-chunks 256 --save-every 200 --output-dir runs/smollm2-tokens-full $resume
[ -f results/calibration-tokens-full/report.md ] || .venv/bin/python examples/phrase_calibration.py --num-prompts 200 \
  --checkpoint runs/smollm2-tokens-full/final --output-dir results/calibration-tokens-full
