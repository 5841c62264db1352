#!/usr/bin/env bash
# #34, as run on 2 CPU cores (2026-11-25): MiniLM dense fine-tuning (200 steps, batch 16, hard negatives from step 100)
# with the anchor to the starting encoder (weight 1, seed 0) and without it (seeds 0, 1, 2), then one full-corpus
# evaluation of all four against BM25 and MiniLM as shipped. Logs and configs of the runs: training/.
set -euo pipefail
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
dynvocab finetune-encoder --model minilm --encoder dense --max_steps 200 --anchor_weight 1.0 --seed 0 --output_dir runs/ft-minilm-anchor1.0
dynvocab finetune-encoder --model minilm --encoder dense --max_steps 200 --anchor_weight 0.0 --seed 0 --output_dir runs/ft-minilm-anchor0.0
for s in 1 2; do
  dynvocab finetune-encoder --model minilm --encoder dense --max_steps 200 --anchor_weight 0.0 --seed $s --output_dir runs/ft-minilm-anchor0.0-seed$s
done
dynvocab eval-retrieval --encoders runs/ft-minilm-anchor0.0/final,runs/ft-minilm-anchor0.0-seed1/final,runs/ft-minilm-anchor0.0-seed2/final,runs/ft-minilm-anchor1.0/final
python experiments/retrieval-full/seen_pages.py runs/ft-minilm-anchor0.0/final runs/ft-minilm-anchor0.0-seed1/final \
  runs/ft-minilm-anchor0.0-seed2/final runs/ft-minilm-anchor1.0/final --output results/retrieval/full-corpus/seen_pages.json
# Then (2026-11-25, evening): weight averages of the three no-anchor seeds, no training, and the same evaluation over
# all seven encoders (the four above come from the embedding cache).
mkdir -p runs/soups
runs="runs/ft-minilm-anchor0.0/final,runs/ft-minilm-anchor0.0-seed1/final,runs/ft-minilm-anchor0.0-seed2/final"
dynvocab soup-encoders --encoders $runs --output runs/soups/seeds3
dynvocab soup-encoders --encoders $runs --base minilm --base-weight 0.3 --output runs/soups/seeds3-base0.3
dynvocab soup-encoders --encoders $runs --base minilm --base-weight 0.5 --output runs/soups/seeds3-base0.5
dynvocab eval-retrieval --encoders $runs,runs/ft-minilm-anchor1.0/final,runs/soups/seeds3,runs/soups/seeds3-base0.3,runs/soups/seeds3-base0.5
