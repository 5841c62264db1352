"""Score the protocol's generations and write results.json, report.md and plots."""

from __future__ import annotations

import functools
import json
import logging
import platform
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from .closeness import ROUGE_TYPES, paired_bootstrap, rouge_scores
from .compression import compression
from .domain import domain_goals, reference_perplexities
from .latency import STAGES, summarize
from .mauve import causal_lm_features, gpt2_large_features, mauve_score, minilm_features, paired_mauve_gain
from .perplexity import perplexity
from .repetition import diversity
from .score_cache import ScoreCache, score_key
from .systems import matched, matched_bare, parse_system

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


def quality_figures(records: list[dict], config, generators, reference_features, features) -> dict:
    """Every text metric of one system over its generations (in prompt order); ``features()`` are the texts'."""
    texts = [r["text"] for r in records]
    steps = [max(r["steps"], 1) for r in records]
    rep = diversity(texts)
    mauve = mauve_score(reference_features(), features(), seeds=range(config.mauve_seeds))
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


def closeness_figures(records: list[dict]) -> dict:
    """Mean ROUGE-1/2/L ×100 against the references, and each prompt's (``per_prompt``, for paired intervals)."""
    scores = rouge_scores([r["text"] for r in records], [r["reference"] for r in records])
    return {**{kind: float(np.mean(values)) for kind, values in scores.items()}, "per_prompt": scores}


def _merged(a: dict, b: dict) -> dict:
    """``a | b`` with their ``per_prompt`` figures together."""
    return a | b | {"per_prompt": a.get("per_prompt", {}) | b.get("per_prompt", {})}


def grounding_figures(records: list[dict], timed: list[dict]) -> dict:
    """What a system that reads documents copied and cites, and every system's seconds per character end to end
    (retrieval, phrase encoding and the documents' prefill included) over its timed prompts."""
    figures = {}
    if timed:
        seconds = [sum(r["latency"].values()) for r in timed]
        figures["ms_per_char"] = 1000 * sum(seconds) / max(1, sum(len(r["text"]) for r in timed))
        figures["per_prompt"] = {"ms_per_char": [1000 * t / max(1, len(r["text"])) for t, r in zip(seconds, timed)]}
    cited = [r for r in records if "cited_share" in r]
    if cited:
        figures |= {"cited_share": float(np.mean([r["cited_share"] for r in cited])),
                    "cited_verbatim": all(r["cited_verbatim"] for r in cited),
                    "copied_share": sum(r["copied_tokens"] for r in cited) / max(1, sum(r["tokens"] for r in cited))}
        copying = [r for r in cited if r.get("copy_steps")]  # generations of older runs did not count their steps
        if copying:
            figures["mean_kept_span"] = sum(r["copied_tokens"] for r in copying) / sum(r["copy_steps"] for r in copying)
    return figures


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
    ordered = {}
    for system in config.system_names:
        by_id = {r["id"]: r for r in records if r["system"] == system}
        ordered[system] = [by_id[i] for i in ids]
    features = functools.cache(lambda system: featurize([r["text"] for r in ordered[system]], config, generators))
    items = {system: [[r["prompt"], r["text"], r["reference"], r["steps"], r["phrase_steps"], r["phrases"]]
                      for r in rows] for system, rows in ordered.items()}
    results = {}
    for system, rows in ordered.items():
        quality = cache.get_or_compute(
            score_key("quality", scorer_settings(config), items[system]),
            lambda: quality_figures(rows, config, generators, reference_features, lambda: features(system)),
        )
        results[system] = {**quality, "characters": float(np.mean([len(r["text"]) for r in rows])),
                           **latency_figures([r for r in timed if r["system"] == system]),
                           **_merged(closeness_figures(rows), grounding_figures(rows, [r for r in timed if r["system"] == system]))}
        documents = [r.get("document", r["id"]) for r in rows]  # records of runs before windows: one prompt a document
        if len(set(documents)) < len(documents):  # several windows of a document: the intervals resample documents
            results[system]["prompt_documents"] = documents
    for system in ordered if config.mauve_permutations else ():
        baseline = baseline_of(system, config)
        if baseline is not None:
            settings = scorer_settings(config) | {"permutations": config.mauve_permutations}
            test = lambda: paired_mauve_gain(reference_features(), features(system), features(baseline),  # noqa: E731
                                             seeds=range(config.mauve_seeds), permutations=config.mauve_permutations)
            key = score_key("mauve-gain", settings, [items[system], items[baseline]])
            results[system]["mauve_gain"] = {"baseline": baseline,
                                             **cache.get_or_compute(key, lambda: asdict(test()))}
    for system, value in reference_perplexities(records, config, generators).items():
        results[system]["reference_perplexity"] = value
    if cache.hits:
        logger.info("reused %d quality figures of %d systems from %s", cache.hits, len(results), cache.path)
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
    """MAUVE's range on this data, same featurizer and seeds: human text of other documents (``other_references``)
    and the floor (``degenerate_texts``), each against the references. Cached like ``score_all``."""
    first = [r for r in records if r["system"] == config.system_names[0]]
    if len(first) < 4:
        return {}
    key = score_key("bounds-v2", scorer_settings(config), [[r["prompt"], r["reference"]] for r in first])
    return ScoreCache(config.output_dir).get_or_compute(key, lambda: _mauve_bounds(first, config, generators))


def other_references(tokenizer, config, count: int) -> list[str]:
    """The references of ``count`` documents of the corpus's training part, cut as the held-out prompts are: human
    text of the same kind and length, about other subjects."""
    from dynvocab.data.corpora import corpus_split

    from .protocol import document_prompts

    cut = replace(config, num_prompts=count, skip_prompts=0, windows_per_document=1)
    return [p["reference"] for p in document_prompts(tokenizer, corpus_split(config.data)[0], cut)]


def _mauve_bounds(first: list[dict], config, generators) -> dict:
    seeds = range(config.mauve_seeds)
    reference_features = featurize([r["reference"] for r in first], config, generators)
    floor = mauve_score(reference_features, featurize(degenerate_texts(first), config, generators), seeds=seeds)
    bounds = {"floor": 100 * floor.mauve, "floor_std": 100 * floor.mauve_std, "floor_samples": len(first),
              "floor_system": "each prompt's last six words looped to the reference's length"}
    others = other_references(generators.tokenizer, config, len(first))
    if len(others) < 2:  # a corpus whose training part holds no document long enough
        return bounds
    human = mauve_score(reference_features, featurize(others, config, generators), seeds=seeds)
    return {"human": 100 * human.mauve, "human_std": 100 * human.mauve_std, "human_samples": len(others), **bounds}


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


#: #32's bound on decoding steps against the matched bare LM, by decoding
STEPS_TARGET = {"greedy": 0.75, "nucleus": 0.8}


def baseline_of(system: str, config) -> str | None:
    """The bare LM of the run with ``system``'s safeguards (``matched_bare``)."""
    return matched_bare(system, config.system_names, config.no_repeat_ngram_size, config.repetition_penalty)


def goals(results: dict, config, system: str = "dynamic") -> str:
    """The report's goals for ``system`` against the bare LM with its safeguards, met or missed and by how much."""
    baseline = baseline_of(system, config)
    if system not in results or baseline not in results:
        return ""
    checks = _goal_checks(results[system], results[baseline], STEPS_TARGET[config.decoding])
    rows = [f"- {goal}: **{'met' if met else 'missed'}**, {detail}" for goal, met, detail, _ in checks
            if met is not None]
    return f"Goals for `{system}` against `{baseline}`:\n\n" + "\n".join(rows) + "\n"


def goals_table(results: dict, config) -> str:
    """The same goals for every trained dynamic system of the run against its matched bare LM (if there are several)."""
    baselines = {s: baseline_of(s, config) for s in results if parse_system(s).base == "dynamic"}
    baselines = {s: b for s, b in baselines.items() if b in results}
    if len(baselines) < 2:
        return ""
    target = STEPS_TARGET[config.decoding]
    checks = {s: _goal_checks(results[s], results[b], target) for s, b in baselines.items()}
    names = [goal for goal, *_ in next(iter(checks.values()))]
    rows = ["The goals for every dynamic system against the bare LM with its safeguards:\n",
            "| system | against | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for s, lines in checks.items():
        cells = [short if met is None else f"{'met' if met else 'missed'}, {short}" for _, met, _, short in lines]
        rows.append(f"| {s} | {baselines[s]} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _goal_checks(d: dict, b: dict, steps_target: float) -> list[tuple[str, bool | None, str, str]]:
    """(goal, met, figures, the deciding figure) for one system's metrics ``d`` against its baseline's ``b``; the
    same goals for every system, ``met`` None where the run did not measure it."""
    ratio = d["steps_per_sequence"] / b["steps_per_sequence"]
    spread = max(d["mauve_std"], b["mauve_std"])
    gain = d["mauve"] - b["mauve"]
    ppl = d["perplexity"] / b["perplexity"]
    lines = [
        ("MAUVE higher by more than the seed spread", gain > spread,
         f"{d['mauve']:.2f} against {b['mauve']:.2f} ({gain:+.2f}; spread ± {spread:.2f})", f"{gain:+.2f} (± {spread:.2f})"),
    ]
    test = d.get("mauve_gain")
    lines.append(("MAUVE gain beyond chance (p < 0.05)", None, "not tested", "-") if test is None else
                 ("MAUVE gain beyond chance (p < 0.05)", test["p_value"] < 0.05,
                  f"p = {test['p_value']:.3f}: with the two systems' texts swapped at random prompts the gain "
                  f"falls in [{test['null_low']:+.2f}, {test['null_high']:+.2f}] ({test['permutations']} swaps)",
                  f"p = {test['p_value']:.3f}"))
    lines += [
        ("Diversity at least the baseline's", d["diversity"] >= b["diversity"],
         f"{d['diversity']:.2f} against {b['diversity']:.2f} ({d['diversity'] - b['diversity']:+.2f})",
         f"{d['diversity'] - b['diversity']:+.2f}"),
        ("perplexity under the bare LM at most 1.5× the baseline's", ppl <= 1.5,
         f"{d['perplexity']:.2f} against {b['perplexity']:.2f} ({ppl:.2f}×)", f"{ppl:.2f}×"),
    ]
    length = d["characters"] / b["characters"]
    lines.append(("length at least 0.95× the baseline's", length >= 0.95,
                  f"{d['characters']:.0f} against {b['characters']:.0f} characters ({length:.2f}×)", f"{length:.2f}×"))
    steps = f"{d['steps_per_sequence']:.1f} against {b['steps_per_sequence']:.1f} ({ratio:.2f}×)"
    lines.append((f"decoding steps per sequence at most {steps_target:.2f}×", ratio <= steps_target, steps,
                  f"{ratio:.2f}×"))
    if not (d.get("latency_prompts") and b.get("latency_prompts")):
        return lines + [("end-to-end latency at most 0.9×", None, "not timed", "not timed")]
    speed = d["latency_median_s"] / b["latency_median_s"]
    timed = (f"{d['latency_median_s']:.2f} s against {b['latency_median_s']:.2f} s ({speed:.2f}×, retrieval and phrase "
             "encoding included)")
    return lines + [("end-to-end latency at most 0.9×", speed <= 0.9, timed, f"{speed:.2f}×")]


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


#: grounded decoding's targets: (what, against, figure, bound, kind); kind "delta" bounds the paired interval's low
#: end, "ratio" the figure's ratio to the baseline's, "share" the figure itself
GROUNDED_TARGETS = {
    "wikipedia": [
        ("ROUGE-L at least bare-rag's", "bare-rag", "rougeL", -0.5, "delta"),
        ("ROUGE-L above bare's", "bare", "rougeL", 0.0, "delta"),
        ("perplexity at most 1.1x bare-rag's", "bare-rag", "perplexity", 1.1, "ratio"),
        ("Diversity at least bare-rag's", "bare-rag", "diversity", 0.0, "gain"),
        ("time per character at most 0.75x bare-rag-lookup's", "bare-rag-lookup", "ms_per_char", 0.75, "ratio"),
        ("time per character at most 0.8x bare's", "bare", "ms_per_char", 0.8, "ratio"),
        ("at least 25% of characters cited", None, "cited_share", 0.25, "share"),
    ],
    "licenses": [
        ("ROUGE-2 above bare-rag's", "bare-rag", "rouge2", 0.0, "delta"),
        ("Diversity at least bare-rag's", "bare-rag", "diversity", 0.0, "gain"),
        ("time per character at most 0.6x bare-rag-lookup's", "bare-rag-lookup", "ms_per_char", 0.6, "ratio"),
        ("at least 50% of characters cited", None, "cited_share", 0.5, "share"),
    ],
}


def closeness_table(results: dict, config) -> str:
    """ROUGE against the author's continuation, copied and cited shares and time per character for every system,
    with paired bootstrap intervals of each system's ROUGE over the bare LM's and bare-rag's (same safeguards)."""
    rows = ["Closeness to what the author wrote next (ROUGE F ×100, Porter stemming), with the mean paired "
            f"difference and its 95% bootstrap interval over {_resampled(results)}; copied: tokens kept from drafts and phrases, "
            "and the mean tokens a step that copied kept beyond the LM's own (span); "
            "cited: non-space characters in spans of at least "
            f"{config.cite_tokens} tokens found verbatim in the documents in the system's context; held-out PPL: "
            "the reference's perplexity, teacher-forced, under the system's LM given the prompt and the documents it "
            "reads (none for phrase systems); time per character end to end over the timed prompts.\n",
            "| system | ROUGE-1 | ROUGE-2 | ROUGE-L | ROUGE-L − bare | ROUGE-2 − bare-rag | ROUGE-L − bare-rag "
            "| copied | span | cited | held-out PPL | ms/char |", "|---" * 12 + "|"]
    for system, m in results.items():
        cells = [f"{m[kind]:.2f}" for kind in ROUGE_TYPES]
        for kind, base in (("rougeL", "bare"), ("rouge2", "bare-rag"), ("rougeL", "bare-rag")):
            against = _matched(system, base, results, config)
            cells.append("-" if against in (None, system) else _difference(results, system, against, kind).cell())
        cells += [f"{100 * m['copied_share']:.0f}%" if "copied_share" in m else "-",
                  f"{m['mean_kept_span']:.1f}" if "mean_kept_span" in m else "-",
                  f"{100 * m['cited_share']:.0f}%" if "cited_share" in m else "-",
                  f"{m['reference_perplexity']:.2f}" if "reference_perplexity" in m else "-",
                  f"{m['ms_per_char']:.2f}" if "ms_per_char" in m else "-"]
        rows.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def grounded_goals(results: dict, config) -> str:
    """Each grounded system's targets (``GROUNDED_TARGETS`` of the run's corpus), met or missed, against the bare
    systems with its safeguards."""
    lines = []
    for system in (s for s in results if parse_system(s).base.startswith("grounded") and config.data in GROUNDED_TARGETS):
        rows = []
        for goal, base, figure, bound, kind in GROUNDED_TARGETS[config.data]:
            against = _matched(system, base, results, config) if base else None
            if base and against is None:
                rows.append(f"- {goal}: not measured (no `{base}` with the same safeguards in the run)")
                continue
            m = results[system]
            if figure not in m or (against and figure not in results[against]):
                rows.append(f"- {goal}: not measured")
                continue
            if kind == "delta":
                d = _difference(results, system, against, figure)
                met, detail = d.low > bound, f"{d.cell()} against `{against}`"
            elif kind == "ratio":
                ratio = m[figure] / results[against][figure]
                met, detail = ratio <= bound, f"{m[figure]:.2f} against {results[against][figure]:.2f} ({ratio:.2f}x `{against}`)"
            elif kind == "gain":
                gain = m[figure] - results[against][figure]
                met, detail = gain >= bound, f"{m[figure]:.2f} against {results[against][figure]:.2f} ({gain:+.2f}, `{against}`)"
            else:
                met, detail = m[figure] >= bound, f"{100 * m[figure]:.1f}%" + (
                    "" if m.get("cited_verbatim", True) else "; some cited span is not verbatim in its document")
            rows.append(f"- {goal}: **{'met' if met else 'missed'}**, {detail}")
        lines.append(f"Targets for `{system}`:\n\n" + "\n".join(rows) + "\n")
    return "\n".join(lines)


def _matched(system: str, base: str, results: dict, config) -> str | None:
    """``systems.matched`` among the run's systems, under its default safeguards."""
    return matched(system, base, list(results), config.no_repeat_ngram_size, config.repetition_penalty)


def _prompt_count(m: dict) -> str:
    """How many held-out documents gave the prompts, and how many prompts where some gave several."""
    if "prompt_documents" not in m:
        return str(m["prompts"])
    return f"{m['prompts']} prompts (windows of prefix and reference, at most the run's windows_per_document) from {len(set(m['prompt_documents']))}"


def _resampled(results: dict) -> str:
    """What the paired intervals resample: prompts, or documents where several prompts share one."""
    return "documents (each with all its prompts)" if any("prompt_documents" in m for m in results.values()) else "prompts"


def _difference(results: dict, system: str, against: str, figure: str):
    return paired_bootstrap(results[system]["per_prompt"][figure], results[against]["per_prompt"][figure],
                            groups=results[system].get("prompt_documents"))


def bounds_line(bounds: dict) -> str:
    if not bounds:
        return ""
    human = (f"human text of other documents {bounds['human']:.2f} ± {bounds['human_std']:.2f} (the same cut of "
             f"{bounds['human_samples']} training-part documents; not a ceiling: a system continues each prompt's own "
             "subject and can score above it); " if "human" in bounds else "")
    return (f"MAUVE's range on this data (same featurizer and seeds): {human}"
            f"floor {bounds['floor']:.2f} ± {bounds['floor_std']:.2f} ({bounds['floor_system']}). A system's "
            "MAUVE differs from its matched bare LM's by more than chance where the gain's p is below 0.05 (the "
            "goals).\n\n")


def index_leak(records: list[dict], config, generators) -> dict:
    """``evals.leakage.leak_check`` of the run's references against the documents of the index it retrieves from
    (the corpus's indexed part unless ``--index`` names another)."""
    from dynvocab.data.corpora import corpus_split

    from .leakage import leak_check

    first = [r for r in records if r["system"] == config.system_names[0]]
    documents = (generators.index.documents if config.index else corpus_split(config.data)[0])
    return leak_check([r["reference"] for r in first], [d["text"] for d in documents])


def leak_line(leak: dict) -> str:
    if not leak:
        return ""
    return (f"Leak check: {leak['whole']:.1%} of the {leak['references']} references stand whole, and "
            f"{leak['first_32_words']:.1%} by their first 32 words, verbatim in a document of the index the systems "
            "retrieve from (whitespace collapsed).\n\n")


def write_report(results: dict, config, command: str, systems: dict | None = None, bounds: dict | None = None,
                 leak: dict | None = None) -> Path:
    """results.json (every figure and setting), report.md (the paper's layout) and latency.png."""
    out = Path(config.output_dir)
    payload = {"config": asdict(config), "command": command, "environment": environment(), "systems": systems or {},
               "mauve_bounds": bounds or {}, "leak": leak or {}, "results": results}
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    timed = plot_latency(results, out / "latency.png")
    swept = plot_phrase_counts(results, out / "phrases.png")
    latency_prompts = max(m["latency_prompts"] for m in results.values())
    env = payload["environment"]
    settings = "".join(f"- `{name}`: {json.dumps(value)}\n" for name, value in (systems or {}).items())
    text = (
        f"# Evaluation: {config.model}, {config.decoding} decoding\n\n"
        f"Command: `{command}`\n\n"
        f"{_prompt_count(next(iter(results.values())))} held-out {config.data} documents"
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
        + leak_line(leak or {})
        + markdown_table(results)
        + "\n" + closeness_table(results, config)
        + "\n" + grounded_goals(results, config)
        + "\n" + domain_goals(results, config)
        + "\n" + goals(results, config)
        + "\n" + goals_table(results, config)
        + "\n" + ablation_table(results)
        + (f"\nSystems:\n\n{settings}" if settings else "")
        + ("\n![latency by stage](latency.png)\n" if timed else "")
        + ("\n![metrics against phrases per prompt](phrases.png)\n" if swept else "")
    )
    (out / "report.md").write_text(text)
    return out / "report.md"
