"""Queries for the NAR retriever: sentence rule, held-out sentences never trained on, FanOutQA on the leads."""

import pytest

from retrieval.nar.data import fanoutqa_queries, sentences, split_queries

DOCS = [
    {"title": "Red River", "text": "The Red River is long. It flows east to the sea. Boats carry grain on it. Fish live in it too."},
    {"title": "Old Castle", "text": "The Old Castle stands on a hill. It was built in 1200 by a king."},
    {"title": "Blue Lake", "text": "Blue Lake is a lake in the north. Its water is cold all year. Many birds nest on its shore."},
]


def test_sentences_split_at_ends_and_drop_short_ones():
    assert sentences("The film is good. It won two prizes. Yes.") == ["The film is good.", "It won two prizes."]
    assert sentences("One two three four. Five six seven eight!") == ["One two three four.", "Five six seven eight!"]


def test_held_out_sentences_are_never_first_nor_trained_on():
    split = split_queries(DOCS, seed=0)
    assert split.test_documents == [0, 2]  # the two leads with three sentences or more
    for query, document in zip(split.test_queries, split.test_documents):
        assert query != sentences(DOCS[document]["text"])[0]
        assert query not in split.train_queries
    assert sorted(set(split.train_documents)) == [0, 1, 2]
    assert len(split.train_queries) == sum(len(sentences(d["text"])) for d in DOCS) - 2


@pytest.mark.slow
def test_fanoutqa_sub_questions_name_leads():
    questions, documents = fanoutqa_queries()
    assert len(questions) == 558 and len(set(documents)) == 312
