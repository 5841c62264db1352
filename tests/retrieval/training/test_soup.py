"""Model soups of fine-tuned encoders: the weighted mean of their weights, written as an encoder folder."""

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from dynvocab.cli import main
from retrieval.training.soup import soup_encoders


@pytest.fixture
def runs(tmp_path, tiny_encoder_dir):
    """Two 'fine-tuned' copies of the tiny encoder: its weights plus 1 and plus 3."""
    folders = []
    for shift in (1.0, 3.0):
        model = AutoModel.from_pretrained(tiny_encoder_dir)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(shift)
        model.save_pretrained(tmp_path / f"run{shift:g}")
        if shift == 3.0:  # the tokenizer of the soup comes from the first folder that has one
            AutoTokenizer.from_pretrained(tiny_encoder_dir).save_pretrained(tmp_path / f"run{shift:g}")
        folders.append(tmp_path / f"run{shift:g}")
    return folders


def weights(folder) -> dict[str, torch.Tensor]:
    return dict(AutoModel.from_pretrained(folder).named_parameters())


def test_the_soup_is_the_mean_and_the_base_is_mixed_in_by_its_weight(runs, tmp_path, tiny_encoder_dir):
    base = weights(tiny_encoder_dir)
    soup = weights(soup_encoders(runs, tmp_path / "soup"))
    assert all(torch.allclose(soup[name], base[name] + 2.0, atol=1e-5) for name in base)
    mixed = weights(soup_encoders(runs, tmp_path / "mixed", base=tiny_encoder_dir, base_weight=0.5))
    assert all(torch.allclose(mixed[name], base[name] + 1.0, atol=1e-5) for name in base)


def test_bad_soups_are_refused(runs, tmp_path, tiny_lm_dir):
    with pytest.raises(ValueError, match="at least one encoder"):
        soup_encoders([], tmp_path / "none")
    with pytest.raises(ValueError, match="base must be given"):
        soup_encoders(runs, tmp_path / "nobase", base_weight=0.5)
    with pytest.raises(ValueError, match="hold a tokenizer"):
        soup_encoders(runs[:1], tmp_path / "untokenized")
    with pytest.raises(ValueError, match="does not have the architecture") as refused:
        soup_encoders([runs[0], tiny_lm_dir], tmp_path / "other")
    assert str(refused.value).startswith(str(tiny_lm_dir))  # the odd one out is named
    assert not (tmp_path / "other").exists()


def test_the_command_line_writes_the_soup(runs, tmp_path, capsys):
    main(["soup-encoders", "--encoders", ",".join(map(str, runs)), "--output", str(tmp_path / "cli-soup")])
    assert '"soup"' in capsys.readouterr().out and (tmp_path / "cli-soup" / "config.json").is_file()
    assert len(AutoTokenizer.from_pretrained(tmp_path / "cli-soup")) == len(AutoTokenizer.from_pretrained(runs[1]))
