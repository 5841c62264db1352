"""The one corpus reader: training (``iter_texts``) and indexing (``load_documents``) read a source alike."""

import json

import pytest

from dynvocab.data.sources import Record, iter_records
from dynvocab.training.corpus import iter_texts
from retrieval.index.documents import load_documents


@pytest.mark.parametrize("paragraphs", [True, False])
def test_training_and_indexing_read_the_same_texts(tmp_path, paragraphs):
    texts = ["The first text\nruns on.", "A second one.", "And a third."]
    path = tmp_path / "corpus.txt"
    path.write_text(("\n\n" if paragraphs else "\n").join(t.replace("\n", " ") if not paragraphs else t for t in texts)
                    + "\n", encoding="utf-8")
    split = "paragraphs" if paragraphs else "lines"
    assert list(iter_texts(path, paragraphs=paragraphs)) == [d["text"] for d in load_documents(path, split=split)]
    assert len(list(iter_texts(path))) == 3  # blank lines are found without being told


def test_jsonl_records_keep_their_line_for_errors(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"text": "a", "id": "x"}, "plain", {"body": "b"}]) + "\n")
    records = list(iter_records(path))
    assert [r.value for r in records[:2]] == [{"text": "a", "id": "x"}, "plain"]
    assert [r.text() for r in records[:2]] == ["a", "plain"]
    with pytest.raises(ValueError, match=rf"{path}:3 has no str field text_field='text' \(keys: \['body'\]\)"):
        records[2].text()
    with pytest.raises(ValueError, match="it holds a int"):
        Record({"text": 3}, "row 0").text()
