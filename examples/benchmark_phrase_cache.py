"""The encode stage of a request: no reuse, the phrase vector cache, and phrase vectors stored beside the index.

Each prompt's phrases are cut from its top-k documents (the pipeline's own retrieval and extraction), then plugged
into three copies of the model that share the LM and the phrase encoder's weights: one encodes every phrase, one keeps
phrase vectors across requests (``phrase_cache_mb``), one reads them from the store that ``dynvocab phrase-vectors``
wrote beside the index (``dynvocab.phrases.store``; skipped when the index has none). The cache is first warmed on
prompts from the training split, then each copy plugs in the phrases of the held-out prompts of ``dynvocab eval``, in
turn for each prompt, so a busy machine slows all alike. Prints the median and mean encode time per prompt, the
ratios to no reuse (target: at most 0.10), the hit rates on the held-out prompts and the memory of each.

    python -m dynvocab phrase-vectors --index .cache/demo/wikipedia-index-minilm-wikipedia   # the default retriever's index
    python examples/benchmark_phrase_cache.py --warmup-prompts 100 --num-prompts 200 --output results/request-path/phrase-cache/figures.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

TARGET = 0.10


def prompts_of(leads: list[dict], tokenizer, count: int, prefix_tokens: int = 32) -> list[str]:
    """The first ``prefix_tokens`` tokens of the first ``count`` leads long enough to have them."""
    prompts = []
    for lead in leads:
        ids = tokenizer(lead["text"], add_special_tokens=False).input_ids
        if len(ids) > prefix_tokens:
            prompts.append(tokenizer.decode(ids[:prefix_tokens]))
        if len(prompts) == count:
            break
    return prompts


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup-prompts", type=int, default=400, help="training-split prompts that warm the cache")
    parser.add_argument("--num-prompts", type=int, default=200, help="held-out prompts measured")
    parser.add_argument("--cache-mb", type=int, default=256, help="the cache's budget (phrase_cache_mb)")
    parser.add_argument("--workdir", default=".cache/demo", help="where `make demo` keeps its index")
    parser.add_argument("--output", help="also write the figures as JSON here")
    args = parser.parse_args(argv)

    from dynvocab.data.corpora import corpus_split
    from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
    from retrieval.loading import demo_index
    from retrieval.phrase_vectors import STORE_FILE, store_path
    from retrieval.pipeline import PhrasePipeline

    cached = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    cached.dynvocab_config.phrase_cache_mb = args.cache_mb
    cached.phrase_cache.max_bytes = args.cache_mb * 2**20
    plain = type(cached)(cached.lm, cached.tokenizer, cached.phrase_encoder, cached.dynvocab_config)
    plain.phrase_cache.max_bytes = 0  # the same weights, no cache
    pipeline = PhrasePipeline(plain, demo_index(Path(args.workdir), "wikipedia"))
    models = {"no reuse": plain, "cache": cached}
    store_dir = store_path(pipeline.index.directory)
    if (store_dir / STORE_FILE).is_file():
        stored = type(cached)(cached.lm, cached.tokenizer, cached.phrase_encoder, cached.dynvocab_config)
        stored.phrase_cache.max_bytes = 0
        stored.use_phrase_store(store_dir)
        models["store"] = stored
    else:
        print(f"no phrase vectors in {store_dir}: `python -m dynvocab phrase-vectors --index {pipeline.index.directory}` "
              "writes them; measuring the cache only")
    plain.use_phrase_store(None)  # the pipeline attached the store, if any: this copy encodes everything
    training, held_out = corpus_split("wikipedia")
    warmup = prompts_of(training, cached.tokenizer, args.warmup_prompts)
    measured = prompts_of(held_out, cached.tokenizer, args.num_prompts)

    def phrases(prompt: str) -> list:
        return pipeline.candidates(pipeline.index.search_documents([prompt], k=pipeline.config.top_k)[0])

    with torch.no_grad():
        for prompt in tqdm(warmup, desc="warm-up"):
            cached.set_phrases(phrases(prompt), mid_sentence_forms=False)
        cached.phrase_cache.hits = cached.phrase_cache.misses = 0  # the hit rate of the measured prompts only
        seconds: dict[str, list[float]] = {name: [] for name in models}
        counts = []
        for prompt in tqdm(measured, desc="held-out prompts"):
            found = phrases(prompt)
            counts.append(len(found))
            for name, model in models.items():
                model.set_phrases([], mid_sentence_forms=False)  # as a new request finds the table: another prompt's set
                start = time.perf_counter()
                model.set_phrases(found, mid_sentence_forms=False)
                seconds[name].append(time.perf_counter() - start)

    figures = {name: {"median_s": statistics.median(v), "mean_s": statistics.fmean(v)} for name, v in seconds.items()}
    ratios = {name: figures[name]["mean_s"] / figures["no reuse"]["mean_s"] for name in models if name != "no reuse"}
    stats = {"cache": cached.phrase_cache.stats()}
    if "store" in models:
        stats["store"] = models["store"].phrase_store.stats()
    result = {
        "warmup_prompts": len(warmup), "prompts": len(measured), "phrases_per_prompt": statistics.fmean(counts),
        "encode": figures, "ratios": ratios, "target": TARGET, "met": {name: r <= TARGET for name, r in ratios.items()},
        **stats, "cache_mb": round(stats["cache"]["bytes"] / 2**20, 1),
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "cpu": platform.processor() or platform.machine()},
    }
    for name, figure in figures.items():
        print(f"{name:9s} encode per prompt: median {figure['median_s']:.3f} s, mean {figure['mean_s']:.3f} s")
    for name, ratio in ratios.items():
        print(f"{name} / no reuse: {ratio:.3f} (target <= {TARGET}: {'met' if ratio <= TARGET else 'missed'}); "
              f"hit rate {stats[name]['hit_rate']:.1%} on the held-out prompts")
    print(f"cache: {stats['cache']['phrases']} phrases in {result['cache_mb']} MiB (budget {args.cache_mb} MiB) after "
          f"{len(warmup)} warm-up prompts")
    if "store" in stats:
        print(f"store: {stats['store']['phrases']} phrases, {stats['store']['resident_bytes'] / 2**20:.1f} MiB in memory, "
              f"{stats['store']['disk_bytes'] / 2**20:.0f} MiB on disk (memory-mapped)")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
