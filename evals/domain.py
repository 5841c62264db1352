"""The domain table's own figures: how likely the held-out text is under each system's LM, and the targets of
the domain-adaptation comparison (the domain's documents and phrases, no training, against the LM fine-tuned on
the domain).

The held-out perplexity is teacher-forced: the reference continuation's tokens scored after the prompt, and after
the documents for a system that reads them, under the system's LM (``:lm=DIR``'s for a fine-tuned one). It is a
property of the LM and what it reads, not of the decoding, so systems that share both share the figure (``bare-rag``,
``bare-rag-lookup`` and grounded decoding read the same documents with the same LM). Phrase systems get none: the
dynamic vocabulary's probability of a text sums over its segmentations into tokens and phrases.
"""

from __future__ import annotations

from .closeness import paired_bootstrap
from .perplexity import pair_logprobs, perplexity_from_logprobs
from .score_cache import ScoreCache, score_key
from .systems import READING, matched, parse_system

#: bases whose text is the LM's own distribution given what it reads (grounded: the LM that decides)
SCORED = ("bare", *READING)

#: bases that adapt to the domain with no training on it: phrases from its documents, or grounded decoding in them
NO_DOMAIN_TRAINING = ("dynamic", "dynamic-untrained", "grounded", "grounded-suffix")

#: the domain table's targets by corpus: (goal, against, figure, bound, kind); ``against`` is a base system, or
#: "fine-tuned" (``bare:lm=DIR``); kind "delta" bounds the paired interval's low end, "ratio" the figure's ratio
DOMAIN_TARGETS = {
    "licensedb": [
        ("ROUGE-L above the fine-tuned LM's (the paper's claim)", "fine-tuned", "rougeL", 0.0, "delta"),
        ("ROUGE-2 above bare-rag's", "bare-rag", "rouge2", 0.0, "delta"),
    ],
    "licensedb-families": [
        ("ROUGE-L no worse than bare's (interval's low end above -0.5)", "bare", "rougeL", -0.5, "delta"),
        ("perplexity under the bare LM at most 1.2x bare-rag's", "bare-rag", "perplexity", 1.2, "ratio"),
    ],
}


def _context(tokenizer, prompt: str, documents: list[dict], read_tokens: int) -> list[int]:
    """What a system's LM reads before the continuation, as ``evals.protocol.Generators`` gives it."""
    from retrieval.reading import in_context_ids

    return (in_context_ids(tokenizer, documents, read_tokens)
            + tokenizer(prompt, add_special_tokens=not documents)["input_ids"])


def reference_perplexities(records: list[dict], config, generators) -> dict[str, float]:
    """``{system: perplexity}`` of the references (teacher-forced) under each ``SCORED`` system's LM, given the
    prompt and the documents it reads; cached in the output folder like the quality figures."""
    first = [r for r in records if r["system"] == config.system_names[0]]
    tokenizer, cache, found = generators.tokenizer, ScoreCache(config.output_dir), {}
    targets = [tokenizer(r["reference"], add_special_tokens=False)["input_ids"] for r in first]
    figures = {}
    for system in config.system_names:
        spec = parse_system(system)
        if spec.base not in SCORED:
            continue
        lm = spec.get("lm", None)
        docs = spec.get("docs", config.rag_documents) if spec.base in READING else 0
        settings = {"model": lm or config.model, "documents": docs, "document_tokens": config.rag_document_tokens,
                    "index": config.index or config.data, "encoder": config.encoder}
        key = score_key("reference-perplexity", settings, [[r["prompt"], r["reference"]] for r in first])

        def compute() -> dict:
            if docs and docs not in found:
                found[docs] = generators.index.search_documents([r["prompt"] for r in first], k=docs)
            contexts = [_context(tokenizer, r["prompt"], found[docs][i] if docs else [], config.rag_document_tokens)
                        for i, r in enumerate(first)]
            logprobs = pair_logprobs(generators.lm_for(spec), tokenizer, list(zip(contexts, targets)),
                                     batch_size=config.batch_size)
            return {"perplexity": perplexity_from_logprobs(logprobs).perplexity}

        figures[system] = cache.get_or_compute(key, compute)["perplexity"]
    return figures


def best_without_training(results: dict) -> str | None:
    """The ``NO_DOMAIN_TRAINING`` system on the shipped LM with the highest ROUGE-L, or None."""
    candidates = [s for s in results if parse_system(s).base in NO_DOMAIN_TRAINING and "lm" not in parse_system(s).options]
    return max(candidates, key=lambda s: results[s]["rougeL"], default=None)


def domain_goals(results: dict, config) -> str:
    """The domain table's targets (``DOMAIN_TARGETS`` of the run's corpus) for the best system without training on
    the domain, met or missed, each against the system of the run with its safeguards."""
    targets = DOMAIN_TARGETS.get(config.data)
    best = best_without_training(results)
    if not targets or best is None:
        return ""
    rows = []
    for goal, base, figure, bound, kind in targets:
        tuned = base == "fine-tuned"
        against = matched(best, "bare" if tuned else base, list(results), config.no_repeat_ngram_size,
                          config.repetition_penalty, frozenset({"lm"}) if tuned else frozenset())
        if against is None:
            rows.append(f"- {goal}: not measured (no `{'bare:lm=DIR' if tuned else base}` with the same safeguards)")
        elif kind == "delta":
            d = paired_bootstrap(results[best]["per_prompt"][figure], results[against]["per_prompt"][figure],
                                 groups=results[best].get("prompt_documents"))
            rows.append(f"- {goal}: **{'met' if d.low > bound else 'missed'}**, {d.cell()} against `{against}`")
        else:
            ratio = results[best][figure] / results[against][figure]
            rows.append(f"- {goal}: **{'met' if ratio <= bound else 'missed'}**, {results[best][figure]:.2f} against "
                        f"{results[against][figure]:.2f} ({ratio:.2f}x `{against}`)")
    return (f"Domain targets for `{best}`, the system without training on the domain with the highest ROUGE-L (chosen "
            "on these prompts: a selection among the run's systems, not a held-out choice):\n\n" + "\n".join(rows) + "\n")
