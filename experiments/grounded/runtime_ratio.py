"""Does a change to how the LM runs (bfloat16, or how it attends) change how grounded decoding's speed compares with
the bare LM's and prompt lookup's?

``--compare dtype``: on a CPU with native bf16 the linear layers run packed in bf16
(``dynvocab.hardware.packed_linear``): a forward over several new tokens then costs about what one token's does, and
the documents' prefill less, which are the costs grounded decoding adds. ``--compare attention``: transformers' SDPA
(grouped key/value heads copied out to every query head in a forward over several tokens) against the loader's
``dynvocab.hardware.attention`` (the same numbers, nothing copied). This times, on each prompt in turn and in both
variants, the bare LM (``generate``), the bare LM with the top documents in its context and prompt lookup
(``prompt_lookup_num_tokens=10``), and grounded decoding with drafts from the documents and the text
(``max_phrases=0``: no phrase encoder, whose dtype is its own). Every system writes up to 128 tokens (grounded: 128 LM calls) greedily with ``no_repeat_ngram_size=4`` (for ``generate``
over the documents too); the figure is time per character, end to end.

    python experiments/grounded/runtime_ratio.py --prompts 8
    python experiments/grounded/runtime_ratio.py --prompts 8 --compare attention
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dynvocab.hardware.attention import GROUPED_SDPA
from dynvocab.hardware.packed_linear import cpu_bf16
from dynvocab.loading import freeze_loaded_objects, load_dynamic_lm
from retrieval.config import PipelineConfig
from retrieval.loading import demo_index
from retrieval.pipeline import PhrasePipeline

SYSTEMS = ("bare", "bare-rag-lookup", "grounded-suffix")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="development leads (never the reported ones)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare", choices=("dtype", "attention"), default="dtype")
    parser.add_argument("--output", help="a JSON file for every timing")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in open("results/grounded/dev/wikipedia/generations.jsonl")]
    prompts = [r["prompt"] for r in rows if r["system"] == "bare"][: args.prompts]
    index = demo_index(Path(".cache/demo"), "wikipedia", "minilm-wikipedia")
    if args.compare == "dtype":
        models = {"float32": load_dynamic_lm("smollm2", None), "bfloat16": load_dynamic_lm("smollm2", None)}
        models["bfloat16"].lm.to(torch.bfloat16)
    else:
        models = {"sdpa": load_dynamic_lm("smollm2", None), "grouped": load_dynamic_lm("smollm2", None)}
        models["sdpa"].lm.set_attn_implementation("sdpa")
        assert models["grouped"].lm.config._attn_implementation == GROUPED_SDPA
    first = next(iter(models))
    config = PipelineConfig(max_new_tokens=128, read_tokens=384, max_phrases=0, draft_step_cost=0.0)
    pipelines = {variant: PhrasePipeline(model, index, config) for variant, model in models.items()}
    freeze_loaded_objects()
    print(f"native bf16 on this CPU: {cpu_bf16()}")

    def timed(variant: str, system: str, prompt: str) -> tuple[float, int]:
        model, pipeline = models[variant], pipelines[variant]
        tokenizer = model.tokenizer
        if system == "grounded-suffix":
            start = time.perf_counter()
            text = pipeline(prompt).text
            return time.perf_counter() - start, len(text)
        start = time.perf_counter()
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        lookup = {}
        if system == "bare-rag-lookup":
            context = pipeline.context_ids(index.search_documents([prompt], k=config.top_k)[0])
            ids = torch.tensor([context + tokenizer(prompt, add_special_tokens=not context).input_ids])
            lookup = {"prompt_lookup_num_tokens": 10}
        out = model.lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=128, do_sample=False,
                                no_repeat_ngram_size=4, **lookup)
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        return time.perf_counter() - start, len(text)

    for variant in models:  # warm-up: packing, the drafter's first call
        for system in SYSTEMS:
            timed(variant, system, prompts[0])
    per_char: dict[tuple[str, str], list[float]] = {(v, s): [] for v in models for s in SYSTEMS}
    for prompt in prompts:
        for variant in models:
            for system in SYSTEMS:
                seconds, chars = timed(variant, system, prompt)
                per_char[variant, system].append(seconds / max(chars, 1))
    for variant in models:
        bare = per_char[variant, "bare"]
        for system in SYSTEMS:
            mine = per_char[variant, system]
            over_bare = statistics.median(m / b for m, b in zip(mine, bare))
            over_first = statistics.median(m / f for m, f in zip(mine, per_char[first, system]))
            print(f"{variant:9s} {system:16s} {1e3 * statistics.median(mine):6.2f} ms/char (median), "
                  f"{over_bare:.2f}x the bare LM's, {over_first:.2f}x its {first} time (per-prompt medians)")
    if args.output:
        Path(args.output).write_text(json.dumps({f"{v} {s}": t for (v, s), t in per_char.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
