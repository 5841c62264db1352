"""Queries and docids for the NAR retriever on the embedded Wikipedia leads.

Docids are the leads' titles: unique per lead (10,033 of 10,033), short (12 characters on
average), the id FanOutQA names its evidence by, and made of the words and phrases a question
about the page uses. (Pseudo-queries would need a query generator, which is not available
offline; sentences would repeat the training queries.) Training queries are the leads' own
sentences; one sentence per lead with at least three (never its first, which usually names the
title) is held out as a test query no training pair saw.
"""

from __future__ import annotations

import random
import re

from dynvocab.data.assets import wikipedia_leads
from dynvocab.data.corpora import fanoutqa_subquestions

__all__ = ["QuerySplit", "fanoutqa_queries", "sentences", "split_queries"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def sentences(text: str, min_words: int = 4) -> list[str]:
    """The sentences of ``text`` with at least ``min_words`` words (a plain end-of-sentence rule)."""
    return [s.strip() for s in _SENTENCE_END.split(text) if len(s.split()) >= min_words]


class QuerySplit:
    """Training pairs ``(train_queries[i], train_documents[i])`` and held-out pairs, documents as lead indices."""

    def __init__(self, train_queries: list[str], train_documents: list[int], test_queries: list[str],
                 test_documents: list[int]) -> None:
        self.train_queries, self.train_documents = train_queries, train_documents
        self.test_queries, self.test_documents = test_queries, test_documents


def split_queries(documents: list[dict] | None = None, seed: int = 0, max_per_document: int = 8) -> QuerySplit:
    """Sentences of each lead as queries for it: one held out per lead with three or more, at most
    ``max_per_document`` of the rest for training."""
    documents = wikipedia_leads() if documents is None else documents
    rng = random.Random(seed)
    train_queries, train_documents, test_queries, test_documents = [], [], [], []
    for number, document in enumerate(documents):
        found = sentences(document["text"])
        if len(found) >= 3:
            held = rng.randrange(1, len(found))
            test_queries.append(found.pop(held))
            test_documents.append(number)
        for sentence in found[:max_per_document]:
            train_queries.append(sentence)
            train_documents.append(number)
    return QuerySplit(train_queries, train_documents, test_queries, test_documents)


def fanoutqa_queries(documents: list[dict] | None = None) -> tuple[list[str], list[int]]:
    """The 558 FanOutQA dev sub-questions whose evidence lead is among ``documents``, and that lead's index."""
    documents = wikipedia_leads() if documents is None else documents
    index = {document["title"]: number for number, document in enumerate(documents)}
    items = [item for item in fanoutqa_subquestions() if item["title"] in index]
    return [item["question"] for item in items], [index[item["title"]] for item in items]
