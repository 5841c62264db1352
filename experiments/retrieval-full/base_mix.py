"""How much of MiniLM to mix back into a fine-tuned soup, chosen on half of the FanOutQA questions and judged on the other.

Each mix ``(1 - a) * soup body + a * MiniLM`` is a plain mean-pooled MiniLM-shaped encoder (a hybrid soup's projection
is dropped: it lies within 0.5% of the identity). Every mix is scored over all 10,033 leads with
``dynvocab eval-retrieval``'s own query sets and vector cache. The FanOutQA questions are split in two by a hash of the
top-level question id (a question's sub-questions go with it). On the first half, the rule picks the smallest ``a``
whose multi-hop MRR@10 is at least MiniLM's and whose sub-question MRR@10 is above it. The second half reports the
pick, with paired-bootstrap intervals against MiniLM as shipped. The held-out sentences are not split: no weight
is chosen on them.

    python experiments/retrieval-full/base_mix.py runs/r34/hybrid-soup --weights 0.3,0.4,0.5,0.6,0.7 \
        --output results/retrieval/default/base_mix.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from dynvocab.data.assets import fanoutqa_dev, resolve_model
from dynvocab.io.atomic import atomic_directory
from evals.retrieval.config import RetrievalEvalConfig
from evals.retrieval.corpus import FANOUT, MULTI_HOP, full_corpus
from evals.retrieval.protocol import encoder_scores
from evals.retrieval.ranking import paired_relative_interval


def write_mix(soup: str, weight: float, output: Path) -> Path:
    """``(1 - weight) * soup body + weight * MiniLM`` as a plain ``BertModel`` folder with MiniLM's tokenizer."""
    if (output / "config.json").exists():
        return output
    base = AutoModel.from_pretrained(resolve_model("minilm"))
    soup_model, info = AutoModel.from_pretrained(soup, output_loading_info=True)
    body, missing = soup_model.state_dict(), info["missing_keys"]  # a masked-LM soup has no pooler: MiniLM's is kept
    state = {name: tensor if name in missing or not tensor.is_floating_point()
             else (1 - weight) * body[name] + weight * tensor for name, tensor in base.state_dict().items()}
    base.load_state_dict(state)
    with atomic_directory(output) as staging:
        base.save_pretrained(staging)
        AutoTokenizer.from_pretrained(resolve_model("minilm")).save_pretrained(staging)
    return output


def question_half(sets: dict[str, list[dict]]) -> dict[str, list[int]]:
    """Per FanOutQA query set, 0 (choose on it) or 1 (report on it) for each query, by its top-level question."""
    top: dict[str, str] = {}

    def walk(question: dict, root: str) -> None:
        top[question["id"]] = root
        for sub in question.get("decomposition") or []:
            walk(sub, root)

    for question in fanoutqa_dev():
        walk(question, question["id"])
    return {name: [int(hashlib.sha1(top[q["id"]].encode()).hexdigest(), 16) % 2 for q in sets[name]]
            for name in (FANOUT, MULTI_HOP)}


def mean_on(values: list[float], halves: list[int], half: int) -> float:
    return float(np.mean([v for v, h in zip(values, halves) if h == half]))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("soup", help="a soup folder (dynvocab soup-encoders), dense or hybrid")
    parser.add_argument("--weights", default="0.3,0.4,0.5,0.6,0.7", help="MiniLM's shares to try")
    parser.add_argument("--mix-dir", type=Path, default=Path("runs/base-mix"), help="where the mixes are written")
    parser.add_argument("--work-dir", default=RetrievalEvalConfig.work_dir, help="eval-retrieval's cache folder")
    parser.add_argument("--output", type=Path, required=True, help="the figures, as JSON")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    documents, sets = full_corpus(RetrievalEvalConfig.full_heldout_queries)
    halves = question_half(sets)
    cache = Path(args.work_dir) / "embeddings"
    baseline, _, _ = encoder_scores("minilm", documents, sets, cache)
    rows = {}
    for weight in [float(w) for w in args.weights.split(",")]:
        folder = write_mix(args.soup, weight, args.mix_dir / f"{Path(args.soup).name}-base{weight:g}")
        scores, _, _ = encoder_scores(str(folder), documents, sets, cache)
        row = {}
        for name, per_query in scores.items():
            mrr, base = per_query["mrr@10"], baseline[name]["mrr@10"]
            parts = [("all", None)] + ([("choose", 0), ("report", 1)] if name in halves else [])
            for part, half in parts:
                keep = [i for i in range(len(mrr)) if half is None or halves[name][i] == half]
                pick = [base[i] for i in keep], [mrr[i] for i in keep]
                low, high = paired_relative_interval(*pick)
                row[f"{name} / {part}"] = {"mrr@10": float(np.mean(pick[1])), "minilm": float(np.mean(pick[0])),
                                           "relative": float(np.mean(pick[1]) / np.mean(pick[0]) - 1),
                                           "interval": [low, high], "queries": len(keep)}
        rows[f"{weight:g}"] = row
        print(weight, {k: round(v["relative"] * 100, 1) for k, v in row.items()}, flush=True)
    eligible = [w for w, row in rows.items() if row[f"{MULTI_HOP} / choose"]["relative"] >= 0
                and row[f"{FANOUT} / choose"]["relative"] > 0]
    chosen = min(eligible, key=float) if eligible else None
    figures = {"soup": args.soup, "rule": "smallest MiniLM share with multi-hop MRR@10 >= MiniLM's and sub-question "
               "MRR@10 above it, on the 'choose' half", "chosen": chosen, "mixes": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    print("chosen:", chosen)
    return figures


if __name__ == "__main__":
    main()
