"""Where each system's time goes on development prompts: LM calls, tokens read a call, the decoder stack's time a
call by how many tokens it reads, the documents' prefill, and everything outside the stack (the output layer,
phrase scoring, the safeguards, retrieval and phrase cutting); and whether a system's texts are its base's.

    python experiments/grounded/call_cost.py --systems grounded,grounded:fill=0 --num_prompts 6

Generates each system through ``dynvocab eval``'s generators (the report's settings: 2 documents of 384 tokens in
the context, ``no_repeat_ngram_size=4``, greedy) on the held-out Wikipedia leads after the first ``--skip_prompts``,
one prompt at a time and every system in turn on it after one untimed prompt, timing every call of the LM's decoder
stack (``LlamaModel.forward``). A system ``base:option=...`` is compared with ``base``'s texts when both are run.
Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

from transformers.models.llama import modeling_llama

from evals.protocol import EvalConfig, Generators, held_out_prompts


def timed_stack(calls: list[tuple[int, float]]) -> None:
    """Record ``(tokens read, seconds)`` of every decoder-stack call into ``calls`` (a patch: nothing else changes)."""
    forward = modeling_llama.LlamaModel.forward

    def timed(self, *args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        width = ids.shape[-1] if ids is not None else kwargs["inputs_embeds"].shape[1]
        start = time.perf_counter()
        out = forward(self, *args, **kwargs)
        calls.append((width, time.perf_counter() - start))
        return out

    modeling_llama.LlamaModel.forward = timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default="bare,bare-rag-lookup,grounded,grounded-suffix")
    parser.add_argument("--num_prompts", type=int, default=6)
    parser.add_argument("--skip_prompts", type=int, default=200, help="the report's 200 prompts come first")
    parser.add_argument("--output_dir", default="/tmp/call-cost", help="eval_config.json goes there; nothing else")
    args = parser.parse_args()
    systems = args.systems.split(",")
    config = EvalConfig(data="wikipedia", systems=args.systems, skip_prompts=args.skip_prompts,
                        num_prompts=args.num_prompts + 1, latency_prompts=0, rag_documents=2, rag_document_tokens=384,
                        no_repeat_ngram_size=4, mauve_permutations=0, output_dir=args.output_dir)
    generators = Generators(config)
    warm_up, *prompts = held_out_prompts(generators.tokenizer, config)
    calls: list[tuple[int, float]] = []
    timed_stack(calls)
    for system in systems:
        generators(system, [warm_up])
    totals = {s: collections.Counter() for s in systems}
    widths = {s: collections.defaultdict(list) for s in systems}
    texts = {s: [] for s in systems}
    for prompt in prompts:
        for system in systems:
            calls.clear()
            start = time.perf_counter()
            result = generators(system, [prompt])[0]
            seconds = time.perf_counter() - start
            (prefill, prefill_seconds), decoding = calls[0], calls[1:]
            texts[system].append(result["text"])
            totals[system].update({"seconds": seconds, "chars": len(result["text"]), "calls": len(decoding),
                                   "prefill": prefill, "prefill_seconds": prefill_seconds,
                                   "stack_seconds": sum(s for _, s in decoding), "read": sum(w for w, _ in decoding)})
            for width, call_seconds in decoding:
                widths[system][min(width, 9)].append(call_seconds)
    n = len(prompts)
    for system, t in totals.items():
        calls_made = t["calls"]
        outside = t["seconds"] - t["stack_seconds"] - t["prefill_seconds"]
        print(f"{system}: {1e3 * t['seconds'] / t['chars']:.2f} ms/char, {t['chars'] / n:.0f} chars and "
              f"{calls_made / n:.1f} LM calls a prompt, {t['read'] / calls_made:.2f} tokens read a call; prefill "
              f"{t['prefill'] / n:.0f} tokens in {t['prefill_seconds'] / n:.3f} s; the stack {1e3 * t['stack_seconds'] / calls_made:.1f} "
              f"ms a call, outside it {1e3 * outside / calls_made:.1f} ms a call")
        print("  the stack's median ms by tokens read (9: 9 or more): " + ", ".join(
            f"{w}: {1e3 * statistics.median(s):.1f} ({len(s)} calls)" for w, s in sorted(widths[system].items())))
    for system in systems:
        base = system.split(":")[0]
        if base != system and base in texts:
            same = sum(a == b for a, b in zip(texts[system], texts[base]))
            print(f"{system}: {same} of {n} texts are {base}'s")


if __name__ == "__main__":
    main()
