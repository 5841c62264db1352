"""Does a phrase fit where the text so far ends as the phrase's left context in its document? (#32, a probe)

The phrase head scores a phrase by one context-free vector against the LM's state, and the calibration report shows
that it does not know when a phrase fits. This probe asks whether the retrieved documents themselves know: at each
teacher-forced position of a held-out lead, a plugged-in phrase is *proposed* when the last ``n`` tokens of the text
so far are the ``n`` tokens before that phrase somewhere in the retrieved documents (the rule of prompt-lookup
decoding and of copy mechanisms), the shortest (or longest) such phrase. It reports, as the calibration report does, how
often a proposal is made, how often it spells the reference (precision), how many fitting positions it finds
(recall), and next-item accuracy when the proposal replaces the LM's top token, against the LM alone; optionally
only where the proposal's first token is in the LM's top k (the pipeline's agreement rule).

    python experiments/calibration/copy_rule.py --num-prompts 200 --output results/calibration/copy-rule/results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
from evals.protocol import EvalConfig, held_out_prompts
from retrieval.config import PipelineConfig
from retrieval.loading import demo_index
from retrieval.pipeline import PhrasePipeline

CONTEXTS = (1, 2, 3, 4)
AGREEMENTS = (0, 3, 1)


def left_contexts(documents: list[dict], tokenizer, phrases: set[tuple[int, ...]], n: int,
                  longest: bool) -> dict[tuple, tuple]:
    """``{n tokens: the longest (or shortest) plugged-in phrase that follows them in some document}``."""
    following: dict[tuple, tuple] = {}
    lengths = range(8, 1, -1) if longest else range(2, 9)
    for document in documents:
        ids = tokenizer(document["text"], add_special_tokens=False).input_ids
        for start in range(n, len(ids)):
            for length in lengths:
                span = tuple(ids[start : start + length])
                if len(span) == length and span in phrases:
                    context = tuple(ids[start - n : start])
                    known = following.get(context)
                    if known is None or (len(span) > len(known) if longest else len(span) < len(known)):
                        following[context] = span
                    break
    return following


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--checkpoint", default=str(SHIPPED_ENCODER), help="only the tokenizer and LM are used")
    parser.add_argument("--choose", default="shortest", choices=["shortest", "longest"],
                        help="which of the phrases that follow a context is proposed")
    parser.add_argument("--output", help="write the figures as JSON here")
    args = parser.parse_args(argv)

    model = load_dynamic_lm("smollm2", args.checkpoint)
    tokenizer = model.tokenizer
    prompts = held_out_prompts(tokenizer, EvalConfig(model="smollm2", num_prompts=args.num_prompts))
    pipeline = PhrasePipeline(model, demo_index(Path(".cache/demo"), "wikipedia"), PipelineConfig())
    counts = defaultdict(int)
    for item in tqdm(prompts, desc="leads"):
        documents = pipeline.index.search_documents([item["prompt"]], k=pipeline.config.top_k)[0]
        phrases = pipeline.candidates(documents)
        plugged = {tuple(ids) for ids in tokenizer([p.text for p in phrases], add_special_tokens=False).input_ids}
        prompt_ids = tokenizer(item["prompt"]).input_ids
        reference = tokenizer(item["reference"], add_special_tokens=False).input_ids
        with torch.no_grad():
            logits = model.lm(input_ids=torch.tensor([prompt_ids + reference])).logits[0, len(prompt_ids) - 1 : -1]
        top = logits.topk(max(AGREEMENTS), dim=-1).indices.tolist()
        sequence = prompt_ids + reference
        fits = [any(tuple(reference[t : t + k]) in plugged for k in range(2, 9)) for t in range(len(reference))]
        counts["positions"] += len(reference)
        counts["fits"] += sum(fits)
        counts["token_right"] += sum(top[t][0] == reference[t] for t in range(len(reference)))
        for n in CONTEXTS:
            following = left_contexts(documents, tokenizer, plugged, n, args.choose == "longest")
            for t in range(len(reference)):
                proposal = following.get(tuple(sequence[len(prompt_ids) + t - n : len(prompt_ids) + t]))
                right = proposal is not None and tuple(reference[t : t + len(proposal)]) == proposal
                for k in AGREEMENTS:
                    wins = proposal is not None and (not k or proposal[0] in top[t][:k])
                    counts[f"n{n}/k{k}/wins"] += wins
                    counts[f"n{n}/k{k}/fitting_wins"] += wins and right
                    counts[f"n{n}/k{k}/correct"] += right if wins else top[t][0] == reference[t]
    rows = []
    for n in CONTEXTS:
        for k in AGREEMENTS:
            wins, fitting, correct = (counts[f"n{n}/k{k}/{name}"] for name in ("wins", "fitting_wins", "correct"))
            rows.append({"context_tokens": n, "agreement_top_k": k, "win_rate": wins / counts["positions"],
                         "precision": fitting / wins if wins else 0.0, "recall": fitting / counts["fits"],
                         "accuracy": correct / counts["positions"]})
    result = {"command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
              "choose": args.choose, "prompts": len(prompts), "positions": counts["positions"], "fit_rate": counts["fits"] / counts["positions"],
              "accuracy_phrases_off": counts["token_right"] / counts["positions"], "rows": rows}
    report(result, "held-out leads", ["context tokens", "agreement top k", "proposals", "precision", "recall", "accuracy"],
           lambda r: [r["context_tokens"], r["agreement_top_k"] or "off", f"{100 * r['win_rate']:.1f}%",
                      f"{100 * r['precision']:.1f}%", f"{100 * r['recall']:.1f}%", f"{100 * r['accuracy']:.1f}%"],
           args.output)
    return result


def report(result: dict, texts: str, header: list[str], cells: Callable[[dict], list], output: str | None) -> None:
    """Print a probe's summary line and its rows as a Markdown table (``cells(row)``), and write ``result`` to ``output``."""
    print(f"{result['prompts']} {texts}, {result['positions']} positions; a plugged-in phrase fits at "
          f"{100 * result['fit_rate']:.1f}%; LM top token right at {100 * result['accuracy_phrases_off']:.2f}%")
    print("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
    for row in result["rows"]:
        print("| " + " | ".join(str(cell) for cell in cells(row)) + " |")
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
