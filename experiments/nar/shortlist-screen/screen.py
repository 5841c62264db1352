"""Shortlist variants on the trained phrase NAR model: MRR@10 against full scoring and the candidates scored.

Each HEAD is `KIND:clusters:subset_size:probe[:steps]` with KIND `learned` (PIXAR's second stage, fitted on 8,000
training queries, 300 steps unless given) or `centroid` (k-means of the output vectors). Prints, per head, MRR@10 on
500 held-out sentences and the 558 FanOutQA sub-questions, the mean candidates per query and the relative loss
against full scoring. Its printed output is `results/nar/shortlist-screen/screen{1,2,3}.log` (the commands and
the reading are in that folder's README.md). Needs the phrase model of `results/nar/titles-projected/` in
`runs/nar-experiment/phrase/final` (trained by that run's command).

    python experiments/nar/shortlist-screen/screen.py learned:1024:384:8 centroid:128:384:8   # about a minute per head on 2 cores
"""
import argparse
import json
import random
import time
from pathlib import Path

import torch

from dynvocab.data.assets import wikipedia_leads
from dynvocab.scoring.shortlist_head import ShortlistConfig, ShortlistHead
from evals.retrieval.ranking import ranking_metrics
from retrieval.nar.data import fanoutqa_queries, split_queries
from retrieval.nar.model import NarRetriever
from retrieval.nar.pipeline import docid_tokenizer, rank_documents
from retrieval.nar.training import cached_features, docid_targets, fit_learned_head
from retrieval.nar.trie import DocidTrie

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "runs/nar-experiment/phrase/final"


def screen(specs: list[str], model_path: Path = MODEL) -> dict:
    """Full scoring, then each head of ``specs``; the printed rows by name."""
    leads = wikipedia_leads(); titles = [d["title"] for d in leads]
    split = split_queries(leads, seed=0)
    kept = sorted(random.Random(0).sample(range(len(split.train_queries)), 10000))
    tq = [split.train_queries[i] for i in kept]; td = [split.train_documents[i] for i in kept]
    sample = random.Random(0).sample(range(len(split.test_queries)), 500)
    tests = {"held": ([split.test_queries[i] for i in sample], [split.test_documents[i] for i in sample]),
             "fanout": fanoutqa_queries(leads)}
    tok = docid_tokenizer("phrase", titles, 8192)
    model = NarRetriever.from_pretrained(model_path).eval()
    trie = DocidTrie.build(tok.encode_batch(titles), tok.end_id)
    doc_of = torch.arange(len(titles))
    features = cached_features(model, tq)

    def run(name, head):
        row = {}
        for t, (q, gold) in tests.items():
            r, tot = rank_documents(model, q, trie, doc_of, head, 100)
            row[t] = round(ranking_metrics(r, gold, (5, 20, 100))["mrr@10"], 4)
            row[t + "_cand"] = round(tot["candidates"], 0)
        print(name, json.dumps(row), flush=True)
        return row

    rows = {"full": run("full", None)}
    full = rows["full"]
    picked = random.Random(0).sample(range(len(tq)), 8000)
    targets, _ = docid_targets([titles[td[i]] for i in picked], tok, model.config.positions)
    for spec in specs:
        kind, *vals = spec.split(":")
        m, r, k = map(int, vals[:3])
        cfg = ShortlistConfig(num_clusters=m, subset_size=r, probe=k, seed=0)
        began = time.perf_counter()
        if kind == "learned":
            steps = int(vals[3]) if len(vals) > 3 else 300
            head = fit_learned_head(model, [tq[i] for i in picked], targets, tok.end_id, cfg, steps=steps, features=features[picked])
        else:
            head = ShortlistHead.from_vectors(model.output.detach(), cfg)
        fit = time.perf_counter() - began
        row = rows[spec] = run(f"{spec} fit {fit:.0f}s", head)
        print("   rel loss held %.2f%% fanout %.2f%%" % (100 * (1 - row["held"] / full["held"]), 100 * (1 - row["fanout"] / full["fanout"])), flush=True)
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("specs", nargs="*", metavar="HEAD",
                        help="KIND:clusters:subset_size:probe[:steps], KIND learned or centroid; none: full scoring only")
    parser.add_argument("--model", type=Path, default=MODEL, help="the trained phrase NAR model (NarRetriever folder)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the recorded runs used 2)")
    args = parser.parse_args(argv)
    for spec in args.specs:
        kind, *vals = spec.split(":")
        if kind not in ("learned", "centroid") or not 3 <= len(vals) <= 4 or not all(v.isdigit() for v in vals):
            parser.error(f"a HEAD is KIND:clusters:subset_size:probe[:steps] with KIND learned or centroid, got {spec!r}")
    torch.set_num_threads(args.threads)
    return screen(args.specs, args.model)


if __name__ == "__main__":
    main()
