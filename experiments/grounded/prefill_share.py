"""What share of a grounded prompt's time the documents' prefill takes: the measure a store of the documents' KV
states (TurboRAG, RAGCache) would have to beat.

Times SmolLM2's forward over the documents a grounded request reads (2 x 384 tokens) and its decoding calls (one
token, and a token with an 8-token draft, after that context), then weighs them by the LM calls a grounded prompt
made in a report's generations.

    python experiments/grounded/prefill_share.py results/grounded/wikipedia results/grounded/licenses
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from dynvocab.decoding.verification import forward_seconds
from dynvocab.loading import load_lm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="eval output folders with generations.jsonl")
    parser.add_argument("--context", type=int, default=768, help="document tokens read before the prompt")
    parser.add_argument("--prompt", type=int, default=40, help="prompt tokens")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm, _ = load_lm("smollm2")
    with torch.no_grad():
        prefill = forward_seconds(lm, [args.context], context_tokens=1, repeats=5)[args.context]
        prompt = forward_seconds(lm, [args.prompt], context_tokens=args.context, repeats=5)[args.prompt]
        step = forward_seconds(lm, [1, 9], context_tokens=args.context + args.prompt + 32, repeats=9)
    print(f"documents' prefill ({args.context} tokens): {prefill * 1e3:.0f} ms; the prompt after them "
          f"({args.prompt}): {prompt * 1e3:.0f} ms; a decoding call: {step[1] * 1e3:.1f} ms, with an 8-token draft "
          f"{step[9] * 1e3:.1f} ms ({step[9] / step[1]:.2f}x)")
    for folder in args.reports:
        rows = [json.loads(line) for line in (Path(folder) / "generations.jsonl").open()]
        for system in dict.fromkeys(r["system"] for r in rows if r["system"].startswith("grounded")):
            calls = statistics.mean(r["steps"] for r in rows if r["system"] == system)
            drafted = calls * step[9]  # an upper bound: every call with a full draft
            print(f"{folder} {system}: {calls:.1f} LM calls a prompt; the documents' prefill is "
                  f"{prefill / (prefill + prompt + drafted):.1%} to {prefill / (prefill + prompt + calls * step[1]):.1%} "
                  "of its LM time")


if __name__ == "__main__":
    main()
