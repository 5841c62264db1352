"""The embedded corpora (offline Wikipedia leads, licence texts) and their fixed train/held-out split.

Training, the retrieval index and the evaluation all take the same split, so the
held-out documents that ``dynvocab eval`` prompts with are never trained on or retrieved.
"""

from __future__ import annotations

import logging
import random

from .assets import fanoutqa_dev, license_texts, wikipedia_leads

__all__ = ["CORPORA", "WIKIPEDIA_HELD_OUT", "corpus_split", "fanoutqa_subquestions", "split_documents"]

logger = logging.getLogger(__name__)


def split_documents(documents: list[dict], held_out: float = 0.05, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Split documents into (train, held-out), deterministically.

    Documents are shuffled with ``random.Random(seed)``; the first ``round(held_out * n)``
    (at least one) are held out. Both lists keep the input order, so the split is the
    same on every machine.
    """
    if not 0.0 < held_out < 1.0:
        raise ValueError(f"held_out={held_out} must be a fraction in (0, 1); pass e.g. 0.05")
    order = list(range(len(documents)))
    random.Random(seed).shuffle(order)
    chosen = set(order[: max(1, round(held_out * len(documents)))])
    train = [doc for i, doc in enumerate(documents) if i not in chosen]
    heldout = [doc for i, doc in enumerate(documents) if i in chosen]
    logger.info("split: %d train and %d held-out documents", len(train), len(heldout))
    return train, heldout


#: share of the offline Wikipedia leads held out from training and from the retrieval index: a fifth leaves
#: 246 held-out leads of at least 32 + 128 SmolLM2 tokens, enough for the 200-prompt evaluation protocol
WIKIPEDIA_HELD_OUT = 0.2


#: the embedded corpora: name -> (documents, held-out share)
CORPORA = {"wikipedia": (wikipedia_leads, WIKIPEDIA_HELD_OUT), "licenses": (license_texts, 0.1)}


def corpus_split(name: str) -> tuple[list[dict], list[dict]]:
    """(indexed, held-out) documents of an embedded corpus, the same split training uses."""
    if name not in CORPORA:
        raise ValueError(f"corpus {name!r} is not embedded; choose from {sorted(CORPORA)}")
    documents, held_out = CORPORA[name]
    return split_documents(documents(), held_out)


def fanoutqa_subquestions() -> list[dict]:
    """FanOutQA dev (sub-)questions whose evidence page is one of the offline Wikipedia leads.

    Returns 558 items over 312 pages, in the published order, each
    ``{"id", "question", "answers", "title"}``: ``title`` is the evidence lead's title (its
    document id) and ``answers`` the gold answer as strings (a list answer gives one
    string per item; numbers as written by ``str``; a yes/no answer as "yes"/"no"; a
    mapping as "key: value" strings).
    """
    titles = {document["title"] for document in wikipedia_leads()}
    found: list[dict] = []

    def walk(questions: list[dict]) -> None:
        for question in questions:
            evidence = question.get("evidence") or {}
            if evidence.get("title") in titles:
                found.append(
                    {
                        "id": question["id"],
                        "question": question["question"],
                        "answers": _answer_strings(question["answer"]),
                        "title": evidence["title"],
                    }
                )
            walk(question.get("decomposition") or [])

    walk(fanoutqa_dev())
    return found


def _answer_strings(answer) -> list[str]:
    if isinstance(answer, bool):
        return ["yes" if answer else "no"]
    if isinstance(answer, list):
        return [text for item in answer for text in _answer_strings(item)]
    if isinstance(answer, dict):
        return [f"{key}: {value}" for key, value in answer.items()]
    return [str(answer)]
