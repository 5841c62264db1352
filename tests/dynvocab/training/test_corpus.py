import json

import pytest

from dynvocab.data import sources
from dynvocab.training.corpus import iter_texts, wikipedia_split


def test_text_file_paragraphs(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("First paragraph\nstill first.\n\n\nSecond one.\n  \nThird.\n", encoding="utf-8")
    assert list(iter_texts(path)) == ["First paragraph\nstill first.", "Second one.", "Third."]
    assert list(iter_texts(str(path), paragraphs=False)) == ["First paragraph", "still first.", "Second one.", "Third."]


def test_text_file_one_per_line(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("alpha beta\ngamma\ndelta epsilon\n", encoding="utf-8")
    assert list(iter_texts(path)) == ["alpha beta", "gamma", "delta epsilon"]


def test_jsonl_file_and_errors(tmp_path):
    path = tmp_path / "data.jsonl"
    lines = [json.dumps({"text": "one", "id": 1}), "", json.dumps({"body": "two", "text": " "})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert list(iter_texts(path)) == ["one"]  # blank lines and empty texts are skipped
    path.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps({"body": "two"}) + "\n", encoding="utf-8")
    texts = iter_texts(path)
    assert next(texts) == "one"
    with pytest.raises(ValueError, match=r"data.jsonl:2 .*text_field='text'.*\['body'\]"):
        next(texts)
    path.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"data.jsonl:1 is not valid JSON"):
        list(iter_texts(path))
    path.write_text(json.dumps({"text": 3}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds a int"):
        list(iter_texts(path))


def test_missing_paths_raise_at_the_call(tmp_path):
    for missing in [tmp_path / "nope.txt", str(tmp_path / "nope.jsonl"), "./corpus/train.txt", "~/none/x/y"]:
        with pytest.raises(ValueError, match="does not exist"):
            iter_texts(missing)


def test_hub_name_offline_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ValueError, match="neither a local path nor a reachable Hub dataset"):
        iter_texts("someorg/surely-not-cached-dataset")


def test_iterables_and_type_errors():
    assert list(iter_texts(["a", "  ", "b "])) == ["a", "b"]
    assert list(iter_texts(t for t in ["x"])) == ["x"]
    with pytest.raises(TypeError, match="item 1"):
        list(iter_texts(["a", 3]))
    with pytest.raises(TypeError, match="source="):
        iter_texts(42)


def test_datasets_objects_and_folders(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"content": ["first", "second"], "n": [1, 2]})
    assert list(iter_texts(data, text_field="content")) == ["first", "second"]
    with pytest.raises(ValueError, match="text_field='text'.*content"):
        list(iter_texts(data))
    assert list(iter_texts(data.to_iterable_dataset(), text_field="content")) == ["first", "second"]

    data.save_to_disk(str(tmp_path / "saved"))
    assert list(iter_texts(tmp_path / "saved", text_field="content")) == ["first", "second"]
    datasets.DatasetDict({"validation": data}).save_to_disk(str(tmp_path / "dict"))
    assert list(iter_texts(tmp_path / "dict", text_field="content", split="validation")) == ["first", "second"]
    with pytest.raises(ValueError, match="split='train'"):
        iter_texts(tmp_path / "dict", text_field="content")

    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in ["u", "v"]) + "\n")
    stream = iter_texts(folder)
    assert list(stream) == ["u", "v"]


def test_wikipedia_split_is_deterministic_and_disjoint(monkeypatch):
    leads = [{"id": str(i), "title": str(i), "text": f"article {i}"} for i in range(200)]
    monkeypatch.setattr("dynvocab.data.assets.wikipedia_leads", lambda: leads)
    train, heldout = wikipedia_split(held_out=0.1, seed=3)
    assert len(heldout) == 20 and len(train) == 180
    assert set(train).isdisjoint(heldout) and set(train) | set(heldout) == {lead["text"] for lead in leads}
    assert wikipedia_split(held_out=0.1, seed=3) == (train, heldout)
    assert wikipedia_split(held_out=0.1, seed=4)[1] != heldout
    # texts keep the assets' order inside each part
    assert train == sorted(train, key=lambda t: int(t.split()[1]))
    with pytest.raises(ValueError, match="held_out"):
        wikipedia_split(held_out=1.0)
    assert sources.logger.name == "dynvocab.data.sources"
