"""What ``dynvocab build-vocab``, ``nar-train`` and ``nar-search`` do, as functions (the CLI only parses flags).

A ``nar-train`` output folder holds ``final/`` (the retriever), ``vocab/`` (its docid vocabulary),
``docids/`` (the docid strings, in document order) and ``shortlist/`` (the learned clusters).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from dynvocab.data.assets import wikipedia_leads
from dynvocab.io.jsonl import iter_jsonl
from dynvocab.io.tensor_files import read_tensor_folder, write_tensor_folder
from dynvocab.scoring.shortlist_head import ShortlistConfig, ShortlistHead

from .data import split_queries
from .model import NarRetriever
from .pipeline import train_retriever
from .training import NarTrainConfig, docid_targets, fit_learned_head
from .trie import DocidTrie, aggregate_documents
from .vocab import PhraseVocabConfig, PhraseVocabulary

__all__ = ["build_vocab", "nar_search", "nar_train", "read_docids"]

DOCIDS = "dynvocab.Docids"


def read_docids(data: str) -> list[str]:
    """``"wikipedia"``: the leads' titles; otherwise a UTF-8 text file with one docid per line."""
    if data == "wikipedia":
        return [d["title"] for d in wikipedia_leads()]
    path = Path(data)
    if not path.is_file():
        raise FileNotFoundError(f"--data {data!r} is neither 'wikipedia' nor a file; pass a text file, one docid per line")
    docids = [line.rstrip("\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not docids:
        raise ValueError(f"{path} holds no docids; write one docid per line")
    return docids


def build_vocab(data: str, output: str, settings: Any) -> dict[str, Any]:
    """Train a phrase vocabulary on the docids of ``data`` and save it to ``output``."""
    config = PhraseVocabConfig(**{k: getattr(settings, k) for k in ("size", "max_pieces", "min_count", "prune_fraction")})
    docids = read_docids(data)
    vocab = PhraseVocabulary.train(docids, config)
    vocab.save(output)
    lengths = [len(ids) for ids in vocab.encode_batch(docids)]
    return {"output": output, "size": vocab.vocab_size, "docids": len(docids),
            "mean_tokens_per_docid": round(sum(lengths) / len(lengths), 3), "max_tokens": max(lengths)}


def _pairs(data: str) -> tuple[list[str], list[str], list[int]]:
    """Docids, training queries and each query's docid index."""
    if data == "wikipedia":
        split = split_queries()
        return [d["title"] for d in wikipedia_leads()], split.train_queries, split.train_documents
    if not Path(data).is_file():
        raise FileNotFoundError(f"--data {data!r} is neither 'wikipedia' nor a JSONL file of {{\"query\", \"docid\"}} lines")
    docids: dict[str, int] = {}
    queries, documents = [], []
    for number, record in iter_jsonl(data, fix='each line must be {"query": ..., "docid": ...}'):
        if not isinstance(record, dict) or not isinstance(record.get("query"), str) or not isinstance(record.get("docid"), str):
            raise ValueError(f'{data}:{number} must be {{"query": str, "docid": str}}; fix that line')
        queries.append(record["query"])
        documents.append(docids.setdefault(record["docid"], len(docids)))
    return list(docids), queries, documents


def nar_train(data: str, vocab_dir: str, encoder: str, config: NarTrainConfig, resume: bool, cluster_steps: int,
              shortlist: ShortlistConfig | None = None) -> dict[str, Any]:
    """Train the retriever on ``data`` with the vocabulary in ``vocab_dir``, then fit the learned ``shortlist``."""
    if cluster_steps < 0:
        raise ValueError(f"--cluster-steps={cluster_steps} must be >= 0 (0 skips the cluster fit)")
    vocab = PhraseVocabulary.load(vocab_dir)
    docids, queries, documents = _pairs(data)
    model = train_retriever(vocab, docids, queries, documents, config, encoder, resume=resume)
    folder = Path(config.output_dir)
    vocab.save(folder / "vocab")
    write_tensor_folder(folder / "docids", DOCIDS, {}, {}, {"docids.json": json.dumps(docids, ensure_ascii=False)})
    result = {"output_dir": str(folder), "docids": len(docids), "pairs": len(queries)}
    if cluster_steps:
        targets, _ = docid_targets([docids[d] for d in documents], vocab, model.config.positions)
        head = fit_learned_head(model, queries, targets, vocab.end_id, shortlist or ShortlistConfig(),
                                steps=cluster_steps)
        head.save(folder / "shortlist")
        result["clusters"] = head.num_clusters
    return result


def nar_search(model_dir: str, queries: list[str], shortlist: bool, k: int, beam: int) -> list[list[tuple[str, float]]]:
    """The top ``k`` docids (with scores) per query from a ``nar-train`` output folder."""
    folder = Path(model_dir)
    if not (folder / "final").is_dir():
        raise FileNotFoundError(f"{folder / 'final'} is missing; pass the --output-dir of `dynvocab nar-train`")
    if k < 1 or beam < k:
        raise ValueError(f"--k={k} and --beam={beam}: need 1 <= k <= beam")
    model = NarRetriever.from_pretrained(folder / "final").eval()
    vocab = PhraseVocabulary.load(folder / "vocab")
    read_tensor_folder(folder / "docids", DOCIDS)
    docids = json.loads((folder / "docids" / "docids.json").read_text(encoding="utf-8"))
    head = ShortlistHead.load(folder / "shortlist") if shortlist else None
    trie = DocidTrie.build(vocab.encode_batch(docids), vocab.end_id)
    result, _ = model.search(queries, trie, head, beam)
    documents, scores = aggregate_documents(result, torch.arange(len(docids)), "max", k)
    return [[(docids[d], float(s)) for d, s in zip(row, row_scores) if d >= 0]
            for row, row_scores in zip(documents.tolist(), scores.tolist())]
