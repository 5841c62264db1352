#!/usr/bin/env bash
# #34: the fusion weight of the three seeds chosen again by the one-standard-error rule (the argmax of the first pass
# picked noise: its grids were flat), the soups made again, and the full-corpus evaluation again.
set -euo pipefail
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
source .venv/bin/activate
# (as run, the call was tune_sparse_weight(config, pairs, documents), which found the held-out pairs itself; it now
# takes them from held_out_fusion_pairs, the same pairs)
python - <<'PY'
from retrieval.training.finetuning import FinetuneConfig, _documents, held_out_fusion_pairs, tune_sparse_weight
from retrieval.training.pairs import training_pairs
for seed in (0, 1, 2):
    config = FinetuneConfig.load(f"runs/r34/hybrid-mean-seed{seed}")
    documents = _documents(config)
    pairs = held_out_fusion_pairs(config, training_pairs(documents, seed=config.seed), documents)
    print(seed, "fusion weight", tune_sparse_weight(config, pairs, documents), flush=True)
PY
seeds=runs/r34/hybrid-mean-seed0/final,runs/r34/hybrid-mean-seed1/final,runs/r34/hybrid-mean-seed2/final
dynvocab soup-encoders --encoders $seeds --output runs/r34/hybrid-soup
dynvocab soup-encoders --encoders $seeds --base minilm --base-weight 0.3 --output runs/r34/hybrid-soup-base0.3
dynvocab soup-encoders --encoders $seeds --base minilm --base-weight 0.5 --output runs/r34/hybrid-soup-base0.5
dynvocab eval-retrieval --encoders $seeds,runs/r34/hybrid-soup,runs/r34/hybrid-soup-base0.3,runs/r34/hybrid-soup-base0.5 --output_dir runs/r34/eval2
