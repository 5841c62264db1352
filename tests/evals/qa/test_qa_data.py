"""The QA question sets: an ASQA-shaped file, and the FanOutQA set with retrieved and oracle documents."""

import json

import pytest

from evals.qa.data import load_asqa, with_documents

ASQA = [
    {
        "sample_id": "-123",
        "question": "Who wrote the song?",
        "qa_pairs": [{"question": "Who wrote the lyrics?", "short_answers": ["Ada", "Ada L."]},
                     {"question": "Who wrote the music?", "short_answers": ["Bob"]}],
        "annotations": [{"long_answer": "Ada wrote the lyrics and Bob the music."}],
        "docs": [{"title": "Song", "text": "Ada wrote the lyrics."}, {"title": "Bob", "text": "Bob wrote the music."},
                 {"title": "Other", "text": "Something else."}],
    },
    {"question": "Where is it?", "qa_pairs": [{"short_answers": ["Paris"]}], "answer": "It is in Paris."},
]


@pytest.fixture
def asqa_file(tmp_path):
    path = tmp_path / "asqa_eval_gtr_top100.json"
    path.write_text(json.dumps(ASQA))
    return path


def test_an_asqa_file_loads_groups_references_and_documents(asqa_file):
    first, second = load_asqa(asqa_file, num_documents=2)
    assert first["id"] == "-123" and first["question"] == "Who wrote the song?"
    assert first["answer_groups"] == [["Ada", "Ada L."], ["Bob"]]
    assert first["references"] == ["Ada wrote the lyrics and Bob the music."]
    assert [d["title"] for d in first["documents"]] == ["Song", "Bob"]
    assert second == {"id": "1", "question": "Where is it?", "answer_groups": [["Paris"]], "references": ["It is in Paris."]}


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("{not json", "is not JSON"), ('{"question": "q"}', "not a list"), ('[{"qa_pairs": []}]', "'question'"),
     ('[{"question": "q"}]', "qa_pairs"), ('[{"question": "q", "qa_pairs": [{"short_answers": []}]}]', "short_answers"),
     ('[{"question": "q", "qa_pairs": [{"short_answers": ["a"]}], "docs": [{"title": "t"}]}]', "docs\\[0\\]")],
)
def test_a_bad_asqa_file_is_refused_with_what_is_wrong(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=fragment):
        load_asqa(path)


def test_a_missing_asqa_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no.json"):
        load_asqa(tmp_path / "no.json")


def test_retrieved_documents_and_the_oracle_setting():
    from retrieval import DocumentIndex
    from tests.helpers import HashEncoder

    pages = [{"id": t, "title": t, "text": text} for t, text in
             [("Seine", "the seine river flows through paris"), ("Loire", "the loire river is long"),
              ("Tokyo", "tokyo is a big city in japan"), ("Ada", "ada lovelace wrote programs")]]
    index = DocumentIndex.build(pages, HashEncoder(dim=1024), index_type="flat")
    items = [{"id": "1", "question": "seine river paris", "evidence": "Seine"},
             {"id": "2", "question": "tokyo big city japan", "evidence": "Ada"}]
    found, rate = with_documents(items, index, k=1)
    assert [[d["id"] for d in documents] for documents in found] == [["Seine"], ["Tokyo"]] and rate == 0.5
    oracle, rate = with_documents(items, index, k=1, oracle=True)
    assert rate == 0.5  # the share retrieval found, before the evidence was put in
    assert [[d["id"] for d in documents] for documents in oracle] == [["Seine"], ["Ada"]]
    two, _ = with_documents(items, index, k=2, oracle=True)
    assert [d["id"] for d in two[0]][0] == "Seine" and [d["id"] for d in two[1]] in (["Tokyo", "Ada"],)
    with pytest.raises(ValueError, match="not among the pages"):
        with_documents([{"id": "3", "question": "x", "evidence": "Nowhere"}], index, k=1, oracle=True)
