"""Grounded decoding in one batch against the same prompts one at a time: time per character and whether each row
writes what it writes alone.

Held-out prompts of a corpus, their top documents from the corpus's training part (the eval's index), SmolLM2-135M,
greedy, `no_repeat_ngram_size=4` over the continuation, the pipeline's grounded defaults (drafts from suffix matches;
`--encoder shipped` lets the shipped phrase encoder propose too). Each round times the prompts one at a time and then
in one batch (`PhrasePipeline.batch`, `generate_verified_batch`), in turn, so a machine that speeds up or slows down
shifts both; the retrieval is the same in both and counted in both.

    python experiments/grounded/batch_speed.py --data licensedb --prompts 8 --gammas 1,0.05 --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from dynvocab import DynamicVocabLM
from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm, load_lm
from evals.protocol import EvalConfig, held_out_prompts
from retrieval.config import PipelineConfig
from retrieval.loading import demo_index
from retrieval.pipeline import PhrasePipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="licensedb", help="a corpus with a held-out part (wikipedia, licensedb, ...)")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts, decoded as one batch")
    parser.add_argument("--gammas", default="1,0.05", help="grounded rules to time, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds after a warm-up")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens at most per prompt")
    parser.add_argument("--encoder", choices=["none", "shipped"], default="none",
                        help="drafts from suffix matches only, or the shipped phrase encoder's phrases too")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.encoder == "shipped":
        model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    else:
        lm, tokenizer = load_lm("smollm2")
        model = DynamicVocabLM.from_causal_lm(lm, tokenizer).eval()
    items = held_out_prompts(model.tokenizer, EvalConfig(data=args.data, num_prompts=args.prompts))
    prompts = [item["prompt"] for item in items]
    index = demo_index(Path(".cache/demo"), args.data)  # the eval's index of the corpus's training part
    print(f"{len(prompts)} held-out {args.data} prompts, {args.tokens} new tokens at most, {args.rounds} rounds, "
          f"{torch.get_num_threads()} threads, phrases: {args.encoder}")
    for gamma in (float(g) for g in args.gammas.split(",")):
        config = PipelineConfig(max_new_tokens=args.tokens, gamma=gamma, no_repeat_ngram_size=4,
                                **({} if args.encoder == "shipped" else {"max_phrases": 0}))
        pipeline = PhrasePipeline(model, index, config)
        alone_seconds, batch_seconds = [], []
        for round_number in range(args.rounds + 1):  # the first round warms up
            start = time.perf_counter()
            alone = [pipeline.batch([prompt])[0] for prompt in prompts]
            middle = time.perf_counter()
            together = pipeline.batch(prompts)
            end = time.perf_counter()
            if round_number:
                alone_seconds.append(middle - start)
                batch_seconds.append(end - middle)
        same = sum(a.text == b.text for a, b in zip(alone, together))
        characters = sum(len(r.text) for r in alone), sum(len(r.text) for r in together)
        per_alone = statistics.median(alone_seconds) / characters[0] * 1e3
        per_batch = statistics.median(batch_seconds) / characters[1] * 1e3
        print(f"gamma {gamma:g}: one at a time {per_alone:.2f} ms/char, one batch of {len(prompts)} "
              f"{per_batch:.2f} ms/char: {per_batch / per_alone:.2f}x; the same text {same}/{len(prompts)}; "
              f"LM calls a prompt {statistics.mean(r.steps for r in alone):.1f} alone, "
              f"{statistics.mean(r.steps for r in together):.1f} batched")
        for a, b in zip(alone, together):
            if a.text != b.text:
                print(f"  differs after {_common(a.text, b.text)} characters: alone {a.text[:120]!r}\n"
                      f"  {'':>24}batched {b.text[:120]!r}")


def _common(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


if __name__ == "__main__":
    main()
