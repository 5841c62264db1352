"""Score the protocol's generations and write results.json, report.md and plots."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .compression import compression
from .latency import summarize
from .mauve import causal_lm_features, gpt2_large_features, mauve_score, minilm_features
from .perplexity import perplexity
from .repetition import diversity

STAGES = ("retrieve", "extract", "encode", "decode")


def featurize(texts: list[str], config, generators):
    if config.mauve_featurizer == "minilm":
        return minilm_features(texts)
    if config.mauve_featurizer == "lm":
        return causal_lm_features(texts, generators.lm, generators.tokenizer)
    return gpt2_large_features(texts)


def score_system(records: list[dict], config, generators, reference_features) -> dict:
    """Every metric of one system over its generations (records in prompt order)."""
    texts = [r["text"] for r in records]
    steps = [max(r["steps"], 1) for r in records]
    rep = diversity(texts)
    mauve = mauve_score(reference_features, featurize(texts, config, generators), seeds=range(config.mauve_seeds))
    ppl = perplexity(generators.lm, generators.tokenizer, texts, prefixes=[r["prompt"] for r in records])
    packed = compression(texts, steps, base_tokenizer=generators.tokenizer)
    totals = [sum(r["latency"].values()) for r in records]
    return {
        "prompts": len(records),
        "mauve": 100 * mauve.mauve, "mauve_std": 100 * mauve.mauve_std,
        "rep2": rep.rep2, "rep3": rep.rep3, "rep4": rep.rep4, "diversity": 100 * rep.diversity,
        "perplexity": ppl.perplexity,
        "steps_per_sequence": packed.steps_per_sequence, "bytes_per_step": packed.bytes_per_step,
        "tokens_per_step": packed.tokens_per_step,
        "phrase_share": sum(r["phrase_steps"] for r in records) / sum(steps),
        "latency_median_s": summarize(totals).median, "latency_iqr_s": summarize(totals).iqr,
        "decode_median_s": summarize([r["latency"]["decode"] for r in records]).median,
        "stage_means_s": {s: float(np.mean([r["latency"][s] for r in records])) for s in STAGES},
        "mauve_settings": {k: v for k, v in asdict(mauve).items() if k not in ("mauve", "mauve_std", "scores")},
    }


def score_all(records: list[dict], config, generators) -> dict:
    ids = [r["id"] for r in records if r["system"] == config.system_names[0]]
    references = {r["id"]: r["reference"] for r in records}
    reference_features = featurize([references[i] for i in ids], config, generators)
    results = {}
    for system in config.system_names:
        by_id = {r["id"]: r for r in records if r["system"] == system}
        results[system] = score_system([by_id[i] for i in ids], config, generators, reference_features)
    return results


def environment() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, "
                       f"{'cuda' if torch.cuda.is_available() else 'cpu'}"}


def markdown_table(results: dict) -> str:
    header = ("| system | MAUVE ↑ | Rep-2 ↓ | Rep-3 ↓ | Rep-4 ↓ | Diversity ↑ | PPL | steps/seq | bytes/step | "
              "phrase steps | latency (s) |")
    rows = [header, "|" + "---|" * 11]
    for system, m in results.items():
        rows.append(
            f"| {system} | {m['mauve']:.2f} ± {m['mauve_std']:.2f} | {m['rep2']:.2f} | {m['rep3']:.2f} | {m['rep4']:.2f} "
            f"| {m['diversity']:.2f} | {m['perplexity']:.2f} | {m['steps_per_sequence']:.1f} | {m['bytes_per_step']:.2f} "
            f"| {100 * m['phrase_share']:.1f}% | {m['latency_median_s']:.2f} (decode {m['decode_median_s']:.2f}) |"
        )
    return "\n".join(rows) + "\n"


def plot_latency(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(results)
    fig, ax = plt.subplots(figsize=(7, 3))
    left = np.zeros(len(systems))
    for stage in STAGES:
        values = np.array([results[s]["stage_means_s"][stage] for s in systems])
        ax.barh(systems, values, left=left, label=stage)
        left += values
    ax.set_xlabel("mean seconds per prompt")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(results: dict, config, command: str) -> Path:
    out = Path(config.output_dir)
    payload = {"config": asdict(config), "command": command, "environment": environment(), "results": results}
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot_latency(results, out / "latency.png")
    env = payload["environment"]
    text = (
        f"# Evaluation: {config.model}, {config.decoding} decoding\n\n"
        f"Command: `{command}`\n\n"
        f"{config.num_prompts} held-out {config.data} documents, prefix {config.prefix_tokens} tokens, continuation "
        f"{config.continuation_tokens} tokens (dynamic systems: the reference's character budget), phrases from the "
        f"top-{config.top_k_docs} documents retrieved from `{config.index or config.data}`. MAUVE ×100 against the references with the "
        f"{config.mauve_featurizer} featurizer, scaling 2.0, mean ± std over {config.mauve_seeds} seeds; Diversity ×100; "
        f"PPL of the generated text under the bare LM; latency is end to end (retrieval and phrase encoding "
        f"included), median per prompt, bare LM with its KV cache.\n\n"
        f"Software: Python {env['python']}, torch {env['torch']}, transformers {env['transformers']}; machine: {env['machine']}.\n\n"
        + markdown_table(results)
        + "\n![latency by stage](latency.png)\n"
    )
    (out / "report.md").write_text(text)
    return out / "report.md"
