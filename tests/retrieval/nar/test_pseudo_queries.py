"""Pseudo-queries, PIXAR's docids: sampled by an LM a document, written resumably, read back in order."""

import json

import pytest

from dynvocab.cli import main
from dynvocab.loading import load_lm
from retrieval.nar.pseudo_queries import clean_query, read_pseudo_queries, write_pseudo_queries

DOCUMENTS = [{"id": f"d{i}", "text": f"The town number {i} lies on a river and has {i} bridges."} for i in range(5)]


@pytest.mark.parametrize("written,query", [
    ('Query: "where is the town"\nmore text', "where is the town"),
    ("  search query - bridges over the river  ", "bridges over the river"),
    ("\n", ""),
])
def test_a_query_is_the_first_line_without_its_label_or_quotes(written, query):
    assert clean_query(written) == query


def test_a_resumed_run_writes_what_an_uninterrupted_one_writes(tiny_lm_dir, tmp_path):
    lm, tokenizer = load_lm(str(tiny_lm_dir))
    settings = dict(per_document=3, batch_size=2, max_new_tokens=6, show_progress_bar=False)
    assert write_pseudo_queries(lm, tokenizer, DOCUMENTS, tmp_path / "whole.jsonl", **settings) == 5
    write_pseudo_queries(lm, tokenizer, DOCUMENTS[:4], tmp_path / "resumed.jsonl", **settings)  # stopped after 2 batches
    with (tmp_path / "resumed.jsonl").open("a") as file:
        file.write('{"document": 4, "id": "d4", "quer')  # and killed while writing the next
    assert write_pseudo_queries(lm, tokenizer, DOCUMENTS, tmp_path / "resumed.jsonl", **settings) == 1
    assert (tmp_path / "resumed.jsonl").read_text() == (tmp_path / "whole.jsonl").read_text()
    queries = read_pseudo_queries(tmp_path / "whole.jsonl", DOCUMENTS)
    assert len(queries) == 5 and all(len(q) <= 3 and len(set(q)) == len(q) for q in queries)
    assert all(len(query.split()) >= 2 for found in queries for query in found)


def test_pseudo_queries_of_another_corpus_are_refused(tmp_path):
    path = tmp_path / "queries.jsonl"
    path.write_text(json.dumps({"document": 0, "id": "other", "queries": ["a query"]}) + "\n")
    with pytest.raises(ValueError, match=r"was written for another corpus \(document id 'other'\)"):
        read_pseudo_queries(path, DOCUMENTS)


def test_the_command_writes_every_document_once(tiny_lm_dir, tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCUMENTS))
    arguments = ["pseudo-queries", "--data", str(data), "--model", str(tiny_lm_dir), "--output",
                 str(tmp_path / "q.jsonl"), "--per-document", "2", "--batch-size", "4", "--device", "cpu"]
    main(arguments)
    assert json.loads(capsys.readouterr().out)["documents"] == 5
    main(arguments)  # done: nothing to add
    assert json.loads(capsys.readouterr().out)["written_now"] == 0
