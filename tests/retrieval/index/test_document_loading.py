from __future__ import annotations

import json

import datasets
import pytest

from retrieval import DocumentIndex, load_documents
from tests.helpers import HashEncoder


def test_list_of_strings_gets_positional_ids():
    assert load_documents(["alpha", "beta"]) == [
        {"id": "0", "title": "", "text": "alpha"},
        {"id": "1", "title": "", "text": "beta"},
    ]


def test_dicts_with_custom_fields():
    records = [{"doc": 7, "name": "Seven", "body": "seven text"}, {"body": "no id"}]
    assert load_documents(records, text_field="body", title_field="name", id_field="doc") == [
        {"id": "7", "title": "Seven", "text": "seven text"},
        {"id": "1", "title": "", "text": "no id"},
    ]


def test_jsonl_file(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "a", "title": "A", "text": "first"}\n\n"second"\n', encoding="utf-8")
    assert load_documents(path) == [
        {"id": "a", "title": "A", "text": "first"},
        {"id": "1", "title": "", "text": "second"},
    ]
    path.write_text('{"text": "ok"}\n{"text": broken}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"corpus.jsonl:2 is not valid JSON"):
        load_documents(path)


@pytest.mark.parametrize(
    ("content", "split", "expected"),
    [
        ("one\ntwo\n\n", "auto", ["one", "two"]),
        ("first line\nstill first\n\n  \nsecond\n", "auto", ["first line\nstill first", "second"]),
        ("first line\nstill first\n\nsecond\n", "lines", ["first line", "still first", "second"]),
        ("one\ntwo\n", "paragraphs", ["one\ntwo"]),
    ],
)
def test_plain_text_file(tmp_path, content, split, expected):
    path = tmp_path / "corpus.txt"
    path.write_text(content, encoding="utf-8")
    assert [d["text"] for d in load_documents(str(path), split=split)] == expected


def test_datasets_dataset():
    dataset = datasets.Dataset.from_dict({"body": ["x one", "x two"], "title": ["One", "Two"], "id": [10, 20]})
    assert load_documents(dataset, text_field="body") == [
        {"id": "10", "title": "One", "text": "x one"},
        {"id": "20", "title": "Two", "text": "x two"},
    ]
    with pytest.raises(ValueError, match="text_field='text' is not a column"):
        load_documents(dataset)


@pytest.mark.parametrize(
    ("source", "error", "message"),
    [
        ([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], ValueError, "'a' appears twice"),
        ([{"body": "x"}], ValueError, "item 0 has no str field text_field='text'"),
        ([3], TypeError, "item 0 of source is a int"),
        (42, TypeError, "source=42 is a int"),
        ("/no/such/file.jsonl", ValueError, "does not exist"),
    ],
)
def test_bad_sources_raise(source, error, message):
    with pytest.raises(error, match=message):
        load_documents(source)


def test_bad_split_raises():
    with pytest.raises(ValueError, match="split='pages'"):
        load_documents(["x"], split="pages")


def test_index_from_a_jsonl_file(tmp_path):
    path = tmp_path / "corpus.jsonl"
    rows = [{"id": f"d{i}", "title": f"T{i}", "text": text} for i, text in enumerate(["cats and dogs", "green tea"])]
    path.write_text("\n".join(json.dumps(row) for row in rows), encoding="utf-8")
    index = DocumentIndex.build(path, HashEncoder())
    assert index.search_documents(["green tea"], k=1)[0][0]["id"] == "d1"
