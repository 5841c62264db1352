set -x
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
for i in 1 2; do
  .venv/bin/python examples/profile_decode_step.py --num-prompts 8 --steps 32 --top 20 --state-threshold 0.97 --output runs/gate-profile/gate-$i.txt
  .venv/bin/python examples/profile_decode_step.py --num-prompts 8 --steps 32 --top 20 --output runs/gate-profile/plain-$i.txt
done
