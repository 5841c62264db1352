import pytest

from dynvocab.data import corpora
from dynvocab.data.corpora import fanoutqa_subquestions, split_documents


def test_split_is_deterministic_and_disjoint():
    documents = [{"id": str(i)} for i in range(40)]
    train, held_out = split_documents(documents, held_out=0.25, seed=3)
    assert len(held_out) == 10 and len(train) == 30
    assert not {d["id"] for d in train} & {d["id"] for d in held_out}
    assert split_documents(documents, held_out=0.25, seed=3) == (train, held_out)


def test_fanoutqa_subquestions_keep_those_whose_evidence_is_a_lead(monkeypatch):
    dev = [
        {
            "id": "top",
            "question": "Q?",
            "answer": {"A": 1},
            "evidence": None,
            "decomposition": [
                {"id": "s1", "question": "In lead?", "answer": [3, "x"], "evidence": {"title": "Lead"}, "decomposition": []},
                {"id": "s2", "question": "Not a lead?", "answer": True, "evidence": {"title": "Other"}, "decomposition": []},
                {"id": "s3", "question": "Yes?", "answer": False, "evidence": {"title": "Lead"}, "decomposition": []},
            ],
        }
    ]
    monkeypatch.setattr(corpora, "fanoutqa_dev", lambda: dev)
    monkeypatch.setattr(corpora, "wikipedia_leads", lambda: [{"id": "Lead", "title": "Lead", "text": "t"}])
    found = fanoutqa_subquestions()
    assert [(q["id"], q["answers"], q["title"]) for q in found] == [("s1", ["3", "x"], "Lead"), ("s3", ["no"], "Lead")]


@pytest.mark.slow
def test_fanoutqa_subquestions_on_the_real_files():
    found = fanoutqa_subquestions()
    assert len(found) == 558 and len({q["title"] for q in found}) == 312
