"""What the committed FanOutQA answers show beyond the report's columns, read from `generations.jsonl`. No generation.

Per system: how many answers took no phrase step and how many of those equal the same-k bare answer word for word;
the share of its cited documents at each rank; how many answers copy the one-shot example's "Seine"; and the phrase
citations over all systems (each one placed from a phrase's source). Reads `results/qa/fanoutqa/generations.jsonl`; its
output is `results/qa/fanoutqa/answer_reading.log`.

    python experiments/qa/answer_reading.py > results/qa/fanoutqa/answer_reading.log
"""
import argparse
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results/qa/fanoutqa"


def bare_of(system: str) -> str:
    return "bare@" + system.partition("@")[2]


def answer_reading(results_dir: Path = RESULTS) -> None:
    records = [json.loads(line) for line in (results_dir / "generations.jsonl").read_text().splitlines()]
    answers = {(r["system"], r["id"]): r["answer"] for r in records}
    systems = list(dict.fromkeys(r["system"] for r in records))
    for system in systems:
        mine = [r for r in records if r["system"] == system]
        no_phrase = [r for r in mine if r["phrase_steps"] == 0]
        same = sum(r["answer"] == answers[(bare_of(system), r["id"])] for r in no_phrase)
        cited = Counter(n for r in mine for n in r["cited"])
        shares = " ".join(f"[{n}] {100 * cited[n] / max(1, sum(cited.values())):.0f}%" for n in sorted(cited))
        seine = sum("Seine" in r["answer"] for r in mine)
        print(f"{system:22s} no phrase step {len(no_phrase):3d} (equal to {bare_of(system)}: {same:3d})  "
              f"cited by rank {shares:34s} 'Seine' {seine}")
    phrase_citations = sum(c["origin"] == "phrase" for r in records for c in r["citations"])
    print(f"phrase-placed citations, all systems: {phrase_citations}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="the eval-qa output folder read (generations.jsonl)")
    args = parser.parse_args(argv)
    answer_reading(args.results_dir)


if __name__ == "__main__":
    main()
