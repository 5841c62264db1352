"""Retriever training and test pairs built from a corpus itself (no labelled queries).

Training pairs are inverse-cloze pairs (a sentence and the rest of its document) and title pairs (a
title and its lead). Test queries are held-out sentences of held-out documents: the sentence is cut
out of the document that gets indexed, so a retriever must find the document from its context.
"""

from __future__ import annotations

import random
import re

__all__ = ["Pair", "held_out_queries", "split_sentences", "training_pairs"]

Pair = tuple[str, str, str]  # (query, positive text, positive document id)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
#: sentences shorter than this many words make poor queries
MIN_QUERY_WORDS = 5


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (split after ., ! or ? before an upper-case letter or digit)."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def _cut(documents: list[dict], rng: random.Random) -> list[tuple[dict, str, str]]:
    """(document, one of its sentences, the document without it) for documents of at least 3 sentences."""
    cuts = []
    for document in documents:
        sentences = split_sentences(document["text"])
        usable = [i for i, s in enumerate(sentences) if len(s.split()) >= MIN_QUERY_WORDS]
        if len(sentences) < 3 or not usable:
            continue
        chosen = rng.choice(usable)
        cuts.append((document, sentences[chosen], " ".join(s for i, s in enumerate(sentences) if i != chosen)))
    return cuts


def training_pairs(documents: list[dict], seed: int = 0, titles: bool = True) -> list[Pair]:
    """One inverse-cloze pair per document of >= 3 sentences, plus (title, document) pairs; shuffled by ``seed``."""
    if not isinstance(documents, list) or not all(isinstance(d, dict) and "text" in d for d in documents):
        raise TypeError("documents must be a list of {'id', 'title', 'text'} dicts (see retrieval.load_documents)")
    rng = random.Random(seed)
    pairs: list[Pair] = [(sentence, rest, document["id"]) for document, sentence, rest in _cut(documents, rng)]
    if titles:
        pairs += [(d["title"], d["text"], d["id"]) for d in documents if d.get("title") and d["title"] != d["text"]]
    rng.shuffle(pairs)
    return pairs


def held_out_queries(documents: list[dict], seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Queries from held-out documents: ``(queries [{"id", "question", "title"}], documents with the sentence cut)``.

    ``title`` is the id of the relevant document; documents too short to cut keep their text and give no query.
    """
    rng = random.Random(seed)
    cut = {document["id"]: (sentence, rest) for document, sentence, rest in _cut(documents, rng)}
    queries = [{"id": f"heldout-{i}", "question": cut[d["id"]][0], "title": d["id"]}
               for i, d in enumerate(documents) if d["id"] in cut]
    indexed = [{**d, "text": cut[d["id"]][1]} if d["id"] in cut else d for d in documents]
    return queries, indexed
