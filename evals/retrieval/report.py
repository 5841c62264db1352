"""``report.md`` and ``results.json`` of ``dynvocab eval-retrieval`` (the full-corpus run; per query set, each system's figures with its paired
95% interval against MiniLM as shipped, then the costs (encoding, index bytes, exact-search latency)."""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from pathlib import Path

from .corpus import BASELINE

__all__ = ["FULL_METRICS", "full_cell", "save_report", "software_versions", "write_markdown"]

FULL_METRICS = ("recall@1", "recall@5", "recall@10", "recall@32", "hits@5", "mrr@10", "ndcg@10")


def full_cell(entry: dict[str, float], baseline: bool) -> str:
    """``0.6140`` for the baseline, ``0.5120 (-0.102 [-0.140, -0.065])`` for another system: mean, then its difference
    from the baseline with the 95% interval; a ``*`` marks an interval that excludes zero."""
    if baseline:
        return f"{entry['mean']:.4f}"
    mark = "*" if entry["low"] > 0 or entry["high"] < 0 else ""
    return f"{entry['mean']:.4f} ({entry['difference']:+.3f} [{entry['low']:+.3f}, {entry['high']:+.3f}]){mark}"


def _costs(record: dict) -> list[str]:
    lines = ["| system | documents/s (encoding the corpus) | index bytes | exact search ms/query | dtype |",
             "|---|---|---|---|---|"]
    for name, cost in record["costs"].items():
        if not cost:
            continue
        latency = ", ".join(f"{k}: {v:.2f}" for k, v in cost["ms_per_query"].items())
        lines.append(f"| {name} | {cost['documents_per_s']:.1f}{' (cached run)' if cost['cached'] else ''} | "
                     f"{cost['index_bytes']:,} | {latency} | {cost['dtype']} |")
    return lines


def _query_latency(record: dict) -> list[str]:
    """Per system: one query's encoding against MiniLM's (in turns) and, for a hybrid, its index as served against a
    flat dense index of the same documents (in turns); a query's latency against dense is encoding plus search over
    MiniLM's encoding plus flat search."""
    rows = [(name, cost) for name, cost in record["costs"].items() if cost and "query_encoding" in cost]
    if not rows:
        return []
    lines = ["## Query latency", "",
             f"One query encoded alone, in turns with {BASELINE} (median of 64), and, for a hybrid, its index as "
             "`dynvocab index` builds it (pruned candidates, exact re-scoring) in turns with a flat inner-product index "
             "of its dense part over the same documents (median of 7 rounds, each the best of 3 passes over the first "
             "query set). `query latency vs dense`: (encoding + served search) over (MiniLM's encoding + flat search).",
             "", "| system | encode ms | MiniLM encode ms | served search ms | flat dense search ms | search vs dense | "
             "top-10 agreement with exact | query latency vs dense |", "|---|---|---|---|---|---|---|---|"]
    for name, cost in rows:
        encoding, served = cost["query_encoding"], cost.get("served")
        if served is None:
            lines.append(f"| {name} | {encoding['ms']:.2f} | {encoding['baseline_ms']:.2f} | - | - | - | - | "
                         f"{encoding['ratio']:.2f}x (encoding) |")
            continue
        total = (encoding["ms"] + served["ms_per_query"]) / (encoding["baseline_ms"] + served["dense_ms_per_query"])
        lines.append(f"| {name} | {encoding['ms']:.2f} | {encoding['baseline_ms']:.2f} | {served['ms_per_query']:.3f} | "
                     f"{served['dense_ms_per_query']:.3f} | {served['latency_vs_dense']:.2f}x | "
                     f"{served['top10_agreement']:.3f} | {total:.2f}x |")
    return [*lines, ""]


def write_markdown(record: dict, path: Path) -> Path:
    """Write the report and return its path."""
    lines = ["# Retrieval over the full corpus (all offline Wikipedia leads, exact scoring)", "",
             f"Command: `{record['command']}`", "",
             f"Index: {record['documents']:,} documents, every one scored exactly (flat inner product; BM25 over all). "
             "Queries: " + ", ".join(f"{k}: {v}" for k, v in record["queries"].items()) + ".", "",
             f"Each cell: the mean over queries, then the difference from {BASELINE} with its paired-bootstrap 95% "
             "interval (2,000 resamples of the queries, both systems on the same resample); `*`: the interval "
             "excludes zero. `mrr@10 relative` is the relative change of MRR@10. A multi-hop question has several "
             "relevant pages (its sub-questions' evidence): recall@k is the share of them in the top k, hits@5 whether "
             "any is in the top 5 (with one relevant page the two are equal), MRR@10 counts the first.", ""]
    for query_set in record["queries"]:
        lines += [f"## {query_set}", "", "| system | " + " | ".join(FULL_METRICS) + " | mrr@10 relative |",
                  "|---|" + "---|" * (len(FULL_METRICS) + 1)]
        for name, sets in record["systems"].items():
            row = sets[query_set]
            cells = [full_cell(row[m], name == BASELINE) for m in FULL_METRICS]
            relative = row["mrr@10 relative"]
            cells.append("-" if name == BASELINE else
                         f"{100 * relative['mean']:+.1f}% [{100 * relative['low']:+.1f}%, {100 * relative['high']:+.1f}%]")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Costs", "", *_costs(record), "", *_query_latency(record),
              "Timings come from a CPU shared with other jobs; compare them within one run.", "", "## Versions", "",
              ", ".join(f"{k} {v}" for k, v in record["versions"].items()), ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def software_versions() -> dict[str, str]:
    """The versions a retrieval report depends on, and torch's thread count."""
    import bm25s
    import faiss
    import scipy
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "faiss": faiss.__version__, "scipy": scipy.__version__, "bm25s": bm25s.__version__,
            "torch_threads": str(torch.get_num_threads())}


def save_report(record: dict, folder: str | Path, write: Callable[[dict, Path], Path]) -> Path:
    """Write ``record`` (with :func:`software_versions` added) as ``results.json`` and, by ``write``, ``report.md``
    into ``folder``; returns the report's path."""
    output = Path(folder)
    output.mkdir(parents=True, exist_ok=True)
    record = {**record, "versions": software_versions()}
    (output / "results.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    return write(record, output / "report.md")
