"""``dynvocab extract-adapter``: a fine-tuned encoder shipped as a LoRA adapter, loaded as a document encoder."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from dynvocab.cli import main
from encoders import DenseEncoder
from retrieval.loading import _cached_index, document_encoder
from retrieval.training.adapter import REPORT_FILE, extract_adapter

TEXTS = ["the cat sat on the mat", "paris is a city on a river", "a bank of money and water"]


@pytest.fixture
def tuned_dir(tmp_path, tiny_encoder_dir):
    """The tiny encoder 'fine-tuned': every weight moved a little, saved with its tokenizer."""
    torch.manual_seed(1)
    model = AutoModel.from_pretrained(tiny_encoder_dir)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(tmp_path / "tuned")
    AutoTokenizer.from_pretrained(tiny_encoder_dir).save_pretrained(tmp_path / "tuned")
    return tmp_path / "tuned"


def test_the_adapter_loads_as_the_encoder_it_was_cut_from(tuned_dir, tiny_encoder_dir, tmp_path):
    report = extract_adapter(tuned_dir, tmp_path / "adapter", base=str(tiny_encoder_dir), rank=16)
    assert report["largest_relative_error"] < 1e-3  # full rank, float16 factors
    assert json.loads((tmp_path / "adapter" / REPORT_FILE).read_text())["rank"] == 16
    assert not (tmp_path / "adapter" / "model.safetensors").exists(), "only the adapter is written"
    card = (tmp_path / "adapter" / "README.md").read_text()
    assert "rank-16" in card and str(tuned_dir) in card and "More Information Needed" not in card
    loaded = document_encoder(str(tmp_path / "adapter"))
    assert loaded.name == str(tmp_path / "adapter")
    expected = DenseEncoder(str(tuned_dir)).encode(TEXTS)
    assert np.allclose(loaded.encode(TEXTS), expected, atol=1e-3)
    assert not np.allclose(document_encoder(str(tiny_encoder_dir)).encode(TEXTS), expected, atol=1e-3)


def test_a_hybrid_exports_its_body_only_when_its_dense_part_is_the_body_s_mean(tmp_path):
    from encoders.hybrid import HybridEncoder
    from tests.tiny_mlm import save_tiny_mlm

    start = save_tiny_mlm(tmp_path / "start")
    hybrid = HybridEncoder.from_pretrained(str(start), dense_dim=16, pooling="mean")
    with torch.no_grad():
        hybrid.model.bert.encoder.layer[0].attention.self.query.weight.add_(0.1)
    hybrid.save_pretrained(tmp_path / "identity")
    extract_adapter(tmp_path / "identity", tmp_path / "adapter", base=str(start), rank=4)
    with torch.no_grad():
        hybrid.projection.weight.mul_(1.5)
    hybrid.save_pretrained(tmp_path / "projected")
    with pytest.raises(ValueError, match="from the identity") as refused:
        extract_adapter(tmp_path / "projected", tmp_path / "refused", base=str(start))
    assert "--dense_pooling mean" in str(refused.value) and not (tmp_path / "refused").exists()


def test_the_command_line_extracts_an_adapter(tuned_dir, tiny_encoder_dir, tmp_path, capsys):
    main(["extract-adapter", "--encoder", str(tuned_dir), "--base", str(tiny_encoder_dir), "--rank", "4",
          "--output", str(tmp_path / "cli")])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["rank"] == 4 and printed["base"] == str(tiny_encoder_dir)
    assert (tmp_path / "cli" / "adapter_config.json").is_file()


def test_a_cached_index_built_by_another_encoder_is_rebuilt(tuned_dir, tiny_encoder_dir, tmp_path, capsys):
    documents = [{"id": f"d{i}", "title": f"d{i}", "text": text} for i, text in enumerate(TEXTS)]
    first = _cached_index(tmp_path / "index", documents, "tiny", str(tiny_encoder_dir))
    assert first.encoder_info["name"] == str(tiny_encoder_dir)
    again = _cached_index(tmp_path / "index", documents, "tiny", str(tiny_encoder_dir))
    assert "Indexing" not in capsys.readouterr().out.split("cached in")[-1], "the same encoder reuses the cache"
    assert again.encoder_info == first.encoder_info
    rebuilt = _cached_index(tmp_path / "index", documents, "tiny", str(tuned_dir))
    assert "rebuilding it" in capsys.readouterr().out
    assert rebuilt.encoder_info["name"] == str(tuned_dir)


@pytest.mark.slow
def test_the_shipped_retriever_loads_on_real_minilm_and_moves_it_a_little():
    pytest.importorskip("dynvocab.data.assets").minilm_dir()
    texts = ["A man is eating food.", "A man is eating a meal.", "The stock market fell today."]
    shipped = document_encoder("minilm-wikipedia").encode(texts)
    minilm = document_encoder("minilm").encode(texts)
    assert shipped.shape == (3, 384)
    assert shipped[0] @ shipped[1] > shipped[0] @ shipped[2] + 0.3
    assert 0.9 < float(np.min(np.sum(shipped * minilm, axis=1))) < 0.9999, "fine-tuned, not MiniLM, not far from it"
