"""The state gate's keys from the document states kept beside the index, against keys the LM makes (#32, #33).

For each held-out prompt (the first 32 tokens of a held-out Wikipedia lead) and its top-k documents under the default
retriever, the keys of the pipeline's phrases are made three ways: by the LM reading the documents (a fresh
``DocumentStates`` with no store), again from the states it kept, and from the store (``dynvocab document-states``;
one ``DocumentStates`` that keeps nothing in memory, attached once: opening the store and hashing the LM's weights).
Reports the time of each (median per prompt), the least cosine between a key read from the store and the same key
made by the LM, and, at each threshold, how many (position, phrase) pairs the gate opens on the prompt's own tokens
with either set of keys and how many of them differ.

    python experiments/serving/state_store_probe.py --num-prompts 40 --output results/request-path/document-states/probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--thresholds", default="0.9,0.95,0.97")
    parser.add_argument("--output", help="a JSON file for the figures")
    args = parser.parse_args(argv)
    thresholds = [float(t) for t in args.thresholds.split(",")]

    from dynvocab.data.corpora import corpus_split
    from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
    from dynvocab.states.keys import StateKeys, state_keys
    from dynvocab.states.store import DocumentStates
    from retrieval.config import PipelineConfig
    from retrieval.document_states import attach_document_states, document_token_ids
    from retrieval.loading import demo_index
    from retrieval.pipeline import PhrasePipeline

    model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    index = demo_index(Path(".cache/demo"), "wikipedia")
    pipeline, tokenizer = PhrasePipeline(model, index, PipelineConfig()), model.tokenizer
    leads = [lead for lead in corpus_split("wikipedia")[1] if len(tokenizer(lead["text"]).input_ids) > 32]
    prompts = [tokenizer.decode(tokenizer(lead["text"]).input_ids[:32]) for lead in leads[: args.num_prompts]]
    seconds: dict[str, list[float]] = {"lm": [], "store": [], "kept": []}
    by_store = DocumentStates(model.lm, max_bytes=0)  # keeps nothing: every document is read from the store
    start = time.perf_counter()
    attach_document_states(by_store, index)
    attach_seconds = time.perf_counter() - start
    least, opened = 1.0, {t: [0, 0] for t in thresholds}  # threshold -> [opened with the LM's keys, differing]
    for prompt, documents in zip(prompts, index.search_documents(prompts, k=pipeline.config.top_k)):
        phrases = pipeline.candidates(documents)
        model.set_phrases(phrases, mid_sentence_forms=False)
        ids, table = document_token_ids(tokenizer, documents), model.phrase_table.token_ids
        by_lm = DocumentStates(model.lm)  # fresh: the LM reads every document, then keeps its states
        made = {}
        for name, states in (("lm", by_lm), ("kept", by_lm), ("store", by_store)):
            start = time.perf_counter()
            made[name] = state_keys(states, ids, table, thresholds[0])
            seconds[name].append(time.perf_counter() - start)
        if not torch.equal(made["lm"].phrases, made["store"].phrases):
            raise AssertionError("the store's keys belong to other phrases than the LM's")
        if len(made["lm"].phrases):
            least = min(least, float((made["lm"].keys * made["store"].keys).sum(-1).min()))
        with torch.no_grad():  # the LM's states over the prompt: where would the gate open?
            hidden = model.lm.get_decoder()(**tokenizer(prompt, return_tensors="pt")).last_hidden_state
        for threshold in thresholds:
            gates = [StateKeys(made[name].keys, made[name].phrases, threshold).open(hidden, len(table))
                     for name in ("lm", "store")]
            opened[threshold][0] += int(gates[0].sum())
            opened[threshold][1] += int((gates[0] != gates[1]).sum())
    store = by_store.stores[0]
    result = {
        "command": " ".join(["python experiments/serving/state_store_probe.py", *(sys.argv[1:] if argv is None else argv)]),
        "prompts": len(prompts), "documents_per_prompt": pipeline.config.top_k,
        "seconds_per_prompt_median": {name: statistics.median(times) for name, times in seconds.items()},
        "attach_seconds": attach_seconds,
        "least_key_cosine_store_vs_lm": least,
        "gate_on_prompt_tokens": {str(t): {"opened_by_lm_keys": o, "differing_with_store_keys": d}
                                  for t, (o, d) in opened.items()},
        "store": store.stats() | {"dtype": store.record["dtype"]},
    }
    print(json.dumps(result, indent=1))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
