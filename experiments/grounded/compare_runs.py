"""One grounded system's records from two `dynvocab eval` runs over the same prompts, each against `bare-rag`.

    python experiments/grounded/compare_runs.py BEFORE/generations.jsonl AFTER/generations.jsonl [--system grounded]

Prints ROUGE-2 and ROUGE-L of each run's system minus `bare-rag` (taken from AFTER), and AFTER minus BEFORE, as
paired-bootstrap intervals that resample documents (each with all its windows), the cited share and LM calls of
both, and every prompt whose text changed. Used where a default changed between two runs (a rule, not a setting
that one run could hold as two systems).
"""

from __future__ import annotations

import argparse
import json
import statistics

from evals.closeness import paired_bootstrap, rouge_scores


def records(path: str, system: str) -> dict[str, dict]:
    with open(path) as lines:
        return {r["id"]: r for r in map(json.loads, lines) if r["system"] == system}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--system", default="grounded")
    args = parser.parse_args()
    base = records(args.after, "bare-rag")
    runs = {"before": records(args.before, args.system), "after": records(args.after, args.system)}
    ids = [i for i in base if all(i in run for run in runs.values())]
    groups = [base[i].get("document", i) for i in ids]
    references = [base[i]["reference"] for i in ids]
    scores = {name: rouge_scores([run[i]["text"] for i in ids], references)
              for name, run in (("bare-rag", base), *runs.items())}
    for kind in ("rouge2", "rougeL"):
        for a, b in (("before", "bare-rag"), ("after", "bare-rag"), ("after", "before")):
            d = paired_bootstrap(scores[a][kind], scores[b][kind], groups=groups)
            print(f"{kind} {a} - {b}: {d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}]")
    for name, run in runs.items():
        cited = statistics.mean(run[i]["cited_share"] for i in ids)  # as the report counts it: a mean over prompts
        print(f"{name}: cited {cited:.1%}, {statistics.mean(run[i]['steps'] for i in ids):.1f} LM calls")
    changed = [j for j, i in enumerate(ids) if runs["before"][i]["text"] != runs["after"][i]["text"]]
    print(f"{len(ids)} prompts, {len(changed)} texts changed (ROUGE-2 before -> after):")
    for j in changed:
        print(f"  {ids[j]}: {scores['before']['rouge2'][j]:.1f} -> {scores['after']['rouge2'][j]:.1f}")


if __name__ == "__main__":
    main()
