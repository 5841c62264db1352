"""``report.md`` of ``dynvocab eval-retrieval --quick true``: per-seed rows, means and spreads, and the issue's targets."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

__all__ = ["grouped", "target_lines", "write_quick_markdown"]

METRICS = ("mrr@10", "ndcg@10", "recall@5", "recall@20", "recall@100")
FANOUT = "FanOutQA sub-questions"


def grouped(systems: dict[str, dict], query_set: str, metric: str = "mrr@10") -> dict[str, list[float]]:
    """``{system without its seed: [metric per seed]}`` for one query set."""
    out: dict[str, list[float]] = {}
    for name, row in systems.items():
        if query_set in row:
            out.setdefault(re.sub(r", seed \d+$", "", name), []).append(row[query_set][metric])
    return out


def _per_set(row: dict, suffix: str, form: str = "") -> str:
    """``set: value, ...`` of the entries ``"<set> <suffix>"`` of ``row`` (a share when ``form`` is empty)."""
    cells = [f"{key.removesuffix(' ' + suffix)}: {form.format(value) if form else f'{100 * value:.1f}%'}"
             for key, value in row.items() if key.endswith(" " + suffix)]
    return ", ".join(cells) or "-"


def _spread(values: list[float]) -> float:
    return float(max(values) - min(values)) if len(values) > 1 else 0.0


def target_lines(record: dict) -> list[str]:
    """Each target of the issue with the measured figures and 'met' or 'MISSED by ...'."""
    lines = []
    mrr = grouped(record["systems"], FANOUT)
    if mrr:
        seeds = len(mrr["DupMAE+FT both"])
        if seeds < 3:
            lines.append(f"- Only {seeds} seed(s) here, the issue asks for 3: the seed spread below is "
                         f"{'0 by construction' if seeds == 1 else 'from 2 seeds'}, so a 'met' is weaker than it reads")
        both = mrr["DupMAE+FT both"]
        for other in ("MiniLM fine-tuned", "MiniLM as shipped", "DupMAE+FT cls", "DupMAE+FT ot"):
            gap, spread = float(np.mean(both) - np.mean(mrr[other])), max(_spread(both), _spread(mrr[other]))
            verdict = "met" if gap > spread else f"MISSED by {spread - gap:.4f}"
            lines.append(f"- FanOutQA MRR@10, DupMAE+FT both ({np.mean(both):.4f}) ahead of {other} "
                         f"({np.mean(mrr[other]):.4f}) by more than the seed spread: gap {gap:+.4f}, spread {spread:.4f}: {verdict}")
    bench = {row["index"]: row for row in record["benchmark"]}
    for name in ("hybrid CLS:384/OT:384", "hybrid CLS:384/OT:260"):
        ratio = bench[name]["latency_vs_dense384"]
        verdict = "met" if ratio <= 2.0 else f"MISSED by {ratio - 2.0:.2f}x"
        lines.append(f"- {name} search latency at most 2x dense-384 over {record['config']['benchmark_documents']} "
                     f"documents: {ratio:.2f}x: {verdict}")
    ratio = bench["hybrid CLS:384/OT:260"]["bytes_vs_dense768"]
    verdict = "met" if abs(ratio - 1.0) <= 0.10 else f"MISSED by {abs(ratio - 1.0) - 0.10:.3f}"
    lines.append(f"- CLS:384/OT:260 index memory within 10% of a 768-dim dense index: {ratio:.3f}x: {verdict}")
    pre = record["pretraining"]
    lines.append(f"- Pre-training throughput (CPU, {record['versions']['torch_threads']} threads): "
                 f"{pre['sequences_per_s']:.2f} sequences/s over {pre['steps']} steps")
    return lines


def write_quick_markdown(record: dict, path: Path) -> Path:
    """Write the report and return its path."""
    config = record["config"]
    lines = [f"# Retrieval evaluation: DupMAE vs baselines ({config['corpus']})", "",
             f"Command: `{record['command']}`", "",
             f"Index: {record['documents']} documents. Queries: "
             + ", ".join(f"{k}: {v}" for k, v in record["queries"].items()) + ".", "",
             f"Budget: DupMAE pre-training {config['pretrain_steps']} steps x {config['pretrain_batch_size']} sequences "
             f"of {config['pretrain_max_length']} tokens; fine-tuning {config['finetune_steps']} steps x "
             f"{config['batch_size']} pairs for every fine-tuned system; seeds {config['seeds']}.", "",
             f"Machine: CPU only, {record['versions']['torch_threads']} torch threads, no GPU; the cores may be shared "
             "with other jobs, so absolute timings are noisy: compare the ratios, which are taken side by side.", "",
             "## Targets", "", *target_lines(record), "", "## Means over seeds (spread = max - min)", ""]
    for query_set in record["queries"]:
        lines += [f"### {query_set}", "", "| system | seeds | " + " | ".join(METRICS) + " |",
                  "|---|---|" + "---|" * len(METRICS)]
        names = list(grouped(record["systems"], query_set))
        for name in names:
            cells = []
            for metric in METRICS:
                values = grouped(record["systems"], query_set, metric)[name]
                cells.append(f"{np.mean(values):.4f} ± {_spread(values) / 2:.4f}")
            lines.append(f"| {name} | {len(grouped(record['systems'], query_set)[name])} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Index bytes and latency (this index, seed 0)", "",
              "The tables above score every document exactly. The default hybrid index (below) prunes the sparse "
              "candidates; its MRR@10 and the share of its top 10 that exact scoring also returns are per query set.", "",
              "| system | index bytes | ms/query | default index MRR@10 | top-10 vs exhaustive |", "|---|---|---|---|---|"]
    for name, row in record["systems"].items():
        if "index_bytes" in row and ("seed" not in name or name.endswith("seed 0")):
            lines.append(f"| {name} | {row['index_bytes']} | {_per_set(row, 'ms/query', '{:.2f}')} | "
                         f"{_per_set(row, 'default index mrr@10', '{:.4f}')} | {_per_set(row, 'top-10 vs exhaustive')} |")
    lines += ["", f"## Synthetic benchmark ({config['benchmark_documents']} documents, flat, 2 threads)", "",
              "| index | bytes | ms/query | bytes vs dense 768 | latency vs dense 384 |", "|---|---|---|---|---|"]
    lines += [f"| {r['index']} | {r['bytes']} | {r['ms_per_query']:.3f} | {r['bytes_vs_dense768']:.3f} | "
              f"{r['latency_vs_dense384']:.2f} |" for r in record["benchmark"]]
    hybrid = next(r for r in record["benchmark"] if "posting_terms" in r)
    lines += ["", f"Hybrid search: each part proposes its top {hybrid['candidates']} candidates (the sparse part from "
              f"posting lists that keep each document's {hybrid['posting_terms']} heaviest entries, walked for the "
              f"query's {hybrid['query_terms']} heaviest), and their union is scored exactly."]
    pre = record["pretraining"]
    lines += ["", "## Pre-training", "", f"{pre['steps']} steps in {pre['seconds']:.0f} s ({pre['sequences_per_s']:.2f} sequences/s); "
              f"losses first step {pre['first_losses']}, last step {pre['final_losses']}.", "",
              "## Per-seed rows", "", "See results.json (`systems`).", "", "## Versions", "",
              ", ".join(f"{k} {v}" for k, v in record["versions"].items()), ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
