"""Score the protocol's generations and write results.json, report.md and plots."""

from __future__ import annotations

import functools
import json
import logging
import platform
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .compression import compression
from .latency import STAGES, summarize
from .mauve import causal_lm_features, gpt2_large_features, mauve_score, minilm_features
from .perplexity import perplexity
from .systems import parse_system
from .repetition import diversity
from .score_cache import ScoreCache, score_key

logger = logging.getLogger(__name__)


def featurize(texts: list[str], config, generators):
    if config.mauve_featurizer == "minilm":
        return minilm_features(texts)
    if config.mauve_featurizer == "lm":
        return causal_lm_features(texts, generators.lm, generators.tokenizer)
    return gpt2_large_features(texts)


def latency_figures(timed: list[dict]) -> dict:
    """Median and spread of end-to-end and decode-only seconds per prompt, and mean seconds by stage."""
    if not timed:
        return {"latency_prompts": 0}
    totals = [sum(r["latency"].values()) for r in timed]
    return {
        "latency_prompts": len(timed),
        "latency_median_s": summarize(totals).median, "latency_iqr_s": summarize(totals).iqr,
        "decode_median_s": summarize([r["latency"]["decode"] for r in timed]).median,
        "stage_means_s": {s: float(np.mean([r["latency"][s] for r in timed])) for s in STAGES},
    }


def quality_figures(records: list[dict], config, generators, reference_features) -> dict:
    """Every text metric of one system over its generations (in prompt order)."""
    texts = [r["text"] for r in records]
    steps = [max(r["steps"], 1) for r in records]
    rep = diversity(texts)
    mauve = mauve_score(reference_features(), featurize(texts, config, generators), seeds=range(config.mauve_seeds))
    ppl = perplexity(generators.lm, generators.tokenizer, texts, prefixes=[r["prompt"] for r in records])
    packed = compression(texts, steps, base_tokenizer=generators.tokenizer)
    return {
        "prompts": len(records),
        "mauve": 100 * mauve.mauve, "mauve_std": 100 * mauve.mauve_std,
        "rep2": rep.rep2, "rep3": rep.rep3, "rep4": rep.rep4, "diversity": 100 * rep.diversity,
        "perplexity": ppl.perplexity,
        "steps_per_sequence": packed.steps_per_sequence, "bytes_per_step": packed.bytes_per_step,
        "tokens_per_step": packed.tokens_per_step,
        "phrase_share": sum(r["phrase_steps"] for r in records) / sum(steps),
        "phrases_per_prompt": float(np.mean([r["phrases"] for r in records])),
        "mauve_settings": {k: v for k, v in asdict(mauve).items() if k not in ("mauve", "mauve_std", "scores")},
    }


def scorer_settings(config) -> dict:
    """What the quality figures depend on besides the texts: the scorer LM, the featurizer and the seeds."""
    return {"model": config.model, "featurizer": config.mauve_featurizer, "mauve_seeds": config.mauve_seeds}


def score_all(records: list[dict], timed: list[dict], config, generators) -> dict:
    """Figures of every system: ``records`` from the quality pass, ``timed`` from the latency pass.

    Quality figures already in the output folder's ``ScoreCache`` for the same texts and settings are reused,
    so a resumed report scores only the systems that are new or changed.
    """
    ids = [r["id"] for r in records if r["system"] == config.system_names[0]]
    references = {r["id"]: r["reference"] for r in records}
    cache = ScoreCache(config.output_dir)
    reference_features = functools.cache(lambda: featurize([references[i] for i in ids], config, generators))
    results = {}
    for system in config.system_names:
        by_id = {r["id"]: r for r in records if r["system"] == system}
        ordered = [by_id[i] for i in ids]
        items = [[r["prompt"], r["text"], r["reference"], r["steps"], r["phrase_steps"], r["phrases"]] for r in ordered]
        quality = cache.get_or_compute(
            score_key("quality", scorer_settings(config), items),
            lambda: quality_figures(ordered, config, generators, reference_features),
        )
        results[system] = {**quality, **latency_figures([r for r in timed if r["system"] == system])}
    if cache.hits:
        logger.info("reused the quality figures of %d of %d systems from %s", cache.hits, len(results), cache.path)
    return results


def degenerate_texts(records: list[dict]) -> list[str]:
    """The floor system: each prompt's last sentence-ish span looped up to the reference's length."""
    texts = []
    for record in records:
        words = record["prompt"].split()[-6:] or ["the"]
        loop = " " + " ".join(words)
        texts.append((loop * (len(record["reference"]) // max(1, len(loop)) + 1))[: len(record["reference"])])
    return texts


def mauve_bounds(records: list[dict], config, generators) -> dict:
    """MAUVE's range on this data, same featurizer and seeds: the ceiling (one half of the references
    against the other) and the floor (``degenerate_texts`` against the references). Cached like ``score_all``."""
    first = [r for r in records if r["system"] == config.system_names[0]]
    if len(first) < 4:
        return {}
    key = score_key("bounds", scorer_settings(config), [[r["prompt"], r["reference"]] for r in first])
    return ScoreCache(config.output_dir).get_or_compute(key, lambda: _mauve_bounds(first, config, generators))


def _mauve_bounds(first: list[dict], config, generators) -> dict:
    seeds = range(config.mauve_seeds)
    half = len(first) // 2
    reference_features = featurize([r["reference"] for r in first], config, generators)
    ceiling = mauve_score(reference_features.values[:half], reference_features.values[half : 2 * half], seeds=seeds)
    floor = mauve_score(reference_features, featurize(degenerate_texts(first), config, generators), seeds=seeds)
    return {"ceiling": 100 * ceiling.mauve, "ceiling_std": 100 * ceiling.mauve_std, "ceiling_samples": half,
            "floor": 100 * floor.mauve, "floor_std": 100 * floor.mauve_std, "floor_samples": len(first),
            "floor_system": "each prompt's last six words looped to the reference's length"}


def environment() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, "
                       f"{'cuda' if torch.cuda.is_available() else 'cpu'}"}


def latency_cell(m: dict) -> str:
    if not m["latency_prompts"]:
        return "not timed"
    return f"{m['latency_median_s']:.2f} (IQR {m['latency_iqr_s']:.2f}; decode {m['decode_median_s']:.2f})"


def markdown_table(results: dict) -> str:
    header = ("| system | MAUVE ↑ | Rep-2 ↓ | Rep-3 ↓ | Rep-4 ↓ | Diversity ↑ | PPL | steps/seq | bytes/step | "
              "phrase steps | phrases/prompt | latency (s) |")
    rows = [header, "|" + "---|" * 12]
    for system, m in results.items():
        rows.append(
            f"| {system} | {m['mauve']:.2f} ± {m['mauve_std']:.2f} | {m['rep2']:.2f} | {m['rep3']:.2f} | {m['rep4']:.2f} "
            f"| {m['diversity']:.2f} | {m['perplexity']:.2f} | {m['steps_per_sequence']:.1f} | {m['bytes_per_step']:.2f} "
            f"| {100 * m['phrase_share']:.1f}% | {m['phrases_per_prompt']:.0f} | {latency_cell(m)} |"
        )
    return "\n".join(rows) + "\n"


def plot_latency(results: dict, path: Path) -> bool:
    """Mean seconds per prompt by stage for every timed system; False when none was timed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in results if results[s]["latency_prompts"]]
    if not systems:
        return False
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
    return True


def goals(results: dict, system: str = "dynamic", baseline: str = "bare") -> str:
    """The report's goals for ``system`` against ``baseline``, met or missed and by how much."""
    if system not in results or baseline not in results:
        return ""
    d, b = results[system], results[baseline]
    rows = [f"- {goal}: **{'met' if met else 'missed'}**, {detail}" for goal, met, detail, _ in _goal_checks(d, b)]
    rows.append(f"- perplexity under the bare LM: {d['perplexity']:.2f}, against the bare LM's own {b['perplexity']:.2f}")
    return f"Goals for `{system}` against `{baseline}`:\n\n" + "\n".join(rows) + "\n"


def goals_table(results: dict, baseline: str = "bare") -> str:
    """The same goals for every trained dynamic system of the run, one row each (only when there are several)."""
    systems = [s for s in results if parse_system(s).base == "dynamic"]
    if baseline not in results or len(systems) < 2:
        return ""
    checks = {s: _goal_checks(results[s], results[baseline]) for s in systems}
    names = [goal for goal, *_ in max(checks.values(), key=len)]
    rows = [f"The goals for every dynamic system against `{baseline}`:\n", "| system | " + " | ".join(names) + " |",
            "|---" * (len(names) + 1) + "|"]
    for s, lines in checks.items():
        cells = [f"{'met' if met else 'missed'}, {short}" for _, met, _, short in lines]
        rows.append(f"| {s} | " + " | ".join(cells + ["not timed"] * (len(names) - len(cells))) + " |")
    return "\n".join(rows) + "\n"


def _goal_checks(d: dict, b: dict) -> list[tuple[str, bool, str, str]]:
    """(goal, met, figures, the deciding figure) for one system's metrics ``d`` against the baseline's ``b``."""
    ratio = d["steps_per_sequence"] / b["steps_per_sequence"]
    spread = max(d["mauve_std"], b["mauve_std"])
    gain = d["mauve"] - b["mauve"]
    lines = [
        ("MAUVE higher by more than the seed spread", gain > spread,
         f"{d['mauve']:.2f} against {b['mauve']:.2f} ({gain:+.2f}; spread ± {spread:.2f})", f"{gain:+.2f} (± {spread:.2f})"),
        ("Diversity at least the bare LM's", d["diversity"] >= b["diversity"],
         f"{d['diversity']:.2f} against {b['diversity']:.2f} ({d['diversity'] - b['diversity']:+.2f})",
         f"{d['diversity'] - b['diversity']:+.2f}"),
        ("decoding steps per sequence at most 0.80× (goal 0.70×)", ratio <= 0.8,
         f"{d['steps_per_sequence']:.1f} against {b['steps_per_sequence']:.1f} ({ratio:.2f}×)", f"{ratio:.2f}×"),
    ]
    if d.get("latency_prompts") and b.get("latency_prompts"):
        speed = d["latency_median_s"] / b["latency_median_s"]
        lines.append(("end-to-end latency at most 0.9×", speed <= 0.9,
                      f"{d['latency_median_s']:.2f} s against {b['latency_median_s']:.2f} s ({speed:.2f}×, retrieval "
                      "and phrase encoding included)", f"{speed:.2f}×"))
    return lines


def ablation_table(results: dict, reference: str = "dynamic") -> str:
    """Every system written ``reference:...`` (one lever changed) against ``reference``: what the lever changed."""
    if reference not in results:
        return ""
    r = results[reference]
    changed = [s for s in results if s != reference and (s.startswith(reference + ":") or s.startswith(reference + "@"))]
    if not changed:
        return ""
    rows = [f"Ablations against `{reference}` (each row changes the settings in its name; Δ = row − `{reference}`):\n",
            "| system | MAUVE Δ | Diversity Δ | PPL Δ | steps/seq Δ | phrase steps Δ |", "|---|---|---|---|---|---|"]
    for s in changed:
        m = results[s]
        rows.append(f"| {s} | {m['mauve'] - r['mauve']:+.2f} | {m['diversity'] - r['diversity']:+.2f} "
                    f"| {m['perplexity'] - r['perplexity']:+.2f} | {m['steps_per_sequence'] - r['steps_per_sequence']:+.1f} "
                    f"| {100 * (m['phrase_share'] - r['phrase_share']):+.1f} pt |")
    return "\n".join(rows) + "\n"


def plot_phrase_counts(results: dict, path: Path) -> bool:
    """Phrase share, bytes per step, Diversity and MAUVE against phrases per prompt, over the trained
    dynamic systems that differ only in it (``dynamic``, ``dynamic@N``, ``dynamic-no-phrases``, no other
    setting); False when fewer than two phrase counts."""
    systems = [s for s in results if (spec := parse_system(s)).base in ("dynamic", "dynamic-no-phrases") and not spec.options]
    systems.sort(key=lambda s: results[s]["phrases_per_prompt"])
    if len({results[s]["phrases_per_prompt"] for s in systems}) < 2:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [results[s]["phrases_per_prompt"] for s in systems]
    panels = [("phrase_share", "phrase steps", 100), ("bytes_per_step", "bytes per step", 1),
              ("diversity", "Diversity", 1), ("mauve", "MAUVE", 1)]
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 2.8))
    for ax, (key, label, scale) in zip(axes, panels):
        ax.plot(x, [scale * results[s][key] for s in systems], marker="o")
        if "bare" in results:
            ax.axhline(scale * results["bare"][key], color="gray", linestyle="--", label="bare LM")
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(0, 2 * max(x))
        ax.set_xlabel("phrases per prompt")
        ax.set_title(label + (" (%)" if scale == 100 else ""), fontsize=9)
    if "bare" in results:
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def bounds_line(bounds: dict) -> str:
    if not bounds:
        return ""
    return (f"MAUVE's range on this data (same featurizer and seeds): ceiling {bounds['ceiling']:.2f} ± "
            f"{bounds['ceiling_std']:.2f} (one half of the references against the other, {bounds['ceiling_samples']} "
            f"each); floor {bounds['floor']:.2f} ± {bounds['floor_std']:.2f} ({bounds['floor_system']}).\n\n")


def write_report(results: dict, config, command: str, systems: dict | None = None, bounds: dict | None = None) -> Path:
    """results.json (every figure and setting), report.md (the paper's layout) and latency.png."""
    out = Path(config.output_dir)
    payload = {"config": asdict(config), "command": command, "environment": environment(), "systems": systems or {},
               "mauve_bounds": bounds or {}, "results": results}
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    timed = plot_latency(results, out / "latency.png")
    swept = plot_phrase_counts(results, out / "phrases.png")
    latency_prompts = max(m["latency_prompts"] for m in results.values())
    env = payload["environment"]
    settings = "".join(f"- `{name}`: {json.dumps(value)}\n" for name, value in (systems or {}).items())
    text = (
        f"# Evaluation: {config.model}, {config.decoding} decoding\n\n"
        f"Command: `{command}`\n\n"
        f"{next(iter(results.values()))['prompts']} held-out {config.data} documents"
        f"{f' (development prompts: the first {config.skip_prompts} passed over)' if config.skip_prompts else ''}, prefix {config.prefix_tokens} tokens, reference "
        f"{config.continuation_tokens} tokens; every system generates to the reference's number of characters (one budget "
        f"for all, so the text metrics compare equal lengths and steps/seq measures compression). "
        f"Phrases come from the top-{config.top_k_docs} documents retrieved from `{config.index or config.data}`. "
        f"Quality figures come from generations in batches of {config.batch_size}; latency from the first "
        f"{latency_prompts} prompts one at a time after a warm-up, end to end (tokenization, retrieval, phrase extraction "
        f"and encoding included), median and interquartile range per prompt, every system with its KV cache. MAUVE ×100 "
        f"against the references with the {config.mauve_featurizer} featurizer, scaling 2.0, mean ± std over "
        f"{config.mauve_seeds} k-means seeds; Diversity ×100; PPL of the generated text under the bare LM.\n\n"
        f"Software: Python {env['python']}, torch {env['torch']}, transformers {env['transformers']}; machine: {env['machine']}.\n\n"
        + bounds_line(bounds or {})
        + markdown_table(results)
        + "\n" + goals(results)
        + "\n" + goals_table(results)
        + "\n" + ablation_table(results)
        + (f"\nSystems:\n\n{settings}" if settings else "")
        + ("\n![latency by stage](latency.png)\n" if timed else "")
        + ("\n![metrics against phrases per prompt](phrases.png)\n" if swept else "")
    )
    (out / "report.md").write_text(text)
    return out / "report.md"
