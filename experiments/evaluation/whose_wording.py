"""Whose wording each system of a LicenseDB run writes: the held-out licence's own, a twin's of its family, or a
neighbour's of another family.

Every 8-word run of a continuation (lower-cased ``\\w+`` words) is placed in the first of: the held-out licence's
own text (the whole document, not only the reference: the right licence's wording), an indexed document of the
licence's family (a twin's), an indexed document of another family only (a neighbour's: the wording of the wrong
licence), or none (the LM's own). A rule's families are those of the licence keys in its expression.

    python experiments/evaluation/whose_wording.py --run results/licenses/domain-variants
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

WORDS = 8
CLASSES = ("own licence", "its family", "another family", "nowhere")


def grams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + WORDS]) for i in range(len(words) - WORDS + 1)}


def families_of(document: dict) -> set[str]:
    from dynvocab.data.corpora import licence_family

    if document["kind"] == "license":
        return {licence_family(document["id"])}
    expression = document["metadata"].get("license_expression") or ""
    keys = set(re.findall(r"[\w.+-]+", expression)) - {"and", "or", "with", "AND", "OR", "WITH"}
    return {licence_family(key) for key in keys}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="a `dynvocab eval --data licensedb*` folder")
    args = parser.parse_args(argv)
    from dynvocab.data.corpora import corpus_split, licence_family
    from evals.protocol import read_records

    data = json.loads((args.run / "eval_config.json").read_text())["data"]
    indexed, held_out = corpus_split(data)
    own = {d["id"]: grams(d["text"]) for d in held_out}
    records = read_records(args.run / "generations.jsonl")
    wanted = set().union(*(grams(r["text"]) for r in records))
    found: dict[tuple[str, ...], set[str]] = {}
    for document in indexed:
        hits = grams(document["text"]) & wanted
        if hits:
            families = families_of(document)
            for gram in hits:
                found.setdefault(gram, set()).update(families)
    counts: dict[str, dict[str, int]] = {}
    for record in records:
        family = licence_family(record["id"])
        tally = counts.setdefault(record["system"], dict.fromkeys(CLASSES, 0))
        for gram in grams(record["text"]):
            where = found.get(gram, set())
            kind = ("own licence" if gram in own[record["id"]] else "its family" if family in where
                    else "another family" if where else "nowhere")
            tally[kind] += 1
    print(f"{args.run} ({data}, {len(records)} generations): shares of each system's {WORDS}-word runs\n")
    print("| system | " + " | ".join(CLASSES) + " | runs |\n|---" * 1 + "|---" * (len(CLASSES) + 1) + "|")
    for system, tally in counts.items():
        total = max(1, sum(tally.values()))
        print(f"| {system} | " + " | ".join(f"{100 * tally[c] / total:.1f}%" for c in CLASSES) + f" | {total} |")
    return counts


if __name__ == "__main__":
    main()
