"""How much of each held-out reference a system's continuation writes: ROUGE-L and the common prefix (#32).

On a domain whose documents hold the text (licences), a phrase rule that knows when a phrase fits writes the
domain's own wording: the continuation follows the reference further than the bare LM's does. MAUVE cannot show
this on 28 texts; this reads it off the generations of a ``dynvocab eval`` run.

    python experiments/calibration/reference_overlap.py --run results/licenses/state-gate --output overlap.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from evals.qa.metrics import rouge_l


def common_prefix(text: str, reference: str) -> int:
    """Characters ``text`` and ``reference`` share from their start."""
    return len(os.path.commonprefix([text, reference]))


def overlap_rows(generations: list[dict]) -> list[dict]:
    """Per system, in the run's order: mean ROUGE-L F (x100) and common prefix against the reference, steps."""
    systems = list(dict.fromkeys(row["system"] for row in generations))
    rows = []
    for system in systems:
        mine = [row for row in generations if row["system"] == system]
        rows.append({
            "system": system, "texts": len(mine),
            "rouge_l": 100 * statistics.mean(rouge_l(row["text"], [row["reference"]]) for row in mine),
            "prefix_chars": statistics.mean(common_prefix(row["text"], row["reference"]) for row in mine),
            "prefix_median": statistics.median(common_prefix(row["text"], row["reference"]) for row in mine),
            "steps": sum(row["steps"] for row in mine), "phrase_steps": sum(row["phrase_steps"] for row in mine),
        })
    return rows


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a `dynvocab eval` output folder (its generations.jsonl)")
    parser.add_argument("--output", help="also write the table here")
    args = parser.parse_args(argv)
    lines = Path(args.run, "generations.jsonl").read_text(encoding="utf-8").splitlines()
    rows = overlap_rows([json.loads(line) for line in lines if line.strip()])
    table = ["| system | texts | ROUGE-L F against the reference | common prefix, chars (mean / median) | steps | "
             "phrase steps |", "|---|---|---|---|---|---|"]
    table += [f"| {r['system']} | {r['texts']} | {r['rouge_l']:.1f} | {r['prefix_chars']:.1f} / "
              f"{r['prefix_median']:.0f} | {r['steps']} | {r['phrase_steps']} "
              f"({100 * r['phrase_steps'] / max(r['steps'], 1):.1f}%) |" for r in rows]
    text = "\n".join(table)
    print(text)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    return text


if __name__ == "__main__":
    main()
