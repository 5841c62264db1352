"""The NAR retrieval report in one run: phrase vocabulary against BPE and Unigram, full softmax against the
learned and the training-free (centroid) shortlist, the MiniLM + FAISS dense retriever as the reference,
latency at batch 1 and batched, a 1e6-id head (random rows past the trained ones) for the timing, and the
batched beam search against its per-query Python loop.

Documents: the 10,033 Wikipedia leads; docids: their titles (see retrieval.nar.data), or, as PIXAR trains,
``--pseudo-queries FILE`` (``dynvocab pseudo-queries``): every lead's pseudo-queries are its docids, each training
sentence maps to one of them and each pseudo-query to the lead's others. Test queries: one held-out sentence per lead
(a seeded sample) and the 558 FanOutQA dev sub-questions whose evidence is a lead.

    python examples/nar_experiment.py --output results/nar/titles-projected          # the full run (about an hour on 2 cores)
    python examples/nar_experiment.py --tiny --output /tmp/nar      # a smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dynvocab.data.assets import wikipedia_leads
from dynvocab.scoring.shortlist_head import ShortlistConfig, ShortlistHead
from evals.retrieval.ranking import hits_at_k, paired_relative_interval, ranking_metrics, reciprocal_ranks
from retrieval.nar.data import fanoutqa_queries, split_queries
from retrieval.nar.model import NarConfig, NarRetriever
from retrieval.nar.pipeline import docid_tokenizer, rank_documents, train_retriever
from retrieval.nar.training import NarTrainConfig, cached_features, docid_targets, fit_learned_head
from retrieval.nar.trie import DocidTrie, beam_search, beam_search_reference


def metrics(rankings: list[list[int]], gold: list[int], full: list[list[int]] | None = None) -> dict:
    """The ranking metrics; with ``full`` (the full softmax's rankings of the same queries), also MRR@10's relative
    change against it and its 95% paired-bootstrap interval (the spread of the queries, not of training)."""
    row = ranking_metrics(rankings, gold, (5, 20, 100))
    row.update({f"hits@{k}": hits_at_k(rankings, gold, k) for k in (1, 10)})
    row = {k: round(v, 4) for k, v in row.items()}
    if full is not None:
        base, other = reciprocal_ranks(full, gold), reciprocal_ranks(rankings, gold)
        change = sum(other) / sum(base) - 1 if sum(base) else float("nan")  # no change is defined against an MRR of 0
        row["mrr@10 vs full"] = [round(change, 4), *(round(v, 4) for v in paired_relative_interval(base, other))]
    return row


#: timed rounds of each beam search
BEAM_ROUNDS = 7


def per_query_ms(model: NarRetriever, queries: list[str], trie: DocidTrie, head, batch: int, beam: int) -> dict:
    """Median wall milliseconds per query (encode + head + beam search) at this batch size, and the split."""
    model.search(queries[:batch], trie, head, beam)  # warm-up
    totals, encode, search, candidates = [], [], [], []
    for start in range(0, len(queries) - batch + 1, batch):
        began = time.perf_counter()
        _, stats = model.search(queries[start : start + batch], trie, head, beam)
        totals.append((time.perf_counter() - began) * 1e3 / batch)
        encode.append(stats.encode_s * 1e3 / batch)
        search.append(stats.search_s * 1e3 / batch)
        candidates.append(stats.candidates)
    return {"ms": statistics.median(totals), "encode_ms": statistics.median(encode),
            "head_and_search_ms": statistics.median(search), "candidates": statistics.mean(candidates)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="results/nar/titles-projected")
    parser.add_argument("--runs", default="runs/nar-experiment", help="trained models are kept (and resumed) here")
    parser.add_argument("--encoder", default="minilm")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--kinds", default="phrase,bpe,unigram")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--train-layers", type=int, default=2, help="top MiniLM layers trained (-1: all)")
    parser.add_argument("--max-query-length", type=int, default=32)
    parser.add_argument("--variant", default="projected", choices=["pixar", "projected"],
                        help="pixar: [CLS] x0 and encoder positions, top --train-layers trained; projected: mean-pooled x0 "
                             "of the frozen encoder, positions projected from it (features cached, so it trains on 2 cores)")
    parser.add_argument("--output-learning-rate", type=float, default=1e-3)
    parser.add_argument("--test-sentences", type=int, default=1000)
    parser.add_argument("--train-queries", type=int, default=0, help="train on a seeded sample of this many pairs (0: all)")
    parser.add_argument("--beam", type=int, default=100)
    parser.add_argument("--clusters", type=int, default=256)
    parser.add_argument("--subset-size", type=int, default=64)
    parser.add_argument("--probe", type=int, default=8)
    parser.add_argument("--cluster-queries", type=int, default=8000, help="training queries for the learned clusters")
    parser.add_argument("--big-vocab", type=int, default=1_000_000, help="output rows of the timing head (0: skip)")
    parser.add_argument("--latency-queries", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pseudo-queries", default=None, help="JSONL of `dynvocab pseudo-queries`: the docids")
    parser.add_argument("--augment-pairs", type=int, default=20,
                        help="with --pseudo-queries: pseudo-query -> other pseudo-query pairs a lead (the paper: 20)")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="rewrite report.md from the output's results.json")
    args = parser.parse_args(argv)
    if args.report_only:
        report = json.loads((Path(args.output) / "results.json").read_text(encoding="utf-8"))
        (Path(args.output) / "report.md").write_text(markdown(report), encoding="utf-8")
        return report
    if args.tiny:
        args.steps, args.test_sentences, args.beam, args.big_vocab, args.latency_queries = 2, 16, 10, 20000, 16
        args.cluster_queries, args.clusters = 64, 16
    torch.set_num_threads(args.threads)
    output, runs = Path(args.output), Path(args.runs)
    output.mkdir(parents=True, exist_ok=True)
    leads = wikipedia_leads()
    titles = [d["title"] for d in leads]
    split = split_queries(leads, seed=args.seed)
    if args.tiny:
        args.train_queries = 64
    if args.train_queries:
        kept = sorted(random.Random(args.seed).sample(range(len(split.train_queries)), min(args.train_queries, len(split.train_queries))))
        split.train_queries = [split.train_queries[i] for i in kept]
        split.train_documents = [split.train_documents[i] for i in kept]
    sample = random.Random(args.seed).sample(range(len(split.test_queries)), min(args.test_sentences, len(split.test_queries)))
    tests = {
        "held-out sentences": ([split.test_queries[i] for i in sample], [split.test_documents[i] for i in sample]),
        "FanOutQA sub-questions": fanoutqa_queries(leads),
    }
    if args.tiny:
        tests["FanOutQA sub-questions"] = tuple(x[:16] for x in tests["FanOutQA sub-questions"])
    report = {"command": "python examples/nar_experiment.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "settings": vars(args), "versions": {"torch": torch.__version__, "python": platform.python_version()},
              "train_pairs": len(split.train_queries), "tests": {k: len(v[0]) for k, v in tests.items()}, "systems": {}}
    docids, train_queries, train_targets = titles, split.train_queries, split.train_documents
    document_of_docid = torch.arange(len(titles))
    if args.pseudo_queries:
        from retrieval.nar.pseudo_queries import read_pseudo_queries

        pseudo = read_pseudo_queries(args.pseudo_queries, leads)
        if len(pseudo) < len(leads):
            raise SystemExit(f"{args.pseudo_queries} covers {len(pseudo)} of the {len(leads)} leads; run `dynvocab "
                             f"pseudo-queries --output {args.pseudo_queries}` again to finish it")
        docids, document_of_docid, train_queries, train_targets = pseudo_query_docids(
            pseudo, titles, split.train_queries, split.train_documents,
            args.augment_pairs, args.seed)
        report["docids"] = {"pseudo_queries": args.pseudo_queries, "docids": len(docids), "train_pairs": len(train_queries)}
    options = {"x0_pooling": "cls", "position_states": "encoder"}
    features = None
    if args.variant == "projected":
        options = {"x0_pooling": "mean", "position_states": "projected"}
        args.train_layers = 0
        probe = NarRetriever.from_encoder(NarConfig(encoder=args.encoder, vocab_size=4, max_query_length=args.max_query_length,
                                                    **options))
        began = time.perf_counter()
        features = cached_features(probe, train_queries)
        report["features_s"] = round(time.perf_counter() - began, 1)
    shortlist = ShortlistConfig(num_clusters=args.clusters, subset_size=args.subset_size, probe=args.probe, seed=args.seed)
    models, tries = {}, {}
    full_rankings: dict[str, list[list[int]]] = {}  # per test, the phrase model's: each shortlist is compared with them
    for kind in args.kinds.split(","):
        began = time.perf_counter()
        tokenizer = docid_tokenizer(kind, docids, args.vocab_size)
        lengths = [len(i) for i in tokenizer.encode_batch(docids)]
        report[f"vocab_{kind}"] = {"size": tokenizer.vocab_size, "build_s": round(time.perf_counter() - began, 1),
                                   "mean_tokens_per_docid": round(sum(lengths) / len(lengths), 3), "max_tokens": max(lengths)}
        train = NarTrainConfig(output_dir=str(runs / kind), batch_size=args.batch_size, max_steps=args.steps,
                               save_every=max(args.steps // 4, 1), seed=args.seed, train_layers=args.train_layers,
                               output_learning_rate=args.output_learning_rate)
        began = time.perf_counter()
        model = train_retriever(tokenizer, docids, train_queries, train_targets, train, args.encoder,
                                max_query_length=args.max_query_length, features=features, **options)
        report[f"train_{kind}_s"] = round(time.perf_counter() - began, 1)
        models[kind], tries[kind] = model.eval(), DocidTrie.build(tokenizer.encode_batch(docids), tokenizer.end_id)
        heads = {"full": None}
        if kind == "phrase":
            began = time.perf_counter()
            picked = random.Random(args.seed).sample(range(len(train_queries)), min(args.cluster_queries, len(train_queries)))
            targets, _ = docid_targets([docids[train_targets[i]] for i in picked], tokenizer, model.config.positions)
            fit_learned = functools.partial(fit_learned_head, model, [train_queries[i] for i in picked], targets,
                                            tokenizer.end_id, shortlist, features=None if features is None else features[picked])
            heads["learned shortlist"] = fit_learned()
            report["learned_fit_s"] = round(time.perf_counter() - began, 1)
            heads["centroid shortlist"] = ShortlistHead.from_vectors(model.output.detach(), shortlist)
            phrase_heads = heads
        for name, head in heads.items():
            system = f"{kind} / {name}"
            report["systems"][system] = {}
            for test, (queries, gold) in tests.items():
                rankings, totals = rank_documents(model, queries, tries[kind], document_of_docid, head, args.beam)
                if system == "phrase / full":
                    full_rankings[test] = rankings
                compared = full_rankings[test] if kind == "phrase" and head is not None else None
                report["systems"][system][test] = metrics(rankings, gold, compared) | {"candidates": round(totals["candidates"], 1)}
            print(system, json.dumps(report["systems"][system]), flush=True)
            _save(output, report)
    dense_reference(report, leads, tests)
    _save(output, report)
    timing(report, models["phrase"], tries["phrase"], document_of_docid, tests, full_rankings, phrase_heads, fit_learned, args)
    _save(output, report)
    return report


def pseudo_query_docids(pseudo: list[list[str]], titles: list[str], queries: list[str], documents: list[int],
                        augment: int, seed: int) -> tuple[list[str], torch.Tensor, list[str], list[int]]:
    """PIXAR's docids: each lead's pseudo-queries (a string two leads share stays with the first; a lead left with
    none keeps its title). Returns the docids, each docid's lead, and the training pairs as queries and docid
    indices: each sentence to one docid of its lead (seeded), and up to ``augment`` pseudo-query -> other
    pseudo-query pairs a lead."""
    rng = random.Random(seed)
    docids: dict[str, int] = {}
    owned: list[list[int]] = []
    for number, found in enumerate(pseudo):
        mine = [docids.setdefault(q, len(docids)) for q in found if q not in docids]
        if not mine:
            title = titles[number] if titles[number] not in docids else f"{titles[number]} ({number})"
            mine = [docids.setdefault(title, len(docids))]
        owned.append(mine)
    lead_of = [0] * len(docids)
    for number, mine in enumerate(owned):
        for docid in mine:
            lead_of[docid] = number
    names = list(docids)
    pair_queries = list(queries)
    targets = [rng.choice(owned[document]) for document in documents]
    for mine in owned:
        pairs = [(a, b) for a in mine for b in mine if a != b]
        for a, b in rng.sample(pairs, min(augment, len(pairs))):
            pair_queries.append(names[a])
            targets.append(b)
    return names, torch.tensor(lead_of), pair_queries, targets


def dense_reference(report: dict, leads: list[dict], tests: dict) -> None:
    """MiniLM + FAISS (flat inner product) over the leads, the same test queries."""
    from retrieval import DocumentIndex
    from retrieval.loading import document_encoder

    began = time.perf_counter()
    index = DocumentIndex.build(leads, document_encoder(), index_type="flat", show_progress_bar=True)
    report["dense_index_s"] = round(time.perf_counter() - began, 1)
    position = {d["id"]: n for n, d in enumerate(leads)}
    report["systems"]["MiniLM + FAISS (dense)"] = {}
    for test, (queries, gold) in tests.items():
        found = index.search_documents(queries, k=100)
        rankings = [[position[hit["id"]] for hit in hits] for hits in found]
        report["systems"]["MiniLM + FAISS (dense)"][test] = metrics(rankings, gold)
    print("dense", json.dumps(report["systems"]["MiniLM + FAISS (dense)"]), flush=True)


def timing(report: dict, model: NarRetriever, trie: DocidTrie, document_of_docid: torch.Tensor, tests: dict,
           full_rankings: dict[str, list[list[int]]], heads: dict, fit_learned: Callable[[], ShortlistHead], args) -> None:
    """Latency of each head at the trained size. Then at ``big_vocab`` rows (the trained ones plus random rows at their
    scale, on no trie edge): full scoring, the learned shortlist fitted on all the rows and a training-free k-means head,
    each timed and ranked against full scoring. Last, the batched beam search against its per-query Python loop."""
    queries = tests["held-out sentences"][0][: args.latency_queries]
    report["latency"] = {f"V={model.config.vocab_size} {name} batch {batch}": per_query_ms(model, queries, trie, head, batch, 10)
                         for name, head in heads.items() for batch in (1, 16)}
    if args.big_vocab:
        trained = model.output.data
        extra = torch.randn(args.big_vocab - trained.shape[0], trained.shape[1], generator=torch.Generator().manual_seed(0))
        model.output.data = torch.cat([trained, extra * trained.std()])
        big = {"full": None}
        report["big_heads"] = {"rows": args.big_vocab, "rows_are": "the trained rows plus random rows (same scale) up to the size"}
        began = time.perf_counter()
        big["learned shortlist"] = fit_learned()
        report["big_heads"]["learned"] = {"clusters": big["learned shortlist"].num_clusters, "fit_s": round(time.perf_counter() - began, 1)}
        began = time.perf_counter()
        config = ShortlistConfig(num_clusters=1024, subset_size=256, probe=args.probe, kmeans_iterations=5,
                                 max_points_per_centroid=32, seed=args.seed)
        big["centroid shortlist"] = ShortlistHead.from_vectors(model.output.detach(), config)
        report["big_heads"]["centroid"] = {"clusters": config.num_clusters, "subset_size": config.subset_size,
                                           "fit_s": round(time.perf_counter() - began, 1)}
        for name, head in big.items():
            for batch in (1, 16):
                report["latency"][f"V={args.big_vocab} {name} batch {batch}"] = per_query_ms(model, queries, trie, head, batch, 10)
            system = f"phrase / V={args.big_vocab} {name}"
            report["systems"][system] = {}
            for test, (test_queries, gold) in tests.items():
                rankings, totals = rank_documents(model, test_queries, trie, document_of_docid, head, args.beam, batch_size=8)
                report["systems"][system][test] = metrics(rankings, gold, full_rankings[test]) | {"candidates": round(totals["candidates"], 1)}
            print(system, json.dumps(report["systems"][system]), flush=True)
        model.output.data = trained
    for key, row in report["latency"].items():
        print(f"latency {key}: {json.dumps(row)}", flush=True)
    report["beam_search"] = beam_search_speed(model, queries, trie, heads["learned shortlist"])
    print("beam search", json.dumps(report["beam_search"]), flush=True)


@torch.no_grad()
def beam_search_speed(model: NarRetriever, queries: list[str], trie: DocidTrie, head: ShortlistHead) -> dict:
    """The batched beam search against its per-query Python loop on the same shortlist scores (median of
    ``BEAM_ROUNDS`` alternated rounds after one warm-up call of each)."""
    x0, positions = model(**model.tokenize(queries))
    head.always = torch.tensor([trie.end_id])
    ids, scores = head.score(x0, model.output, positions)
    fast, slow = beam_search(trie, ids, scores, 10), beam_search_reference(trie, ids, scores, 10)  # also the warm-up
    fast_s, slow_s = [], []
    for _ in range(BEAM_ROUNDS):  # alternated, so both meet the same machine load
        began = time.perf_counter()
        beam_search(trie, ids, scores, 10)
        fast_s.append(time.perf_counter() - began)
        began = time.perf_counter()
        beam_search_reference(trie, ids, scores, 10)
        slow_s.append(time.perf_counter() - began)
    fast_ms, slow_ms = statistics.median(fast_s) * 1e3, statistics.median(slow_s) * 1e3
    return {"queries": len(queries), "beam": 10, "rounds": BEAM_ROUNDS, "batched_ms": round(fast_ms, 2),
            "python_loop_ms": round(slow_ms, 2), "speedup": round(slow_ms / fast_ms, 2),
            "identical": bool(torch.equal(fast.docids, slow.docids) and torch.equal(fast.scores, slow.scores))}


def _save(output: Path, report: dict) -> None:
    (output / "results.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (output / "report.md").write_text(markdown(report), encoding="utf-8")


def markdown(report: dict) -> str:
    """The report's tables from its results."""
    lines = ["# NAR generative retrieval on the Wikipedia leads", "", f"Command: `{report['command']}`", "",
             f"Versions: {report['versions']}. Training pairs: {report['train_pairs']}; test queries: {report['tests']}.", ""]
    for test in report["tests"]:
        lines += [f"## {test}", "", "| system | MRR@10 | MRR@10 vs full (95% interval) | R@5 | R@20 | R@100 | Hits@1 | Hits@10 | "
                  "candidates |", "|---|---|---|---|---|---|---|---|---|"]
        for system, rows in report["systems"].items():
            r = rows.get(test)
            if r:
                change = r.get("mrr@10 vs full")
                versus = f"{change[0]:+.1%} ({change[1]:+.1%} .. {change[2]:+.1%})" if change else ""
                lines.append(f"| {system} | {r['mrr@10']:.4f} | {versus} | {r['recall@5']:.4f} | {r['recall@20']:.4f} | {r['recall@100']:.4f} | "
                             f"{r['hits@1']:.4f} | {r['hits@10']:.4f} | {r.get('candidates', '')} |")
        lines.append("")
    vocabs = [k for k in report if k.startswith("vocab_")]
    if vocabs:
        lines += ["## Docid vocabularies (same size)", "", "| vocabulary | size | tokens per docid | longest | build s | train s |",
                  "|---|---|---|---|---|---|"]
        for key in vocabs:
            v, kind = report[key], key.removeprefix("vocab_")
            lines.append(f"| {kind} | {v['size']} | {v['mean_tokens_per_docid']} | {v['max_tokens']} | {v['build_s']} | "
                         f"{report.get(f'train_{kind}_s', '')} |")
        lines.append("")
    if "latency" in report:
        lines += ["## Latency per query (median; encode + head + trie beam search, beam 10)", "",
                  "| setting | ms per query | encode ms | head + search ms | candidates |", "|---|---|---|---|---|"]
        for key, r in report["latency"].items():
            lines.append(f"| {key} | {r['ms']:.2f} | {r['encode_ms']:.2f} | {r['head_and_search_ms']:.2f} | {r['candidates']:.0f} |")
        lines.append("")
    if "big_heads" in report:
        lines += [f"Heads at {report['big_heads']['rows']:,} rows ({report['big_heads']['rows_are']}): learned "
                  f"{report['big_heads']['learned']}, centroid {report['big_heads']['centroid']}.", ""]
    if "beam_search" in report:
        lines += [f"Beam search, batched against the per-query Python loop (median of alternated rounds): "
                  f"{report['beam_search']}", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
