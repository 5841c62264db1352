"""Each system of an eval-qa run against the bare LM, question by question: how many questions it cites correctly that
the bare LM does not, and the reverse; how many answers it changes (markers removed). No generation.

"Correct citation" is the report's: the answer cites at least one shown document that holds a gold answer. The report
gives its rate; this gives the paired counts behind a difference of rates (#32's QA target).

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python experiments/qa/paired_citations.py --run results/qa/state-gate/prompt-keys
"""

import argparse
import json
import re
from pathlib import Path

from evals.qa.citations import answer_support
from evals.qa.protocol import QAEvalConfig, documents_by_system, load_index, load_items, parse_qa_system
from retrieval.qa.answering import shown_document

MARKER = re.compile(r"\[\d+\]")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="an eval-qa output folder (qa_config.json, generations.jsonl)")
    parser.add_argument("--against", default="bare@3", help="the system the others are paired with")
    args = parser.parse_args(argv)
    run = Path(args.run)
    settings = json.loads((run / "qa_config.json").read_text())
    config = QAEvalConfig(**{k: v for k, v in settings.items() if k in QAEvalConfig.__dataclass_fields__})
    items = load_items(config)
    by_id = {item["id"]: item for item in items}
    records = [json.loads(line) for line in (run / "generations.jsonl").read_text().splitlines() if line.strip()]
    systems = sorted({r["system"] for r in records})
    found, _ = documents_by_system(items, [parse_qa_system(s) for s in systems], load_index(config))
    pages = {d["id"]: d for per_item in found.values() for documents in per_item for d in documents}
    correct, answers = {}, {}
    for r in records:
        documents = [shown_document(pages[i], config.document_words) for i in r["documents"]]
        golds = [a for group in by_id[r["id"]]["answer_groups"] for a in group]
        correct.setdefault(r["system"], {})[r["id"]] = bool(answer_support(r["cited"], documents, golds)["correct"])
        answers.setdefault(r["system"], {})[r["id"]] = MARKER.sub("", r["answer"])
    base, figures = correct[args.against], {}
    for system in systems:
        if system == args.against:
            continue
        mine = correct[system]
        figures[system] = {
            "gained": sum(mine[q] and not base[q] for q in base), "lost": sum(base[q] and not mine[q] for q in base),
            "changed": sum(answers[system][q] != answers[args.against][q] for q in base), "questions": len(base),
        }
        f = figures[system]
        print(f"{system}: correct citation +{f['gained']} -{f['lost']} questions against {args.against}; "
              f"{f['changed']} of {f['questions']} answers changed")
    return figures


if __name__ == "__main__":
    main()
