"""How close the shipped retriever's pieces are to what they stand for: the hybrid's projection to the identity, each
adapter rank's vectors to the full mix's, and probe vectors across dtypes and encoders (the index check's bound).

    python experiments/retrieval-full/adapter_fidelity.py runs/r34/hybrid-soup-base0.6 \
        --output results/retrieval/default/adapter_fidelity.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

from dynvocab.data.assets import resolve_model, wikipedia_leads
from encoders import DenseEncoder
from encoders.hybrid import PROJECTION_FILE
from encoders.low_rank import load_merged
from retrieval.index.storage import PROBE_TEXT
from retrieval.training.adapter import extract_adapter


def cosines(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    values = (a * b).sum(1)
    return {"mean": float(values.mean()), "min": float(values.min())}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mix", help="the hybrid mix the adapter is cut from (soup-encoders --base minilm output)")
    parser.add_argument("--ranks", default="8,16,32")
    parser.add_argument("--texts", type=int, default=200, help="Wikipedia leads whose vectors are compared")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    projection = load_file(Path(args.mix) / PROJECTION_FILE)["weight"].double()
    identity = torch.eye(projection.shape[0], dtype=torch.float64)
    singular = torch.linalg.svdvals(projection)
    figures = {"projection": {"distance_from_identity": float((projection - identity).norm() / identity.norm()),
                              "singular_min": float(singular.min()), "singular_max": float(singular.max())}}
    minilm = resolve_model("minilm")
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    texts = [d["text"] for d in wikipedia_leads()[: args.texts]]
    full = DenseEncoder(AutoModel.from_pretrained(args.mix), tokenizer=tokenizer).encode(texts)  # float32
    figures["minilm_vs_mix"] = cosines(DenseEncoder(AutoModel.from_pretrained(minilm), tokenizer=tokenizer).encode(texts), full)
    for rank in map(int, args.ranks.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            report = extract_adapter(args.mix, Path(folder) / "adapter", rank=rank)
            size = sum(f.stat().st_size for f in (Path(folder) / "adapter").iterdir())
            merged = load_merged(AutoModel.from_pretrained(minilm), Path(folder) / "adapter")
            vectors = DenseEncoder(merged, tokenizer=tokenizer).encode(texts)
        figures[f"rank_{rank}"] = {"megabytes": size / 1e6, "largest_relative_error": report["largest_relative_error"],
                                   "vs_mix": cosines(vectors, full)}
    probes = {}
    for name in ("minilm", "minilm-wikipedia"):
        from retrieval.loading import document_encoder

        encoder = document_encoder(name)
        for amp in (None, "bfloat16"):
            encoder.config.amp_dtype = amp
            probes[f"{name} {amp or 'float32'}"] = encoder.encode([PROBE_TEXT])[0]
    figures["probe"] = {
        "minilm float32 vs bfloat16": float(probes["minilm float32"] @ probes["minilm bfloat16"]),
        "minilm-wikipedia float32 vs bfloat16": float(probes["minilm-wikipedia float32"] @ probes["minilm-wikipedia bfloat16"]),
        "minilm vs minilm-wikipedia (float32)": float(probes["minilm float32"] @ probes["minilm-wikipedia float32"]),
    }
    args.output.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
