"""The retrieval package's bad-input catalogue: index building, search arguments, saved indexes, phrase extraction
and pipeline settings each refuse bad input with an error that names it."""

import json

import numpy as np
import pytest

from retrieval import DocumentIndex
from retrieval.config import PipelineConfig
from retrieval.index.ann import IndexConfig
from retrieval.phrases import extract_phrases
from tests.helpers import HashEncoder, word_tokenizer

DOCS = [{"id": f"d{i}", "text": f"the cat sat on a mat and the dog ran {i}"} for i in range(30)]


@pytest.fixture(scope="module")
def index():
    return DocumentIndex.build(DOCS, HashEncoder())


CASES = [
    ("build from no documents", lambda i, t: DocumentIndex.build([], HashEncoder()), ValueError, "at least one"),
    ("build from a missing file", lambda i, t: DocumentIndex.build("/no/such/docs.jsonl", HashEncoder()), ValueError,
     "does not exist"),
    ("build a document without text", lambda i, t: DocumentIndex.build([{"id": "a"}], HashEncoder()), ValueError,
     "text_field"),
    ("build a document whose text is an int", lambda i, t: DocumentIndex.build([{"id": "a", "text": 5}], HashEncoder()),
     ValueError, "item 0 has no str field text_field='text' (it holds a int)"),
    ("build duplicate ids", lambda i, t: DocumentIndex.build([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}],
                                                             HashEncoder()), ValueError, "appears twice"),
    ("build without encoder or vectors", lambda i, t: DocumentIndex.build(DOCS, None), ValueError, "pass an encoder"),
    ("build with too few vectors", lambda i, t: DocumentIndex.build(DOCS, None, vectors=np.zeros((3, 16), np.float32)),
     ValueError, "one per document"),
    ("search k = 0", lambda i, t: i.search(["cat"], k=0), ValueError, "positive int"),
    ("search k < 0", lambda i, t: i.search(["cat"], k=-1), ValueError, "positive int"),
    ("search k a string", lambda i, t: i.search(["cat"], k="5"), TypeError, "positive int"),
    ("search k a float", lambda i, t: i.search(["cat"], k=5.0), TypeError, "positive int"),
    ("search an empty query", lambda i, t: i.search(["cat", "  "], k=3), ValueError, "query 1 is empty"),
    ("search None", lambda i, t: i.search(None, k=3), ValueError, "numeric (n, d) array"),
    ("search vectors of another dimension", lambda i, t: i.search(np.zeros((1, 7), np.float32), k=3), ValueError,
     "use the same encoder"),
    ("search NaN vectors", lambda i, t: i.search(np.full((1, 16), np.nan, np.float32), k=3), ValueError, "NaN"),
    ("search ints as queries", lambda i, t: i.search([1, 2], k=3), ValueError, "dimension"),
    ("a negative search parameter", lambda i, t: i.set_search_param(-1), ValueError, "positive int"),
    ("load a missing folder", lambda i, t: DocumentIndex.load(t / "nope"), ValueError, "no saved index"),
    ("load with an encoder of another dimension", lambda i, t: DocumentIndex.load(_saved(i, t), HashEncoder(dim=8)),
     ValueError, "8-dim vectors"),
    ("load a truncated metadata file", lambda i, t: DocumentIndex.load(_damaged(i, t, "metadata.json", b"{")),
     ValueError, "truncated or corrupted"),
    ("load metadata without index_bytes", lambda i, t: DocumentIndex.load(_without(i, t, "index_bytes")), ValueError,
     "lacks ['index_bytes']"),
    ("load an index file with flipped bytes", lambda i, t: DocumentIndex.load(_damaged(i, t, "index.faiss", None)),
     ValueError, "index.faiss"),
    ("save onto a file", lambda i, t: i.save(_a_file(t)), ValueError, "it is a file"),
    ("save into a folder of the user's files", lambda i, t: i.save(_users_folder(t)), ValueError, "refusing to overwrite"),
    ("IndexConfig an unknown type", lambda i, t: IndexConfig(index_type="lsh"), ValueError, "not supported"),
    ("IndexConfig nlist a string", lambda i, t: IndexConfig(nlist="5"), TypeError, "must be int or None"),
    ("IndexConfig a recall of 2", lambda i, t: IndexConfig(target_recall=2.0), ValueError, "(0, 1]"),
    ("extract from a bare string", lambda i, t: extract_phrases("the cat sat", word_tokenizer()), TypeError,
     "wrap it in a list"),
    ("extract min > max length", lambda i, t: extract_phrases(DOCS, word_tokenizer(), min_length=5, max_length=2),
     ValueError, "min_length <= max_length"),
    ("extract an unknown unit", lambda i, t: extract_phrases(DOCS, word_tokenizer(), unit="chars"), ValueError,
     "'tokens' or 'words'"),
    ("extract documents without text", lambda i, t: extract_phrases([{"id": "x"}], word_tokenizer()), TypeError,
     "str 'text' field"),
    ("extract tokens without a tokenizer", lambda i, t: extract_phrases(DOCS, None), ValueError, "pass tokenizer="),
    ("PipelineConfig top_k 0", lambda i, t: PipelineConfig(grounded=False, top_k=0), ValueError, "top_k=0"),
    ("PipelineConfig top_p a string", lambda i, t: PipelineConfig(grounded=False, top_p="0.9"), TypeError, "must be float"),
    ("PipelineConfig an unknown edge rule", lambda i, t: PipelineConfig(grounded=False, edges="middle"), ValueError, "'content' or 'any'"),
    ("PipelineConfig temperature 0", lambda i, t: PipelineConfig(grounded=False, temperature=0.0), ValueError, "temperature"),
    ("PipelineConfig max_chars 0", lambda i, t: PipelineConfig(grounded=False, max_chars=0), ValueError, "max_chars"),
    ("PipelineConfig min > max length", lambda i, t: PipelineConfig(grounded=False, min_length=5, max_length=2), ValueError,
     "min_length <= max_length"),
    ("PipelineConfig negative max_phrases", lambda i, t: PipelineConfig(grounded=False, max_phrases=-1), ValueError, ">= 0"),
    ("PipelineConfig realtime_fraction 0", lambda i, t: PipelineConfig(grounded=False, realtime_fraction=0.0), ValueError, "(0, 1]"),
]


def _saved(index, tmp_path):
    return index.save(tmp_path / "index")


def _damaged(index, tmp_path, name, content):
    directory = _saved(index, tmp_path)
    data = (directory / name).read_bytes()
    (directory / name).write_bytes(content if content is not None else data[:-16] + b"\xff" * 16)
    return directory


def _without(index, tmp_path, key):
    directory = _saved(index, tmp_path)
    metadata = json.loads((directory / "metadata.json").read_text())
    del metadata[key]
    (directory / "metadata.json").write_text(json.dumps(metadata))
    return directory


def _a_file(tmp_path):
    (tmp_path / "a-file").write_text("x")
    return tmp_path / "a-file"


def _users_folder(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    return tmp_path / "mine"


@pytest.mark.parametrize(("call", "error", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_a_clear_error(index, tmp_path, call, error, fragment):
    with pytest.raises(error) as raised:
        call(index, tmp_path)
    assert fragment in str(raised.value)


def test_saving_over_an_index_keeps_the_users_other_files(index, tmp_path):
    directory = index.save(tmp_path / "index")
    (directory / "notes.md").write_text("why I built it")
    index.save(directory)
    assert (directory / "notes.md").read_text() == "why I built it"
    assert DocumentIndex.load(directory, HashEncoder()).search(["cat"], k=2)[1].shape == (1, 2)
    assert "notes.md" not in json.loads((directory / "dynvocab_manifest.json").read_text())["files"]


def test_numpy_and_torch_integers_are_accepted_wherever_an_int_is(index):
    import torch

    expected = index.search(["cat"], k=3)[1]
    assert (index.search(["cat"], k=np.int64(3))[1] == expected).all()
    assert (index.search(["cat"], k=torch.tensor(3))[1] == expected).all()
    index.set_search_param(np.int32(4))
