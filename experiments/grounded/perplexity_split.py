"""Where a grounded system's perplexity under the bare LM comes from: the texts, and the tokens copied from the
documents it read against the rest.

    python experiments/grounded/perplexity_split.py results/grounded/wikipedia-fill --system grounded

Scores every text of ``--system`` and ``--against`` (a report's ``generations.jsonl``) under the bare LM given its
prompt, as the report's perplexity does, and splits the nats: by text (how much of the ratio the texts with the
largest excess carry), and by token, into the tokens inside spans cited from the read documents (``cite``, found
again with the report's retriever and settings) and the others.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from dynvocab.decoding.citations import cite
from dynvocab.loading import load_lm
from evals.perplexity import token_logprobs
from retrieval.loading import demo_index


def cited_mask(text: str, documents: list[str], tokenizer, cite_tokens: int) -> np.ndarray:
    """``(T,)`` bool over ``text``'s tokens: whether a token lies inside a span cited from ``documents``."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = cite(encoded.input_ids, documents, tokenizer, cite_tokens)
    decoded = tokenizer.decode(encoded.input_ids)
    if decoded != text:  # cite's offsets are of the decoded text: use them only where it is the text
        return np.zeros(len(encoded.input_ids), dtype=bool)
    return np.array([any(s.start <= start and end <= s.end for s in spans) for start, end in encoded.offset_mapping])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="an eval output folder with generations.jsonl and eval_config.json")
    parser.add_argument("--system", default="grounded")
    parser.add_argument("--against", default="bare-rag")
    parser.add_argument("--top", type=int, default=10, help="texts with the largest excess to leave out")
    args = parser.parse_args()
    config = json.loads((args.report / "eval_config.json").read_text())
    records = [json.loads(line) for line in (args.report / "generations.jsonl").open()]
    lm, tokenizer = load_lm(config["model"])
    index = demo_index(Path(".cache/demo"), config["data"], config["encoder"])
    nats, tokens, copied = {}, {}, {}
    for system in (args.against, args.system):
        rows = sorted((r for r in records if r["system"] == system), key=lambda r: r["id"])
        logprobs = token_logprobs(lm, tokenizer, [r["text"] for r in rows], prefixes=[r["prompt"] for r in rows],
                                  show_progress_bar=True)
        nats[system] = np.array([-lp.sum() for lp in logprobs])
        tokens[system] = np.array([len(lp) for lp in logprobs])
        read = index.search_documents([r["prompt"] for r in rows], k=config["rag_documents"])
        masks = [cited_mask(r["text"], [d["text"] for d in found], tokenizer, config["cite_tokens"])
                 for r, found in zip(rows, read)]
        aligned = [(lp, m) for lp, m in zip(logprobs, masks) if len(m) == len(lp)]  # the same tokens scored
        copied[system] = (sum(-lp[m].sum() for lp, m in aligned), sum(int(m.sum()) for _, m in aligned),
                          sum(-lp.sum() for lp, _ in aligned), sum(len(lp) for lp, _ in aligned), len(aligned))
    ppl = {s: math.exp(nats[s].sum() / tokens[s].sum()) for s in nats}
    print(f"{args.system} {ppl[args.system]:.3f} against {args.against} {ppl[args.against]:.3f}: "
          f"{ppl[args.system] / ppl[args.against]:.3f}x over {len(nats[args.system])} texts")
    excess = nats[args.system] / tokens[args.system] - nats[args.against] / tokens[args.against]
    order = np.argsort(-excess)
    for top in (1, 5, args.top, 2 * args.top):
        keep = order[top:]
        ratio = math.exp(nats[args.system][keep].sum() / tokens[args.system][keep].sum()
                         - nats[args.against][keep].sum() / tokens[args.against][keep].sum())
        print(f"  without the {top} texts of largest excess (nats a token): {ratio:.3f}x")
    ids = sorted(r["id"] for r in records if r["system"] == args.system)
    print("  largest excess: " + ", ".join(f"{ids[i]} (+{excess[i]:.2f})" for i in order[:5]))
    for system in (args.against, args.system):
        n, t, all_n, all_t, texts = copied[system]
        rest_n, rest_t = all_n - n, all_t - t
        print(f"  {system} ({texts} texts whose tokens align): {t} of {all_t} tokens cited ({t / all_t:.1%}), "
              f"{n / max(t, 1):.2f} nats a cited token, {rest_n / rest_t:.2f} a token elsewhere; perplexity of the "
              f"uncited tokens alone {math.exp(rest_n / rest_t):.3f}")


if __name__ == "__main__":
    main()
