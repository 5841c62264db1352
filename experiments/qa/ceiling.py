"""The ceiling of #16's correct-citation target on the offline FanOutQA set, without generating anything.

An answer carries a correct citation only if one of its documents contains a gold answer string, so the
share of questions with a gold answer among the documents shown bounds it. This prints that share for
k = 3, 5, 10 retrieved leads (the index of `dynvocab eval-qa`), with and without the evidence page forced
in (the oracle setting), for documents cut to 100 words (as shown) and whole. Its output is
`results/qa/fanoutqa/ceiling.log`; the index of every lead is built once into (or read from) `.cache/demo`.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=2 python experiments/qa/ceiling.py > results/qa/fanoutqa/ceiling.log
"""
import argparse
from pathlib import Path

from dynvocab.data.assets import wikipedia_leads
from evals.qa.citations import answer_support
from evals.qa.data import fanoutqa_items, with_documents
from retrieval.loading import leads_index
from retrieval.qa.answering import shown_document

ROOT = Path(__file__).resolve().parents[2]
WORKDIR = ROOT / ".cache/demo"


def ceiling(workdir: Path = WORKDIR) -> None:
    items = fanoutqa_items()
    index = leads_index(workdir)
    pages = {d["id"]: d for d in wikipedia_leads()} | {d["id"]: d for d in index.documents}
    for k in (3, 5, 10):
        for oracle in (False, True):
            found, rate = with_documents(items, index, k, oracle, pages)
            for words in (100, 10_000):
                n = 0
                for item, docs in zip(items, found):
                    shown = [shown_document(d, words) for d in docs]
                    golds = [a for g in item["answer_groups"] for a in g]
                    n += answer_support(range(1, len(shown) + 1), shown, golds)["correct"]
                print(f"k={k} oracle={oracle} words={words}: evidence among docs {rate:.3f}, gold in docs {n / len(items):.3f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=WORKDIR,
                        help="work folder of the leads index (wikipedia-all-index inside it, built if missing)")
    args = parser.parse_args(argv)
    ceiling(args.workdir)


if __name__ == "__main__":
    main()
