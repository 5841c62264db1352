"""What share of a grounded prompt's time the documents' prefill takes: the measure a store of the documents' KV
states (TurboRAG, RAGCache) would have to beat, and that store's size.

For each report, the document tokens its grounded prompts read are estimated from its settings
(``rag_documents`` documents of its corpus's indexed part, each cut to ``rag_document_tokens``: the mean of the cut
lengths, times the documents read). Times SmolLM2's forward over that many tokens, the prompt after them and its
decoding calls (one token, and a token with an 8-token draft), then weighs them by the LM calls a grounded prompt
made in the report's generations.

    python experiments/grounded/prefill_share.py results/grounded/wikipedia results/grounded/licenses
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from dynvocab.data.corpora import corpus_split
from dynvocab.decoding.verification import forward_seconds
from dynvocab.loading import load_lm
from dynvocab.states.kv import DocumentKV


def read_tokens(tokenizer, corpus: str, documents: int, budget: int) -> tuple[int, int]:
    """(document tokens a prompt reads on average, tokens of the whole indexed part cut to ``budget``)."""
    lengths = [min(len(ids), budget) + 2 for ids in  # + the blank line after each document
               tokenizer([d["text"] for d in corpus_split(corpus)[0]], add_special_tokens=False).input_ids]
    return round(documents * statistics.mean(lengths)), sum(lengths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="eval output folders with generations.jsonl and eval_config.json")
    parser.add_argument("--prompt", type=int, default=40, help="prompt tokens")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm, tokenizer = load_lm("smollm2")
    kv_bytes = DocumentKV(lm).dim * 4  # float32 keys and values of every layer, a token
    for folder in map(Path, args.reports):
        config = json.loads((folder / "eval_config.json").read_text())
        context, stored = read_tokens(tokenizer, config["data"], config["rag_documents"], config["rag_document_tokens"])
        with torch.no_grad():
            prefill = forward_seconds(lm, [context], context_tokens=1, repeats=5)[context]
            prompt = forward_seconds(lm, [args.prompt], context_tokens=context, repeats=5)[args.prompt]
            step = forward_seconds(lm, [1, 9], context_tokens=context + args.prompt + 32, repeats=9)
        print(f"{folder}: {config['rag_documents']} {config['data']} documents read, {context} tokens on average: "
              f"{prefill * 1e3:.0f} ms; the prompt after them ({args.prompt}): {prompt * 1e3:.0f} ms; a decoding "
              f"call: {step[1] * 1e3:.1f} ms, with an 8-token draft {step[9] * 1e3:.1f} ms ({step[9] / step[1]:.2f}x); "
              f"a float32 store of every indexed document: {stored:,} tokens, {stored * kv_bytes / 1e9:.1f} GB")
        rows = [json.loads(line) for line in (folder / "generations.jsonl").open()]
        for system in dict.fromkeys(r["system"] for r in rows if r["system"].startswith("grounded")):
            calls = statistics.mean(r["steps"] for r in rows if r["system"] == system)
            drafted = calls * step[9]  # an upper bound: every call with a full draft
            print(f"  {system}: {calls:.1f} LM calls a prompt; the documents' prefill is "
                  f"{prefill / (prefill + prompt + drafted):.1%} to {prefill / (prefill + prompt + calls * step[1]):.1%} "
                  "of its LM time")


if __name__ == "__main__":
    main()
