"""Split the full-corpus sub-question figures by whether the evidence page was a training document.

`dynvocab finetune-encoder --data wikipedia` trains on pairs cut from the training split of the leads, and most
FanOutQA evidence pages lie in it. No query is ever trained on, but a fine-tuned encoder has seen those pages (a
sentence of each, and its title). This prints MRR@10 per system on the sub-questions whose evidence is a training
document and on those whose evidence is held out, each with its paired 95% interval against MiniLM as shipped.
Corpus vectors come from `dynvocab eval-retrieval`'s cache, so only the queries are encoded:

    python experiments/retrieval-full/seen_pages.py runs/ft-minilm-anchor0.0/final runs/ft-minilm-anchor1.0/final
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dynvocab.data.corpora import corpus_split
from evals.retrieval.config import RetrievalEvalConfig
from evals.retrieval.corpus import BASELINE, FANOUT, compare_with, full_corpus
from evals.retrieval.protocol import BASELINE_ENCODER, encoder_scores


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("encoders", nargs="+", help="trained encoder folders")
    parser.add_argument("--work-dir", default=RetrievalEvalConfig.work_dir, help="eval-retrieval's cache folder")
    parser.add_argument("--output", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    documents, sets = full_corpus(RetrievalEvalConfig.full_heldout_queries)
    questions = sets[FANOUT]
    training = {d["id"] for d in corpus_split("wikipedia")[0]}
    groups = {"evidence trained on": [q["title"] in training for q in questions]}
    groups["evidence held out"] = [not seen for seen in groups["evidence trained on"]]
    cache = Path(args.work_dir) / "embeddings"
    runs = {name: encoder_scores(path, documents, {FANOUT: questions}, cache)[0][FANOUT]
            for name, path in [(BASELINE, BASELINE_ENCODER)] + [(path, path) for path in args.encoders]}
    figures = {}
    for group, keep in groups.items():
        base = {metric: [v for v, k in zip(values, keep) if k] for metric, values in runs[BASELINE].items()}
        print(f"{group}: {sum(keep)} sub-questions")
        for name, scores in runs.items():
            picked = {metric: [v for v, k in zip(values, keep) if k] for metric, values in scores.items()}
            compared = compare_with(base, picked)
            entry, relative = compared["mrr@10"], compared["mrr@10 relative"]
            figures.setdefault(group, {})[name] = {"mrr@10": entry, "relative": relative}
            print(f"  {name}: MRR@10 {entry['mean']:.4f} ({entry['difference']:+.3f} [{entry['low']:+.3f}, "
                  f"{entry['high']:+.3f}]), relative {100 * relative['mean']:+.1f}% "
                  f"[{100 * relative['low']:+.1f}%, {100 * relative['high']:+.1f}%]")
    if args.output:
        args.output.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    return figures


if __name__ == "__main__":
    main()
