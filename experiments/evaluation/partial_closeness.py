"""ROUGE of the systems a ``dynvocab eval`` run has written, with paired-bootstrap intervals between any two: before
an unfinished run writes its report, or for pairs the report does not give (each system against the fine-tuned LM).
The same functions the report uses (``evals.closeness``), over the prompts every system has written, in id order.

    python experiments/evaluation/partial_closeness.py --run results/licenses/domain-variants \\
        --pairs "grounded vs bare:lm=runs/lm-licensedb/final,bare-rag vs bare:lm=runs/lm-licensedb/final"
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="an evaluation folder (generations.jsonl)")
    parser.add_argument("--pairs", default="", help="comma-separated 'A vs B' pairs of systems: A's ROUGE-L and "
                                                    "ROUGE-2 minus B's, paired by prompt")
    args = parser.parse_args(argv)
    from evals.closeness import paired_bootstrap, rouge_scores
    from evals.protocol import read_records

    by_system: dict[str, dict[str, dict]] = {}
    for record in read_records(args.run / "generations.jsonl"):
        by_system.setdefault(record["system"], {})[record["id"]] = record
    prompts = sorted(set.intersection(*(set(rows) for rows in by_system.values())))
    scores = {system: rouge_scores([rows[i]["text"] for i in prompts], [rows[i]["reference"] for i in prompts])
              for system, rows in by_system.items()}
    figures = {"prompts": len(prompts), "systems": {system: {kind: sum(v) / len(v) for kind, v in s.items()}
                                                    for system, s in scores.items()}, "pairs": {}}
    for system, means in figures["systems"].items():
        print(f"{system}: " + ", ".join(f"{kind} {value:.2f}" for kind, value in means.items()))
    for pair in filter(None, args.pairs.split(",")):
        a, _, b = (name.strip() for name in pair.partition(" vs "))
        for kind in ("rougeL", "rouge2"):
            difference = paired_bootstrap(scores[a][kind], scores[b][kind])
            figures["pairs"][f"{a} vs {b} {kind}"] = asdict(difference)
            print(f"{a} - {b} {kind}: {difference.mean:+.2f} [{difference.low:+.2f}, {difference.high:+.2f}]")
    print(f"over {len(prompts)} prompts every system has written")
    return figures


if __name__ == "__main__":
    main()
