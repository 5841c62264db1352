"""How far MAUVE moves when only the human sample changes: the references of an evaluation run against disjoint
draws of other documents' references, cut the same way, beside the run's systems.

The report's "human text of other documents" is one such draw. Several draws show the spread of MAUVE at the run's
size, and where the old half-against-half "ceiling" stands (the first half of the references against the second).

    python experiments/evaluation/mauve_reference_draws.py --run results/wikipedia/greedy-matched --draws 4 \\
        --systems bare,dynamic:bias=2 --output results/wikipedia/greedy-matched/reference-draws.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True,
                        help="an evaluation folder (eval_config.json, generations.jsonl)")
    parser.add_argument("--draws", type=int, default=4, help="disjoint draws of other documents' references")
    parser.add_argument("--systems", default="bare", help="the run's systems scored beside the draws, comma-separated")
    parser.add_argument("--output", type=Path, required=True, help="where the JSON figures go")
    args = parser.parse_args(argv)
    if args.draws < 1:
        parser.error(f"--draws {args.draws} must be at least 1")

    from types import SimpleNamespace

    from dynvocab.loading import load_lm
    from evals.mauve import mauve_score
    from evals.protocol import EvalConfig
    from evals.report import featurize, other_references

    config = EvalConfig(**json.loads((args.run / "eval_config.json").read_text()))
    rows = [json.loads(line) for line in (args.run / "generations.jsonl").read_text().splitlines() if line.strip()]
    first = config.system_names[0]
    ids = [row["id"] for row in rows if row["system"] == first]
    references = {row["id"]: row["reference"] for row in rows}
    lm, tokenizer = load_lm(config.model)
    scorer = SimpleNamespace(lm=lm, tokenizer=tokenizer)  # what the report's featurizer reads of its generators
    n, seeds = len(ids), range(config.mauve_seeds)

    def features(texts: list[str]) -> np.ndarray:
        return featurize(texts, config, scorer).values  # the run's own featurizer

    reference = features([references[i] for i in ids])
    others = other_references(tokenizer, config, n * args.draws)
    if len(others) < n * args.draws:
        parser.error(f"the training part has {len(others)} documents long enough, fewer than {args.draws} draws of {n}")
    other = features(others)

    def score(p: np.ndarray, q: np.ndarray) -> dict:
        result = mauve_score(p, q, seeds=seeds)
        return {"mauve": 100 * result.mauve, "std": 100 * result.mauve_std, "samples": len(q)}

    figures = {"run": str(args.run), "prompts": n, "seeds": list(seeds),
               "draws": [score(reference, other[k * n:(k + 1) * n]) for k in range(args.draws)],
               "half_against_half": score(reference[: n // 2], reference[n // 2: 2 * (n // 2)]),
               "systems": {}}
    for system in filter(None, args.systems.split(",")):
        texts = {row["id"]: row["text"] for row in rows if row["system"] == system}
        figures["systems"][system] = score(reference, features([texts[i] for i in ids]))
    draws = [d["mauve"] for d in figures["draws"]]
    figures["draws_mean"] = float(np.mean(draws))
    figures["draws_std"] = float(np.std(draws, ddof=1)) if len(draws) > 1 else 0.0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
