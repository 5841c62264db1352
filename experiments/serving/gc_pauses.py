"""Python's garbage collector inside requests: what a full collection costs over the loaded demo stack, before and after
``dynvocab.loading.freeze_loaded_objects`` (``gc.freeze``), and the collector's pauses during the same requests
answered each way (the demo's model, index and pipeline; the first held-out Wikipedia prompts).

    HF_HUB_OFFLINE=1 python experiments/serving/gc_pauses.py --num-prompts 40 --output runs/gc_pauses.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path


def full_collection_ms(repeats: int = 5) -> float:
    """Median ms of ``gc.collect()`` over what is tracked now."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def pauses_during(run, items: list) -> dict:
    """The collector's pauses while ``run(item)`` answers every item: how many, of which generation, and their ms."""
    pauses, started = [], []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        else:
            pauses.append((info["generation"], 1000 * (time.perf_counter() - started.pop())))

    gc.callbacks.append(watch)
    try:
        start = time.perf_counter()
        for item in items:
            run(item)
        seconds = time.perf_counter() - start
    finally:
        gc.callbacks.remove(watch)
    full = [ms for generation, ms in pauses if generation == 2]
    return {"seconds": seconds, "collections": len(pauses), "full_collections": len(full),
            "full_ms": sorted(round(ms, 1) for ms in full), "all_ms": round(sum(ms for _, ms in pauses), 1)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=8, help="decoding steps per request (the pauses come "
                        "from the stages' allocations; few steps keep the run short)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    from dynvocab.loading import SHIPPED_ENCODER, freeze_loaded_objects, load_dynamic_lm
    from evals.protocol import EvalConfig, held_out_prompts
    from retrieval.config import PipelineConfig
    from retrieval.loading import demo_index
    from retrieval.pipeline import PhrasePipeline

    model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    index = demo_index(Path(".cache/demo"))
    pipeline = PhrasePipeline(model, index, PipelineConfig(max_new_tokens=args.max_new_tokens))
    prompts = [p["prompt"] for p in held_out_prompts(model.tokenizer, EvalConfig(num_prompts=args.num_prompts))]
    figures = {"tracked_objects": len(gc.get_objects()), "full_collection_ms": full_collection_ms(),
               "requests": pauses_during(pipeline, prompts)}
    freeze_loaded_objects()
    figures["frozen"] = {"tracked_objects": len(gc.get_objects()), "full_collection_ms": full_collection_ms(),
                         "requests": pauses_during(pipeline, prompts)}
    text = json.dumps(figures, indent=2)
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n", encoding="utf-8")
    return figures


if __name__ == "__main__":
    main()
