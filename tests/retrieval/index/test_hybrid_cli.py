"""`dynvocab index --encoder <hybrid folder>`: the hybrid index with its pruning settings, saved and searchable."""

import json

from dynvocab.cli import main
from encoders.hybrid import HybridEncoder
from retrieval.index.hybrid import HybridIndex
from tests.tiny_mlm import save_tiny_mlm


def test_index_builds_a_hybrid_index_with_its_settings(tmp_path, capsys):
    encoder = HybridEncoder.from_pretrained(str(save_tiny_mlm(tmp_path / "mlm")), representation="both", dense_dim=8)
    encoder.save_pretrained(tmp_path / "hybrid")
    texts = ["the cat sat on the mat", "the dog ran", "eiffel tower is in paris", "river bank money", "water and cats"]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    main(["index", "--data", str(tmp_path / "docs.jsonl"), "--output", str(tmp_path / "index"), "--encoder",
          str(tmp_path / "hybrid"), "--representation", "both-260", "--candidates", "4", "--query-terms", "3",
          "--posting-terms", "5"])
    assert "indexed 5 documents (hybrid CLS:8/OT:260)" in capsys.readouterr().out
    index = HybridIndex.load(tmp_path / "index", encoder=HybridEncoder.from_pretrained(
        str(tmp_path / "hybrid"), representation="both-260"))
    assert (index.candidates, index.query_terms, index.sparse.posting_terms) == (4, 3, 5)
    scores, ids = index.search(["eiffel tower in paris", "a dog"], 2)
    exact_scores, exact_ids = index.exhaustive().search(["eiffel tower in paris", "a dog"], 2)
    assert (ids == exact_ids).all() and (scores == exact_scores).all()
