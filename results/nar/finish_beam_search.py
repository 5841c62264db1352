import json, re, random, time, sys, importlib.util, pathlib
import torch
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
root = pathlib.Path("/work/wt-nar")
spec = importlib.util.spec_from_file_location("nx", root / "examples/nar_experiment.py"); nx = importlib.util.module_from_spec(spec); spec.loader.exec_module(nx)
from dynvocab.assets import wikipedia_leads
from dynvocab.shortlist import ShortlistConfig, ShortlistHead
from retrieval.docid_trie import DocidTrie
from retrieval.nar_data import split_queries
from retrieval.nar_model import NarRetriever
from retrieval.nar_pipeline import docid_tokenizer
report = json.loads((root / "results/nar/results.json").read_text())
log = (root / "results/nar/run.log").read_text(errors="replace")
report["latency"] = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^latency (.+?): (\{.*\})$", log, re.M)}
m = re.search(r"fit_s", log)
titles = [d["title"] for d in wikipedia_leads()]
tokenizer = docid_tokenizer("phrase", titles, 8192)
model = NarRetriever.from_pretrained(root / "runs/nar-experiment/phrase/final").eval()
trie = DocidTrie.build(tokenizer.encode_batch(titles), tokenizer.end_id)
split = split_queries(wikipedia_leads(), seed=0)
sample = random.Random(0).sample(range(len(split.test_queries)), 500)
queries = [split.test_queries[i] for i in sample][:64]
head = ShortlistHead.from_vectors(model.output.detach(), ShortlistConfig(num_clusters=128, subset_size=384, probe=8, seed=0))
report["beam_search"] = nx.beam_search_speed(model, queries, trie, head)
report["beam_search_note"] = "measured by the beam_search_speed step alone after the run stopped there (a no_grad bug, fixed), with the flat batched search, torch on 1 thread; latency rows parsed from run.log"
print(report["beam_search"])
nx._save(root / "results/nar", report)
