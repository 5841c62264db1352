"""Shortlist variants on the trained phrase NAR model: MRR@10 against full scoring and the candidates scored.

    python results/nar/shortlist-screen/screen.py learned:1024:384:8 centroid:128:384:8   # KIND:clusters:subset:probe[:steps]
"""
import json, random, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import torch
torch.set_num_threads(2)
from dynvocab.assets import wikipedia_leads
from dynvocab.shortlist import ShortlistConfig, ShortlistHead
from evals.ranking import ranking_metrics
from retrieval.docid_trie import DocidTrie
from retrieval.nar_data import fanoutqa_queries, split_queries
from retrieval.nar_model import NarRetriever
from retrieval.nar_pipeline import docid_tokenizer, rank_documents
from retrieval.nar_training import cached_features, docid_targets, fit_learned_head

leads = wikipedia_leads(); titles = [d["title"] for d in leads]
split = split_queries(leads, seed=0)
kept = sorted(random.Random(0).sample(range(len(split.train_queries)), 10000))
tq = [split.train_queries[i] for i in kept]; td = [split.train_documents[i] for i in kept]
sample = random.Random(0).sample(range(len(split.test_queries)), 500)
tests = {"held": ([split.test_queries[i] for i in sample], [split.test_documents[i] for i in sample]),
         "fanout": fanoutqa_queries(leads)}
tok = docid_tokenizer("phrase", titles, 8192)
model = NarRetriever.from_pretrained(ROOT / "runs/nar-experiment/phrase/final").eval()
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
full = run("full", None)
picked = random.Random(0).sample(range(len(tq)), 8000)
targets, _ = docid_targets([titles[td[i]] for i in picked], tok, model.config.positions)
for spec in sys.argv[1:]:
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
    row = run(f"{spec} fit {fit:.0f}s", head)
    print("   rel loss held %.2f%% fanout %.2f%%" % (100 * (1 - row["held"] / full["held"]), 100 * (1 - row["fanout"] / full["fanout"])), flush=True)
