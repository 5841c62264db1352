import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dynvocab.cli import main
from dynvocab.data.assets import wikipedia_leads
from dynvocab.multiword import CONFIG_NAME, MultiWordLM
from dynvocab.training.multiword import MultiWordTrainConfig, train_multiword


def test_training_moves_only_the_new_rows_and_the_loss_falls(tmp_path, tiny_lm_dir):
    data = tmp_path / "data.txt"
    data.write_text("\n\n".join(lead["text"] for lead in wikipedia_leads()[:80]))
    config = MultiWordTrainConfig(
        model=str(tiny_lm_dir), data=str(data), output_dir=str(tmp_path / "mwt"), num_ngrams=40, min_count=3,
        max_steps=30, batch_size=4, max_length=32, learning_rate=0.05, warmup_steps=1, log_every=1,
    )
    trained, log = train_multiword(config)
    losses = [r["loss"] for r in log]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1
    base = AutoModelForCausalLM.from_pretrained(tiny_lm_dir)
    start = MultiWordLM.from_causal_lm(AutoModelForCausalLM.from_pretrained(tiny_lm_dir), trained.vocab).lm.state_dict()
    V = base.get_input_embeddings().num_embeddings
    for name, tensor in trained.lm.state_dict().items():
        if tensor.shape[0] == V + 40:  # embedding matrices: old rows as before, new rows trained away from the mean
            torch.testing.assert_close(tensor[:V], base.state_dict()[name])
            assert not torch.allclose(tensor[V:], start[name][V:])
        else:
            torch.testing.assert_close(tensor, base.state_dict()[name])
    saved = json.loads((tmp_path / "mwt" / "final" / CONFIG_NAME).read_text())
    assert saved["train_log"] == log and saved["train_config"]["max_steps"] == 30 and len(saved["ngrams"]) == 40
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_dir)
    loaded = MultiWordLM.from_pretrained(tmp_path / "mwt" / "final", AutoModelForCausalLM.from_pretrained(tiny_lm_dir), tokenizer)
    for a, b in zip(MultiWordLM.embedding_matrices(loaded.lm), MultiWordLM.embedding_matrices(trained.lm)):
        torch.testing.assert_close(a, b)


def test_the_command_line_trains_and_saves(tmp_path, tiny_lm_dir):
    data = tmp_path / "data.txt"
    data.write_text("\n\n".join(lead["text"] for lead in wikipedia_leads()[:30]))
    main(["train-mwt", "--model", str(tiny_lm_dir), "--data", str(data), "--output-dir", str(tmp_path / "mwt"),
          "--num-ngrams", "10", "--min-count", "2", "--max-steps", "2", "--batch-size", "2", "--max-length", "16"])
    assert len(json.loads((tmp_path / "mwt" / "final" / CONFIG_NAME).read_text())["ngrams"]) == 10


def test_config_refuses_bad_settings():
    with pytest.raises(ValueError, match="max_ngram_tokens"):
        MultiWordTrainConfig(max_ngram_tokens=1)
    with pytest.raises(ValueError, match="num_ngrams"):
        MultiWordTrainConfig(num_ngrams=0)
