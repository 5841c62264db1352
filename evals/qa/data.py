"""Question sets for citation-aware QA: ALCE's ASQA files (for users who have them) and the offline FanOutQA set.

Every item is ``{"id", "question", "answer_groups", "references", "documents"?, "evidence"?}``:
``answer_groups`` are lists of acceptable short answers (ASQA: one per disambiguated
sub-question; FanOutQA: one per gold answer), ``references`` the long answers ROUGE-L is
measured against, ``documents`` the given documents (ASQA files carry their retrieved ones),
``evidence`` the id of the page that holds the answer (FanOutQA).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["fanoutqa_items", "load_asqa", "with_documents"]


def load_asqa(path: str | Path, num_documents: int | None = None) -> list[dict]:
    """Items of an ALCE ASQA file (``asqa_eval_gtr_top100.json`` and the like: a JSON list).

    Each record needs ``question`` and ``qa_pairs`` (each with ``short_answers``); ``annotations``
    (``long_answer``) or ``answer`` give the references; ``docs`` (``title``, ``text``), if
    present, become the item's documents, the first ``num_documents`` of them.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ASQA file {str(path)!r} does not exist; pass the path of an ALCE ASQA JSON file")
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON ({error.msg} at line {error.lineno}); pass an ALCE ASQA JSON file") from error
    if not isinstance(records, list):
        raise ValueError(f"{path} holds a JSON {type(records).__name__}, not a list of questions; pass an ALCE ASQA file")
    return [_asqa_item(record, number, path, num_documents) for number, record in enumerate(records)]


def _asqa_item(record, number: int, path: Path, num_documents: int | None) -> dict:
    where = f"{path} item {number}"
    if not isinstance(record, dict) or not isinstance(record.get("question"), str):
        raise ValueError(f"{where} has no 'question' string; every ASQA item needs one")
    pairs = record.get("qa_pairs")
    if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"{where} has no 'qa_pairs' list; ASQA items list their disambiguated short answers there")
    groups = []
    for pair in pairs:
        answers = pair.get("short_answers") if isinstance(pair, dict) else None
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers) or not answers:
            raise ValueError(f"{where}: each qa_pairs entry needs a non-empty 'short_answers' list of strings")
        groups.append(answers)
    references = [a["long_answer"] for a in record.get("annotations") or [] if isinstance(a, dict) and a.get("long_answer")]
    if not references and isinstance(record.get("answer"), str):
        references = [record["answer"]]
    item = {"id": str(record.get("sample_id", number)), "question": record["question"], "answer_groups": groups,
            "references": references or [", ".join(group[0] for group in groups)]}
    if record.get("docs") is not None:
        docs = record["docs"][:num_documents]
        for position, doc in enumerate(docs):
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise ValueError(f"{where}: docs[{position}] needs a 'text' string")
        item["documents"] = [{"id": str(doc.get("id", doc.get("title", i))), "title": str(doc.get("title", "")),
                              "text": doc["text"]} for i, doc in enumerate(docs)]
    return item


def fanoutqa_items(limit: int | None = None) -> list[dict]:
    """The offline FanOutQA set: 558 dev (sub-)questions whose evidence page is a Wikipedia lead (312 pages)."""
    from dynvocab.data.corpora import fanoutqa_subquestions

    items = [{"id": q["id"], "question": q["question"], "answer_groups": [[a] for a in q["answers"]],
              "references": [", ".join(q["answers"])], "evidence": q["title"]} for q in fanoutqa_subquestions()]
    return items[:limit] if limit else items


def with_documents(items: list[dict], index, k: int, oracle: bool = False, pages: dict | None = None) -> tuple[list[list[dict]], float]:
    """The top-``k`` documents ``index`` retrieves for each item, and the share whose evidence page is among them.

    With ``oracle`` the evidence page (looked up in ``pages``, id -> document, default the
    index's own documents) replaces the k-th document when retrieval missed it, so it is
    always there. Items without ``evidence`` count as misses.
    """
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    found = index.search_documents([item["question"] for item in items], k=k)
    hits = [any(d["id"] == item.get("evidence") for d in documents) for item, documents in zip(items, found)]
    if oracle:
        pages = pages if pages is not None else {d["id"]: d for d in index.documents}
        for item, documents, hit in zip(items, found, hits):
            if not hit:
                if item.get("evidence") not in pages:
                    raise ValueError(f"item {item['id']}: evidence page {item.get('evidence')!r} is not among the pages; "
                                     "the oracle setting needs every evidence page")
                documents[k - 1 :] = [pages[item["evidence"]]]
    return found, (sum(hits) / len(hits) if hits else 0.0)
