"""Can a rule that drops citations lift answer-support precision on the committed FanOutQA answers? No generation.

Answer-support precision is the share of cited documents that contain a gold answer. This re-scores the answers
in `results/qa/fanoutqa/generations.jsonl` (the systems of `results/qa/fanoutqa/results.json`) keeping only some of their citations
(all; those placed from phrases; those whose span is verbatim in the cited document; those whose span has a content
word the question does not; those citing the top retrieved document), beside the precision of citing every
document shown (what citing blindly scores). Prints per system; its output is `results/qa/fanoutqa/citation_filters.log`.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python experiments/qa/citation_filters.py > results/qa/fanoutqa/citation_filters.log
"""
import argparse
import json
import re
from pathlib import Path

from dynvocab.data.assets import wikipedia_leads
from evals.qa.citations import answer_support, exact_provenance
from evals.qa.data import fanoutqa_items
from retrieval.phrases import ENGLISH_STOPWORDS
from retrieval.qa.answering import shown_document

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results/qa/fanoutqa"
WORD = re.compile(r"\w+")


def new_content(span: str, question: str) -> bool:
    asked = {w.lower() for w in WORD.findall(question)}
    return any(w.lower() not in ENGLISH_STOPWORDS and w.lower() not in asked for w in WORD.findall(span))


RULES = {
    "every citation": lambda c, r, docs: True,
    "placed from phrases": lambda c, r, docs: c["origin"] == "phrase",
    "span verbatim in the document": lambda c, r, docs: exact_provenance([c], docs)["exact_provenance"] == 1.0,
    "span adds a word the question lacks": lambda c, r, docs: new_content(c["span"], r["question"]),
    "document [1] only": lambda c, r, docs: c["number"] == 1,
    "every document shown (blind)": None,
}


def citation_filters(results_dir: Path = RESULTS) -> None:
    """Print each rule's precision, correct-citation rate and documents cited per answer, system by system."""
    pages = {d["id"]: d for d in wikipedia_leads()}
    items = {item["id"]: item for item in fanoutqa_items()}
    reported = json.loads((results_dir / "results.json").read_text())["systems"]  # the report's systems, all questions answered
    records = [r for r in map(json.loads, (results_dir / "generations.jsonl").read_text().splitlines()) if r["system"] in reported]
    for system in dict.fromkeys(r["system"] for r in records):
        print(system)
        for name, keep in RULES.items():
            supported = cited = correct = n = 0
            for record in (r for r in records if r["system"] == system):
                n += 1
                docs = [shown_document(pages[i], 100) for i in record["documents"]]
                golds = [a for group in items[record["id"]]["answer_groups"] for a in group]
                numbers = (range(1, len(docs) + 1) if keep is None
                           else sorted({c["number"] for c in record["citations"] if keep(c, record, docs)}))
                support = answer_support(numbers, docs, golds)
                supported, cited, correct = supported + support["supported_citations"], cited + support["citations"], correct + support["correct"]
            print(f"  {name:38s} precision {100 * supported / max(cited, 1):5.1f}%  correct citation {100 * correct / n:5.1f}%"
                  f"  documents cited per answer {cited / n:.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-dir", type=Path, default=RESULTS,
                        help="the eval-qa output folder read (results.json, generations.jsonl)")
    args = parser.parse_args(argv)
    citation_filters(args.results_dir)


if __name__ == "__main__":
    main()
