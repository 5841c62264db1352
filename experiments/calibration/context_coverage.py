"""How often does a text's last n tokens stand somewhere in the documents retrieved for its prompt? (#32, a probe)

The context gate lets a phrase win only where the last ``n`` tokens of the text so far stood before it in a retrieved
document. Under teacher forcing the reference keeps to its domain's wording; a generated text may leave it. This
reads an evaluation's ``generations.jsonl`` and, for the reference and for each system's continuation, counts the
positions whose last ``n`` tokens (prompt included) are an ``n``-gram of the prompt's top-32 documents. It also
counts each system's continuations that equal its matched bare LM's (``bare``, or ``bare:no_repeat=N`` for a system
with ``no_repeat=N``) letter for letter, and those that only run past its end (the same text, then more).

    python experiments/calibration/context_coverage.py --run results/licenses/matched --data licenses
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from tqdm.auto import tqdm
from transformers import AutoTokenizer

from dynvocab.data.assets import resolve_model
from retrieval.loading import demo_index


def covered(ids: list[int], start: int, grams: set[tuple[int, ...]], n: int) -> tuple[int, int]:
    """(positions from ``start`` on whose last ``n`` tokens are in ``grams``, positions from ``start`` on)."""
    positions = range(max(start, n), len(ids))
    return sum(tuple(ids[t - n : t]) in grams for t in positions), len(positions)


def matched_bare(system: str) -> str:
    """The bare LM with the same ``no_repeat`` setting as ``system``."""
    found = re.search(r"no_repeat=\d+", system)
    return f"bare:{found.group()}" if found else "bare"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="an evaluation folder with generations.jsonl")
    parser.add_argument("--data", default="wikipedia", choices=("wikipedia", "licenses"))
    parser.add_argument("--context-tokens", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=32)
    args = parser.parse_args()
    n = args.context_tokens
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2"))
    index = demo_index(Path(".cache/demo"), args.data)
    rows = [json.loads(line) for line in Path(args.run, "generations.jsonl").read_text().splitlines()]
    texts = {(row["id"], row["system"]): row["text"] for row in rows}
    references = {row["id"]: {"id": row["id"], "prompt": row["prompt"], "system": "(reference)", "text": row["reference"]}
                  for row in rows}
    prompts = {}  # id -> (prompt ids, n-grams of its documents)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # covered, positions, equal, run past
    for row in tqdm([*references.values(), *rows], desc="texts"):
        if row["id"] not in prompts:
            documents = index.search_documents([row["prompt"]], k=args.top_k)[0]
            grams = {tuple(ids[i : i + n]) for ids in tokenizer([d["text"] for d in documents],
                                                                 add_special_tokens=False).input_ids
                     for i in range(len(ids) - n + 1)}
            prompts[row["id"]] = tokenizer(row["prompt"]).input_ids, grams
        prompt, grams = prompts[row["id"]]
        tally = counts[row["system"]]
        hit, total = covered(prompt + tokenizer(row["text"], add_special_tokens=False).input_ids, len(prompt), grams, n)
        tally[0] += hit
        tally[1] += total
        bare = texts.get((row["id"], matched_bare(row["system"])))
        if bare is not None:
            tally[2] += row["text"] == bare
            tally[3] += row["text"] != bare and row["text"].startswith(bare)
    print(f"| text | positions whose last {n} tokens stand in the top-{args.top_k} documents | "
          "equal to the matched bare LM's | the same, run past its end |\n|---|---|---|---|")
    for name, (hit, total, equal, past) in counts.items():
        print(f"| {name} | {100 * hit / total:.1f}% of {total} | {equal} | {past} |")


if __name__ == "__main__":
    main()
